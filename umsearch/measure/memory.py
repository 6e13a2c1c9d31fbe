"""Memory-bounded profiling: how many graphs a burst keeps, and which sizes fit, decided before allocating.

A burst (:mod:`umsearch.measure.burst`) of one layer group at size ``b`` with
``k`` graphs in flight keeps ``k * b * (stash + out)`` bytes (every forward's
saved tensors and output until its backward), needs ``b * (out + in)`` more
while a backward runs (the output gradient, the input gradient), and the
group's parameter gradients. That is at most what one pipeline stage holding
the group would keep, never the whole model's activations. :func:`plan_memory`
picks, per group, the most graphs in flight (up to the profiler's usual eight)
for which the largest requested size fits the free memory, and where even the
fewest do not, the largest size that fits. It is a pure function of byte counts,
so it is tested without a GPU; :func:`available_bytes` says what is free.

The chain pass, which runs every size through the whole model once and keeps
every layer's input for the timing, needs ``b * sum(in)`` bytes per size on top
of one layer's graph: :func:`chain_bytes`. A size whose estimate exceeds the free
memory is never allocated.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import torch

HEADROOM = 0.85
"""Share of the free memory the plan may fill: allocator rounding, cuBLAS/cuDNN workspaces, fragmentation."""


@dataclass(frozen=True, kw_only=True)
class Need:
    """What a burst of one target (a layer group, or a stage-sized range) keeps, per sample and in all."""

    name: str
    """The target's name (for messages)."""
    kept_per_sample: float
    """Bytes per sample each graph in flight keeps: saved tensors plus the output."""
    transient_per_sample: float
    """Bytes per sample a backward needs besides: the output's gradient and the input's."""
    fixed: float
    """Bytes independent of the size: the parameters' gradients."""

    def bytes(self, size: int, in_flight: int) -> float:
        """Peak bytes of a burst at ``size`` with ``in_flight`` graphs."""
        return in_flight * size * self.kept_per_sample + size * self.transient_per_sample + self.fixed


@dataclass(frozen=True, kw_only=True)
class MemoryPlan:
    """Per target: graphs in flight and the largest requested size that fits."""

    in_flight: tuple[int, ...]
    """Graphs a burst keeps, per target."""
    largest: tuple[int | None, ...]
    """Largest requested size that fits, per target; None when not even the smallest does."""
    budget_bytes: float
    """The bytes the plan may fill (free memory times :data:`HEADROOM`)."""

    def common_sizes(self, sizes: Sequence[int], targets: Sequence[int] | None = None) -> tuple[int, ...]:
        """The requested sizes every target of ``targets`` (default: all) fits."""
        picked = range(len(self.largest)) if targets is None else targets
        limits = [self.largest[t] for t in picked]
        if any(x is None for x in limits):
            return ()
        top = min((x for x in limits if x is not None), default=max(sizes))
        return tuple(b for b in sizes if b <= top)


def plan_memory(needs: Sequence[Need], free_bytes: float, sizes: Sequence[int], *, max_in_flight: int = 8,
                min_in_flight: int = 2, headroom: float = HEADROOM) -> MemoryPlan:  # fmt: skip
    """Graphs in flight and largest size per target so that no burst needs more than the free memory.

    Per target: the most graphs in flight in ``[min_in_flight, max_in_flight]`` with which the largest
    of ``sizes`` fits ``headroom * free_bytes``; when none does, ``min_in_flight`` graphs and the largest
    size that fits with them (None if not even the smallest does).
    """
    if not 1 <= min_in_flight <= max_in_flight:
        raise ValueError(f"need 1 <= min_in_flight <= max_in_flight, got {min_in_flight}, {max_in_flight}")
    budget = max(0.0, free_bytes) * headroom
    ordered = sorted(sizes)
    flights, largest = [], []
    for need in needs:
        k = next((k for k in range(max_in_flight, min_in_flight - 1, -1) if need.bytes(ordered[-1], k) <= budget),
                 min_in_flight)  # fmt: skip
        fits = [b for b in ordered if need.bytes(b, k) <= budget]
        flights.append(k)
        largest.append(fits[-1] if fits else None)
    return MemoryPlan(in_flight=tuple(flights), largest=tuple(largest), budget_bytes=budget)


def chain_bytes(size: int, inputs_per_sample: float, widest: Sequence[tuple[int, float]]) -> float:
    """Bytes the chain pass allocates to run ``size``: every layer's input at that size (kept for the
    timing), plus the widest layer's graph, extrapolated from ``widest``, its ``(size, bytes)`` at the
    sizes already run (a line through the last two; through the origin from one). Used to refuse a
    size before allocating it."""
    (b1, y1), *rest = widest[-2:]
    if rest:
        (b2, y2) = rest[0]
        slope = max(0.0, (y2 - y1) / (b2 - b1))
        graph = max(y2 + slope * (size - b2), 0.0)
    else:
        graph = y1 * size / b1
    return size * inputs_per_sample + graph


def _cpu_available() -> float:
    """MemAvailable of /proc/meminfo, else physical memory (bytes)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return float("inf")


def available_bytes(device: torch.device, *, cap_bytes: float | None = None, resident_bytes: float = 0.0) -> float:
    """Bytes a measurement may still allocate on ``device``.

    CUDA: the device's free memory plus what this process's allocator has cached but not used, and,
    with a cap, at most the cap minus what is allocated. CPU: the system's available memory, and
    with a cap, at most the cap minus ``resident_bytes`` (what the caller already holds: weights and
    kept inputs; the process's own size is not a measure of torch tensors).
    """
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        allocated = torch.cuda.memory_allocated(device)
        cached = torch.cuda.memory_reserved(device) - allocated
        have = float(free + cached)
        return have if cap_bytes is None else min(have, cap_bytes - allocated)
    have = _cpu_available()
    return have if cap_bytes is None else min(have, cap_bytes - resident_bytes)


def gigabytes(n: float) -> str:
    """``12.3 GB`` (1 GB = 1e9 bytes)."""
    return f"{n / 1e9:.1f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"
