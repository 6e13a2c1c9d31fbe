"""The order of measurements: rounds that each visit every cell once, shuffled.

Timing one size (or one layer) to completion before the next puts a burst of
background load on a few cells and makes them look slow, or superlinear. A
round visits every (target, size) cell once instead, in a fresh seeded random
order, and the value of a cell is its median over the rounds: load that comes
and goes hits every cell alike, and no cell always follows the same
neighbour (whose cache state it would inherit).

Calibration cells (stage-sized ranges, which cost as much as many layers) take
part in only some rounds, spread evenly over the run.

A round does not need a burst per cell: one burst through a window of
consecutive layers times every layer in it, so :func:`cover_windows` picks the
few windows that hold a member of every layer group still running.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import NamedTuple


class Cell(NamedTuple):
    """One measurement of a round: a target (group of layers or layer range) at one size."""

    target: int
    """Index of the target."""
    size: int
    """Microbatch size."""


def calibration_rounds(rounds: int, wanted: int) -> list[int]:
    """``min(wanted, rounds)`` round indices spread evenly over ``0..rounds-1`` (the first included)."""
    n = min(wanted, rounds)
    if n <= 0:
        return []
    return sorted({math.floor(k * rounds / n) for k in range(n)})


def schedule(
    cells: Sequence[Cell], rounds: int, *, seed: int, extra: Sequence[Cell] = (), extra_rounds: Sequence[int] = ()
) -> list[list[Cell]]:
    """``rounds`` rounds, each every cell of ``cells`` once in a seeded random order (the fixed schedule of
    the profiler before adaptive stopping; ``benchmarks.profile_cost`` still runs that profiler).

    Rounds listed in ``extra_rounds`` also hold every cell of ``extra``, shuffled in with the
    others. The same arguments always give the same schedule.
    """
    rng = random.Random(seed)
    marked = set(extra_rounds)
    out = []
    for r in range(rounds):
        cells_r = [*cells, *(extra if r in marked else ())]
        rng.shuffle(cells_r)
        out.append(cells_r)
    return out


def windows_holding(layer: int, num_layers: int, width: int) -> list[tuple[int, int]]:
    """Every ``[lo, hi)`` of ``width`` consecutive layers (at most all) that holds ``layer``."""
    w = max(1, min(width, num_layers))
    return [(s, s + w) for s in range(max(0, layer - w + 1), min(layer, num_layers - w) + 1)]


def cover_windows(groups: Sequence[Sequence[int]], num_layers: int, width: int, *,
                  rotation: int = 0) -> list[tuple[int, int]]:  # fmt: skip
    """Windows of ``width`` consecutive layers that together hold at least one member of every group.

    One burst through a window times every layer in it (:func:`umsearch.measure.burst.burst_window`),
    so a round needs only a few windows: greedily, the window holding members of the most groups not
    yet held, ties broken by the first in the order of window starts rotated by ``rotation`` (the round
    index, so that a pooled group is timed at different members and positions over the rounds). A
    model of distinct layers is tiled (about ``num_layers / width`` windows); a pooled group needs no
    window of its own when its neighbours' windows hold one of its members. Sorted by start.
    """
    w = max(1, min(width, num_layers))
    starts = list(range(num_layers - w + 1))
    k = rotation % len(starts)
    candidates = [(s, s + w) for s in starts[k:] + starts[:k]]
    members = [set(g) for g in groups]
    left = set(range(len(groups)))
    chosen: list[tuple[int, int]] = []

    def held(c: tuple[int, int]) -> set[int]:
        return {g for g in left if any(c[0] <= i < c[1] for i in members[g])}

    while left:
        best = max(candidates, key=lambda c: len(held(c)))
        got = held(best)
        if not got:
            raise ValueError(f"groups {sorted(left)} have no layer in 0..{num_layers - 1}")
        chosen.append(best)
        left -= got
    return sorted(chosen)
