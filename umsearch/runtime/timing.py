"""Timestamps relative to the start of an iteration, on CPU or on a CUDA stream, and per-layer records.

On CPU a stamp is ``time.perf_counter()`` taken when an action (or a layer)
starts or ends. On CUDA work is asynchronous, so a stamp is an event recorded
on the current stream (after the stream has been told to wait for the
action's messages); the times are read after one synchronize at the end of
the iteration.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from umsearch.core.actions import Kind


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


@dataclass(frozen=True, kw_only=True)
class LayerRecord:
    """One layer's part of an action, timed when the executor runs with ``layer_timing``."""

    rank: int
    """The rank that ran it."""
    stage: int
    """The stage holding the layer."""
    layer: int
    """Global layer index."""
    kind: Kind
    """``F`` forward, ``B`` full backward, ``I`` input-gradient part, ``W`` weight-gradient part."""
    mb: int
    """Microbatch index in the stage's forward (``F`` not recomputing) or backward list."""
    size: int
    """Samples in the microbatch."""
    recompute: bool
    """An ``F`` that rebuilds the graph inside a ``B`` or ``I`` of a recomputing stage."""
    start_ms: float
    """Start time since the iteration began."""
    end_ms: float
    """End time."""


@dataclass(frozen=True)
class LayerStamp:
    """A layer's part of an action while the iteration runs: stamp indices, not yet times."""

    stage: int
    layer: int
    kind: Kind
    mb: int
    size: int
    recompute: bool
    start: int
    end: int

    def record(self, rank: int, times: list[float]) -> LayerRecord:
        return LayerRecord(rank=rank, stage=self.stage, layer=self.layer, kind=self.kind, mb=self.mb,
                           size=self.size, recompute=self.recompute, start_ms=times[self.start],
                           end_ms=times[self.end])  # fmt: skip
