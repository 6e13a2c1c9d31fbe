"""SIGTERM and SIGHUP stop a long command the way Ctrl-C does: it keeps and writes what it has.

Batch systems (Slurm, systemd, ``timeout``) stop a job with SIGTERM. Left to
its default, SIGTERM kills Python at once and a search or a tune loses every
plan it found and every round it measured. While :class:`StopSignals` is
active, SIGTERM and SIGHUP raise :class:`~umsearch.errors.Interrupted`
(a ``KeyboardInterrupt``), which the search and the tune loop already answer
by stopping and returning what they have; the command writes it and exits
with :attr:`StopSignals.exit_code` (128 + the signal, as a shell reports it).
"""

from __future__ import annotations

import signal
from types import FrameType

from umsearch.errors import Interrupted
from umsearch.storage.signals import SignalScope


class StopSignals(SignalScope):
    """While active, SIGTERM and SIGHUP raise :class:`Interrupted`; :attr:`received` is the first to come."""

    CAUGHT = (signal.SIGTERM, signal.SIGHUP)

    def handle(self, signum: int, frame: FrameType | None) -> None:
        raise Interrupted(signum)

    def __enter__(self) -> StopSignals:
        super().__enter__()
        return self

    def signum(self, interrupted: bool) -> int | None:
        """The signal that stopped the work: the one received, else SIGINT when it was interrupted, else None."""
        if self.received is not None:
            return self.received
        return int(signal.SIGINT) if interrupted else None

    def exit_code(self, interrupted: bool) -> int:
        """128 + :meth:`signum` (SIGTERM 143, SIGHUP 129, Ctrl-C 130); 0 when nothing stopped the work."""
        sig = self.signum(interrupted)
        return 0 if sig is None else 128 + sig


def exit_code(exc: BaseException) -> int:
    """128 + the signal that stopped the command: ``exc``'s (or its cause's) own, else SIGINT's."""
    seen: BaseException | None = exc
    for _ in range(16):  # a chain of causes is short; never follow a cycle
        if seen is None:
            break
        signum = getattr(seen, "signum", None)
        if isinstance(signum, int):
            return 128 + signum
        seen = seen.__cause__ or seen.__context__
    return 128 + int(signal.SIGINT)
