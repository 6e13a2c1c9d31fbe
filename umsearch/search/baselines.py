"""What users pick today, scored under the same model: the plans umsearch must beat.

- ``gpipe`` / ``1f1b``: equal microbatches, best count, best contiguous
  partition for it. Partitions are enumerated exhaustively while there are at
  most ``EXHAUSTIVE_LIMIT`` of them; beyond that the partition is the exact
  bottleneck-minimizing DP (min over cuts of the slowest stage's
  ``M * (F(b) + G(b))``, PipeDream-planner style), re-scored by simulation.
- ``greedy``: each stage alone picks the size with its best per-sample time.
- ``exhaustive``: the exact optimum over cuts x per-stage equal splits x
  warmups (tiny instances only, for tests).
Also the lower bound: for the best partition, the slowest stage's least total
compute over all ways to split B (unbounded knapsack, exact).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from umsearch.batch_eval import evaluate, pack_plans
from umsearch.cost_model import CostModel
from umsearch.plan import Plan, StagePlan, equal_split, uniform_plan
from umsearch.search.space import SearchSpace

EXHAUSTIVE_LIMIT = 20_000


@dataclass(frozen=True, kw_only=True)
class Scored:
    """A plan with its simulated cost."""

    name: str
    plan: Plan
    iteration_ms: float
    peak_memory_bytes: tuple[float, ...]
    method: str = ""

    @property
    def max_memory(self) -> float:
        return max(self.peak_memory_bytes)


def score(plans: list[Plan], cost: CostModel) -> list[tuple[float, tuple[float, ...]]]:
    res = evaluate(pack_plans(plans), cost)
    return [(float(t), tuple(float(m) for m in mem)) for t, mem in zip(res.iteration_ms, res.peak_memory_bytes, strict=True)]


def _better(best: Scored | None, t: float, mem: tuple[float, ...], limit: float) -> bool:
    """Whether a plan of time ``t`` and memory ``mem`` is feasible and beats ``best``."""
    return math.isfinite(t) and max(mem) <= limit and (best is None or t < best.iteration_ms)


def _all_cuts(L: int, S: int) -> list[list[int]]:
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


def _range_costs(cost: CostModel, b: int, m: int) -> np.ndarray:
    cost.ensure(b)
    f, g = cost.fwd_prefix[b], cost.bwd_prefix[b]
    per = f + g
    return m * (per[None, :] - per[:, None])  # [lo, hi]


def _candidate_cuts(cost: CostModel, space: SearchSpace, b: int, m: int) -> tuple[list[list[int]], str]:
    L, S = cost.num_layers, space.stages
    if math.comb(L - 1, S - 1) <= EXHAUSTIVE_LIMIT:
        return _all_cuts(L, S), "exhaustive over cuts"
    return [bottleneck_cuts(cost, S, _range_costs(cost, b, m))], "bottleneck DP over cuts"


def equal_baseline(cost: CostModel, space: SearchSpace, schedule: str) -> Scored | None:
    """Best equal-microbatch plan of one schedule family that fits the memory limit."""
    best: Scored | None = None
    B = space.global_batch
    counts = sorted({-(-B // b) for b in space.microbatch_sizes if -(-B // b) <= space.max_microbatches})
    for m in counts:
        split = equal_split(B, m)
        cuts_list, method = _candidate_cuts(cost, space, split[0], m)
        plans = [uniform_plan(c, B, m, schedule) for c in cuts_list]
        for plan, (t, mem) in zip(plans, score(plans, cost), strict=True):
            if _better(best, t, mem, space.memory_limit):
                best = Scored(name=f"{schedule} equal", plan=plan, iteration_ms=t, peak_memory_bytes=mem,
                              method=f"{method}, M={m}")  # fmt: skip
    return best


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
    best: Scored | None = None
    for sched in ("gpipe", "1f1b"):
        stages = tuple(StagePlan(layers=(cuts[s], cuts[s + 1]), forward=seqs[s], backward=seqs[s],
                                 warmup=len(seqs[s]) if sched == "gpipe" else S - s) for s in range(S))  # fmt: skip
        plan = Plan(global_batch=B, stages=stages)
        (t, mem), = score([plan], cost)
        if _better(best, t, mem, space.memory_limit):
            best = Scored(name="local greedy", plan=plan, iteration_ms=t, peak_memory_bytes=mem, method=f"{sched} warmups")
    return best


def exhaustive_optimum(cost: CostModel, space: SearchSpace) -> Scored | None:
    """Exact optimum over cuts, each stage's equal split count and warmup (no recompute). Tiny only."""
    B, S, L = space.global_batch, space.stages, cost.num_layers
    counts = sorted({-(-B // b) for b in space.microbatch_sizes if -(-B // b) <= space.max_microbatches})
    plans = []
    for cuts in _all_cuts(L, S):
        for ms in itertools.product(counts, repeat=S):
            splits = [equal_split(B, m) for m in ms]
            for warms in itertools.product(*[range(1, m + 1) for m in ms]):
                plans.append(Plan(global_batch=B, stages=tuple(
                    StagePlan(layers=(cuts[s], cuts[s + 1]), forward=splits[s], backward=splits[s], warmup=warms[s])
                    for s in range(S))))  # fmt: skip
    best: Scored | None = None
    for plan, (t, mem) in zip(plans, score(plans, cost), strict=True):
        if _better(best, t, mem, space.memory_limit):
            best = Scored(name="exhaustive", plan=plan, iteration_ms=t, peak_memory_bytes=mem, method=f"{len(plans)} plans")
    return best


def min_compute_table(cost: CostModel, batch: int) -> np.ndarray:
    """``[lo, hi]``: least ``sum F(b) + G(b)`` over every split of ``batch`` (any sizes: a valid bound)."""
    L = cost.num_layers
    cost.ensure(batch)
    per_b = cost.fwd_prefix[: batch + 1] + cost.bwd_prefix[: batch + 1]  # (B+1, L+1)
    lo, hi = np.triu_indices(L + 1, k=1)
    per = (per_b[:, hi] - per_b[:, lo]).T  # (R, B+1), per[:, 0] == 0
    best = np.zeros((per.shape[0], batch + 1))
    for n in range(1, batch + 1):
        best[:, n] = np.min(best[:, n - 1 :: -1][:, :n] + per[:, 1 : n + 1], axis=1)
    table = np.full((L + 1, L + 1), np.inf)
    table[lo, hi] = best[:, batch]
    return table


def lower_bound(cost: CostModel, space: SearchSpace) -> float:
    """No plan on S stages can beat this: min over partitions of the slowest stage's least compute."""
    table = min_compute_table(cost, space.global_batch)
    cuts = bottleneck_cuts(cost, space.stages, table)
    return float(max(table[cuts[s], cuts[s + 1]] for s in range(space.stages)))
