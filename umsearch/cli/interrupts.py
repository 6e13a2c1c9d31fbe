"""SIGTERM and SIGHUP stop a long command the way Ctrl-C does: it keeps and writes what it has.

Batch systems (Slurm, systemd, ``timeout``) stop a job with SIGTERM. Left to
its default, SIGTERM kills Python at once and a search or a tune loses every
plan it found and every round it measured. While :class:`StopSignals` is
active, SIGTERM and SIGHUP raise :class:`~umsearch.core.errors.Interrupted`
(a ``KeyboardInterrupt``), which the search and the tune loop already answer
by stopping and returning what they have; the command writes it and exits
with :attr:`StopSignals.exit_code` (128 + the signal, as a shell reports it).
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any

from umsearch.core.errors import Interrupted


class StopSignals:
    """While active, SIGTERM and SIGHUP raise :class:`Interrupted`; :attr:`received` is the first to come."""

    CAUGHT = (signal.SIGTERM, signal.SIGHUP)

    def __init__(self) -> None:
        self.received: int | None = None
        self._old: dict[int, Any] = {}

    def _raise(self, signum: int, frame: FrameType | None) -> None:
        if self.received is None:
            self.received = signum
        raise Interrupted(signum)

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():  # handlers can only be set there
            for s in self.CAUGHT:
                self._old[s] = signal.signal(s, self._raise)
        return self

    def __exit__(self, *exc: object) -> None:
        for s, old in self._old.items():
            signal.signal(s, old)

    def signum(self, interrupted: bool) -> int | None:
        """The signal that stopped the work: the one received, else SIGINT when it was interrupted, else None."""
        if self.received is not None:
            return self.received
        return int(signal.SIGINT) if interrupted else None

    def exit_code(self, interrupted: bool) -> int:
        """128 + :meth:`signum` (SIGTERM 143, SIGHUP 129, Ctrl-C 130); 0 when nothing stopped the work."""
        sig = self.signum(interrupted)
        return 0 if sig is None else 128 + sig
