"""Timestamps of ops relative to the start of an iteration, on CPU or on a CUDA stream.

On CPU a stamp is ``time.perf_counter()`` taken when the op starts or ends. On
CUDA work is asynchronous, so a stamp is an event recorded on the current
stream (after the stream has been told to wait for the op's messages); the
times are read after one synchronize at the end of the iteration.
"""

from __future__ import annotations

import time

import torch


class StampClock:
    """Collects stamps during one iteration and turns them into milliseconds since :meth:`reset`."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._origin_s = 0.0
        self._origin_event: torch.cuda.Event | None = None
        self._cpu: list[float] = []
        self._events: list[torch.cuda.Event] = []

    def reset(self) -> None:
        """Start a new iteration: time 0 is now."""
        self._cpu.clear()
        self._events.clear()
        if self.cuda:
            self._origin_event = torch.cuda.Event(enable_timing=True)
            self._origin_event.record()
        self._origin_s = time.perf_counter()

    def stamp(self) -> int:
        """Record the current time; returns the stamp's index."""
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self._events.append(event)
            return len(self._events) - 1
        self._cpu.append(time.perf_counter())
        return len(self._cpu) - 1

    def elapsed_ms(self) -> list[float]:
        """Every stamp, in ms since :meth:`reset` (synchronizes the device on CUDA)."""
        if self.cuda:
            torch.cuda.synchronize()
            assert self._origin_event is not None
            return [self._origin_event.elapsed_time(e) for e in self._events]
        return [(t - self._origin_s) * 1e3 for t in self._cpu]

    def wall_ms(self) -> float:
        """Host time since :meth:`reset`."""
        return (time.perf_counter() - self._origin_s) * 1e3
