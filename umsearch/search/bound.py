"""A lower bound on the iteration time of any plan on S stages: the yardstick for the search's gap.

Stage ``s`` covering layers ``[lo, hi)`` cannot start before sample 0 has
gone forward through every layer before ``lo`` (each earlier stage ran at
least one forward, each boundary cost at least the link latency); it is
busy for at least the least total compute of its layers over every way of
splitting B; and after its last backward the gradient of sample B-1 still has
to go back through every layer before ``lo``. So

    T >= head(lo) + work(lo, hi) + tail(lo),  for every stage,

with ``head`` / ``tail`` the sums of each earlier layer's least forward /
backward time over microbatch sizes plus ``s`` latencies, and ``work`` the
unbounded-knapsack minimum of ``F(b) + G(b)`` over splits of B. The bound is
the minimum over partitions of the largest such term (an exact DP).
"""

from __future__ import annotations

import numpy as np

from umsearch.core.cost import CostModel
from umsearch.search.space import SearchSpace


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


def _least_layer_times(prefix: np.ndarray, batch: int) -> np.ndarray:
    """Per layer, its least time over microbatch sizes 1..batch (times may be non-monotone)."""
    per_layer = np.diff(prefix[1 : batch + 1], axis=1)  # (batch, L)
    return per_layer.min(axis=0)


def lower_bound(cost: CostModel, space: SearchSpace) -> float:
    """No plan on ``space.stages`` stages can finish an iteration faster than this (ms)."""
    B, S, L = space.global_batch, space.stages, cost.num_layers
    work = min_compute_table(cost, B)
    edge = np.concatenate([[0.0], np.cumsum(_least_layer_times(cost.fwd_prefix, B)
                                             + _least_layer_times(cost.bwd_prefix, B))])  # fmt: skip
    # best[s, hi]: least possible max over stages 0..s-1 of their bounds, first s stages ending at hi.
    best = np.full((S + 1, L + 1), np.inf)
    best[0, 0] = 0.0
    for s in range(S):
        for lo in range(s, L):
            if not np.isfinite(best[s, lo]):
                continue
            stage = edge[lo] + 2 * s * cost.latency_ms + work[lo, lo + 1 :]
            np.minimum(best[s + 1, lo + 1 :], np.maximum(best[s, lo], stage), out=best[s + 1, lo + 1 :])
    return float(best[S, L])
