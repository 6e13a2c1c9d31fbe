"""The order of measurements: rounds that each visit every cell once, shuffled.

Timing one size (or one layer) to completion before the next puts a burst of
background load on a few cells and makes them look slow, or superlinear. A
round visits every (target, size) cell once instead, in a fresh seeded random
order, and the value of a cell is its median over the rounds: load that comes
and goes hits every cell alike, and no cell always follows the same
neighbour (whose cache state it would inherit).

Calibration cells (stage-sized ranges, which cost as much as many layers) take
part in only some rounds, spread evenly over the run.
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
    """``rounds`` rounds, each every cell of ``cells`` once in a seeded random order.

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
