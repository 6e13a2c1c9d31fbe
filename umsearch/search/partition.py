"""Cutting L layers into S contiguous stages: enumeration, balance, and descent on the simulated time.

- :func:`all_cuts` enumerates every partition (used while there are at most a
  few thousand of them: the exact answer under the simulator).
- :func:`balanced_cuts` is the exact bottleneck DP: the cuts minimizing the
  largest per-stage work ``m * (F(b) + G(b))`` (PipeDream-planner style), a
  good start, not the answer (the simulated time is not a sum over stages).
- :func:`stage_cuts` is that DP on the scaled stage times of docs/model.md (version 2.1)
  (what the searches call).
- :func:`descend` moves one cut at a time to the neighbouring layer while the
  simulated time improves: a local optimum, and the searches that use it say so.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence

import numpy as np

from umsearch.core.cost import CostTables

Cuts = tuple[int, ...]


def count_cuts(num_layers: int, stages: int) -> int:
    """How many ways there are to cut ``num_layers`` layers into ``stages`` non-empty stages."""
    return math.comb(num_layers - 1, stages - 1)


def all_cuts(num_layers: int, stages: int) -> list[Cuts]:
    """Every partition, as boundaries ``(0, c1, ..., L)``."""
    return [(0, *c, num_layers) for c in itertools.combinations(range(1, num_layers), stages - 1)]


def stage_work(tables: CostTables, b: int) -> np.ndarray:
    """Prefix sums ``W[i]`` of ``F(b) + G(b)`` (full backward) over layers ``[0, i)``: the work of
    stage ``[lo, hi)`` on one microbatch is ``W[hi] - W[lo]``."""
    return np.asarray(tables.times[0, b] + tables.times[1, b], dtype=np.float64)


def balanced_cuts(work: np.ndarray, stages: int) -> Cuts:
    """The cuts minimizing the largest stage work ``work[hi] - work[lo]`` over ``stages`` contiguous
    stages (exact DP; ``work`` are non-decreasing prefix sums, see :func:`stage_work`).

    ``best[s][hi]``, the least bottleneck of layers ``[0, hi)`` in ``s`` stages, is non-decreasing in
    ``hi`` and the last stage's work falls as its start ``lo`` rises, so the best ``lo`` sits where
    ``best[s-1][lo] + work[lo]`` first reaches ``work[hi]``: one sorted search per ``hi``, all ``hi`` at
    once, ``O(stages x L log L)`` (a model of thousands of layers takes milliseconds).
    """
    L = work.shape[0] - 1
    prev = np.full(L + 1, np.inf)
    prev[0] = 0.0
    arg = np.zeros((stages + 1, L + 1), dtype=np.int64)
    for s in range(1, stages + 1):
        his = np.arange(s, L - (stages - s) + 1)
        g = prev[s - 1 :] + work[s - 1 :]  # non-decreasing (inf where s-1 stages cannot end)
        lo = np.clip(s - 1 + np.searchsorted(g, work[his], side="left"), s - 1, his - 1)
        below = np.maximum(lo - 1, s - 1)
        v_lo = np.maximum(prev[lo], work[his] - work[lo])
        v_below = np.maximum(prev[below], work[his] - work[below])
        take_below = v_below <= v_lo
        cur = np.full(L + 1, np.inf)
        cur[his] = np.where(take_below, v_below, v_lo)
        arg[s, his] = np.where(take_below, below, lo)
        prev = cur
    cuts = [L]
    for s in range(stages, 0, -1):
        cuts.append(int(arg[s, cuts[-1]]))
    return tuple(cuts[::-1])


MAX_SCALED_DP_LAYERS = 512
"""Up to this many layers :func:`stage_cuts` solves the bottleneck with each stage's scale exactly
(``O(stages x L^2)``); beyond, it cuts on the unscaled work (a start for descent, as always)."""


def stage_cuts(tables: CostTables, b: int, stages: int) -> Cuts:
    """The cuts minimizing the largest stage work at microbatch size ``b``, each stage's work taken
    times its scale (:meth:`umsearch.core.cost.CostTables.stage_scale`, docs/model.md (version 2.1))."""
    work = stage_work(tables, b)
    rt = tables.runtime
    L = work.shape[0] - 1
    if not (rt.stage_scale or rt.ranges) or L > MAX_SCALED_DP_LAYERS:
        return balanced_cuts(work, stages)
    lo, hi = np.triu_indices(L + 1, k=1)
    cost = np.full((L + 1, L + 1), np.inf)
    cost[lo, hi] = (work[hi] - work[lo]) * tables.stage_scale(lo, hi)
    prev = np.full(L + 1, np.inf)
    prev[0] = 0.0
    arg = np.zeros((stages + 1, L + 1), dtype=np.int64)
    for s in range(1, stages + 1):
        both = np.maximum(prev[:, None], cost)  # [lo, hi]: the bottleneck if the last stage is [lo, hi)
        arg[s] = np.argmin(both, axis=0)
        prev = both[arg[s], np.arange(L + 1)]
    cuts = [L]
    for s in range(stages, 0, -1):
        cuts.append(int(arg[s, cuts[-1]]))
    return tuple(cuts[::-1])


def neighbours(cuts: Cuts) -> list[Cuts]:
    """Every partition one cut away by one layer (the cuts stay strictly increasing)."""
    out = []
    for i in range(1, len(cuts) - 1):
        for step in (-1, 1):
            c = cuts[i] + step
            if cuts[i - 1] < c < cuts[i + 1]:
                out.append((*cuts[:i], c, *cuts[i + 1 :]))
    return out


def descend(start: Sequence[Cuts], score: Callable[[list[Cuts]], np.ndarray],
            max_rounds: int = 200, stop: Callable[[], bool] | None = None) -> tuple[Cuts, float]:  # fmt: skip
    """From the best of ``start``, move to the best neighbour while it is faster; ``score`` maps
    partitions to simulated times (inf: infeasible). Returns the local optimum and its time, or
    where it was when ``stop()`` turned true (checked once per move)."""
    times = score(list(start))
    i = int(np.argmin(times))
    cur, cur_t = tuple(start[i]), float(times[i])
    for _ in range(max_rounds):
        if stop is not None and stop():
            break
        cand = neighbours(cur)
        if not cand:
            break
        t = score(cand)
        j = int(np.argmin(t))
        if not t[j] < cur_t * (1 - 1e-12):
            break
        cur, cur_t = cand[j], float(t[j])
    return cur, cur_t
