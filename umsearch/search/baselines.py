"""What users pick today, scored under the same model: the plans umsearch must beat.

- ``gpipe`` / ``1f1b``: equal microbatches, best count, best contiguous
  partition for it. Partitions are enumerated exhaustively while there are at
  most ``EXHAUSTIVE_LIMIT`` of them; beyond that the partition is the exact
  bottleneck-minimizing DP (min over cuts of the slowest stage's
  ``M * (F(b) + G(b))``, PipeDream-planner style), re-scored by simulation.
- ``greedy``: each stage alone picks the size with its best per-sample time.

The exact optimum of tiny instances is :mod:`umsearch.search.exhaustive`; the
lower bound, :mod:`umsearch.search.bound`.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from umsearch.core.cost import CostModel
from umsearch.core.plan import Plan, StagePlan, equal_split, uniform_plan
from umsearch.search.scoring import Scored, Scorer
from umsearch.search.space import SearchSpace

EXHAUSTIVE_LIMIT = 20_000


def all_cuts(L: int, S: int) -> list[list[int]]:
    return [[0, *c, L] for c in itertools.combinations(range(1, L), S - 1)]


def bottleneck_cuts(cost: CostModel, S: int, stage_cost: np.ndarray) -> list[int]:
    """Exact DP: cuts minimizing the largest ``stage_cost[lo, hi]`` over S contiguous stages."""
    L = cost.num_layers
    best = np.full((S + 1, L + 1), np.inf)
    arg = np.zeros((S + 1, L + 1), dtype=int)
    best[0, 0] = 0.0
    for s in range(1, S + 1):
        for hi in range(s, L + 1):
            for lo in range(s - 1, hi):
                v = max(best[s - 1, lo], stage_cost[lo, hi])
                if v < best[s, hi]:
                    best[s, hi], arg[s, hi] = v, lo
    cuts = [L]
    for s in range(S, 0, -1):
        cuts.append(int(arg[s, cuts[-1]]))
    return cuts[::-1]


def range_costs(cost: CostModel, b: int, m: float) -> np.ndarray:
    """``[lo, hi]``: ``m * (F(b) + G(b))`` of the layer range, the work of m microbatches of b."""
    cost.ensure(b)
    per = cost.fwd_prefix[b] + cost.bwd_prefix[b]
    return m * (per[None, :] - per[:, None])


def _candidate_cuts(cost: CostModel, space: SearchSpace, b: int, m: int) -> tuple[list[list[int]], str]:
    L, S = cost.num_layers, space.stages
    if math.comb(L - 1, S - 1) <= EXHAUSTIVE_LIMIT:
        return all_cuts(L, S), "exhaustive over cuts"
    return [bottleneck_cuts(cost, S, range_costs(cost, b, m))], "bottleneck DP over cuts"


def equal_plans(cost: CostModel, space: SearchSpace, schedule: str) -> list[Scored]:
    """For each microbatch count M, the best equal-microbatch plan of one family that fits the limit."""
    B = space.global_batch
    counts = sorted({-(-B // b) for b in space.microbatch_sizes if -(-B // b) <= space.max_microbatches})
    out: list[Scored] = []
    for m in counts:
        split = equal_split(B, m)
        cuts_list, method = _candidate_cuts(cost, space, split[0], m)
        plans = [uniform_plan(c, B, m, schedule) for c in cuts_list]
        best = Scorer(cost).fastest(plans, space.memory_limit, f"{schedule} equal", f"{method}, M={m}")
        if best is not None:
            out.append(best)
    return out


def equal_baseline(cost: CostModel, space: SearchSpace, schedule: str) -> Scored | None:
    """Best equal-microbatch plan of one schedule family that fits the memory limit."""
    return min(equal_plans(cost, space, schedule), key=lambda s: s.iteration_ms, default=None)


def greedy_baseline(cost: CostModel, space: SearchSpace, cuts: list[int]) -> Scored | None:
    """Each stage takes its own best per-sample size; GPipe and 1F1B warmups, best kept."""
    B, S = space.global_batch, space.stages
    seqs = []
    for s in range(S):
        lo, hi = cuts[s], cuts[s + 1]
        sizes = [b for b in space.microbatch_sizes if -(-B // b) <= space.max_microbatches]
        b = min(sizes, key=lambda v: (cost.stage_fwd_ms(lo, hi, v) + cost.stage_bwd_ms(lo, hi, v, False)) / v)
        q, r = divmod(B, b)
        seqs.append(tuple([b] * q + ([r] if r else [])))
    families = ("gpipe", "1f1b")
    plans = [Plan(global_batch=B, stages=tuple(
        StagePlan(layers=(cuts[s], cuts[s + 1]), forward=seqs[s], backward=seqs[s],
                  warmup=len(seqs[s]) if sched == "gpipe" else S - s) for s in range(S))) for sched in families]  # fmt: skip
    return Scorer(cost).fastest(plans, space.memory_limit, "local greedy", [f"{f} warmups" for f in families])
