"""A scope in which some signals go to a handler of the scope's own, and come back to theirs after.

Handlers can only be set in the main thread; elsewhere the scope leaves the
signals alone (they keep their handlers), so a library call from a worker
thread behaves as before.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any


class SignalScope:
    """While active, the signals of :attr:`CAUGHT` go to :meth:`handle`; :attr:`received` is the first."""

    CAUGHT: tuple[signal.Signals, ...] = ()

    def __init__(self) -> None:
        self.received: int | None = None
        self._old: dict[int, Any] = {}

    def handle(self, signum: int, frame: FrameType | None) -> None:
        """Called for each caught signal (the first is already in :attr:`received`)."""

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.received is None:
            self.received = signum
        self.handle(signum, frame)

    def __enter__(self) -> SignalScope:
        if threading.current_thread() is threading.main_thread():
            for s in self.CAUGHT:
                self._old[s] = signal.signal(s, self._on_signal)
        return self

    def __exit__(self, *exc: object) -> None:
        for s, old in self._old.items():
            signal.signal(s, old)
        self._old.clear()


class DeferredSignals(SignalScope):
    """While active, SIGINT, SIGTERM and SIGHUP are held back; on leaving, the first one received raises
    :class:`~umsearch.errors.Interrupted`, so the command exits as the signal asks (128 + it).

    For work that must not stop halfway, such as moving a run's outputs into place: a signal then
    stops the command right after the work, never in its middle."""

    CAUGHT = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __enter__(self) -> DeferredSignals:
        super().__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        if self.received is not None and exc[0] is None:
            from umsearch.errors import Interrupted

            raise Interrupted(self.received)
