"""A lower bound on the iteration time of any plan in a space: the yardstick for the search's gap.

Three facts, each true of every valid plan on R ranks (docs/model.md sections 2-4),
with per-layer least times taken over microbatch sizes 1..B:

Layer times carry the smallest stage scale any stage can get (docs/model.md (version 2.1);
fact 3 gives each range its own), so every fact stays a bound with them.

1. *Work and fill.* Every layer's forward and backward work is done once per
   sample, at best as its own cheapest split of B (``min_split``; a backward
   split into I and W counts when that is cheaper), and every action costs the
   runtime's overhead. A rank idles until sample 0 reaches its first stage;
   the ranks' first stages start at R distinct layers, the i-th earliest at
   layer >= i, behind a message. So ``R * T >= total work + sum of those
   waits``.
2. *Critical path.* Sample 0 goes forward through every layer and its
   gradient back to layer 0, crossing at least ``R - 1`` rank boundaries each
   way.
3. *One stage per rank* (only when the space allows nothing else, so every
   stage is a rank): stage ``[lo, hi)`` waits for sample 0 to reach it, does
   its least work, and then (unless backwards may be split, which lets W
   overlap) its last gradient still travels back through every earlier layer;
   minimized over partitions by an exact DP.

Under a memory limit (``rules.memory_limit``, docs/model.md section 5) every
fact takes only the microbatch sizes memory allows. A backward microbatch of
``n`` samples of a stage holding layer ``l`` peaks, on its rank, at least at
``state_factor * param_l + stash_l * n``: its stash is resident (kept since
its forward, or rebuilt by recomputation) when the backward (or I) starts. So
layer ``l``'s backward list holds no size above ``nmax_l`` (:func:`max_sizes`).
Without recomputation the forward list is the backward list; with it, the
backward reruns the forward on the backward list, so either way every sample
of layer ``l`` costs at least ``F + B`` at a size ``<= nmax_l``, and the stage
with the least ``nmax`` runs at least ``ceil(B / nmax)`` backwards, each with
its runtime overhead. Its fixed stash is resident with it (version 2.3). With one rank, that rank holds every
layer's state, each tied weight once. With ZeRO-1 the caller's tables carry the sharded state
factor (:meth:`~umsearch.search.factorize.ClusterPlacement.bound_tables`).

4. *What must be recomputed* (fact 1's work, under a limit). When the last stage starts the backward of the
   microbatch holding sample ``s``, every stage that does not recompute has forwarded its own microbatch
   holding ``s`` and not yet released it, and every rank's forwards of those came before its backwards of
   them: each rank's peak counts them all at once, beside its state. Summed over the ranks, with
   ``n_l(s)`` the size of layer ``l``'s microbatch holding ``s`` and ``K`` the layers of stages that keep
   their stash, ``sum over K of stash_l * n_l(s) <= R * limit - state_factor * whole parameters`` for
   every ``s``, so also for the mean over samples ``x_l`` of ``n_l(s)``. A kept layer's work is
   ``sum over s of u_l(n_l(s))`` with ``u_l(n)`` its time per sample at size ``n``, at least ``B`` times
   ``u_l``'s convex minorant at ``x_l`` (Jensen); a recomputed one costs a forward more per sample. The
   least total work under that one constraint is at least its Lagrangian dual at any multiplier, and the
   dual needs no minorant: a linear term's minimum over the minorant lies on one of the sizes
   (:func:`kept_or_recomputed`). Fact 1 takes the larger of this and the plain work.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from umsearch.core.cost import CostTables
from umsearch.search.genome import Rules

MAX_KNAPSACK = 2_000_000
"""Largest ``batch * sizes`` solved exactly by :func:`min_split`."""
MAX_DP_LAYERS = 128
"""Fact 3's partition DP (layers squared ranges, each a knapsack) runs up to this many layers."""


def _per_layer(tables: CostTables, kind: int, batch: int) -> np.ndarray:
    """(batch+1, L) per-layer time of one action kind at every size 0..batch, times the smallest stage
    scale any stage can get (docs/model.md (version 2.1)), so that every sum of them stays a lower bound."""
    return np.diff(tables.times[kind, : batch + 1], axis=1) * tables.least_scale


def _backward(tables: CostTables, batch: int, split: bool) -> np.ndarray:
    """Per-layer least backward cost at each size: B, or I + W where splitting is allowed and cheaper."""
    full = _per_layer(tables, 1, batch)
    if not split:
        return full
    return np.minimum(full, _per_layer(tables, 2, batch) + _per_layer(tables, 3, batch))


def min_split(per_size: np.ndarray, batch: int) -> np.ndarray:
    """Per column, the least ``sum per_size[b_i]`` over all ways to write ``batch`` as a sum of sizes
    ``b_i`` from 1 to ``len(per_size) - 1`` (an unbounded knapsack; row 0 must be 0).

    Exact while ``batch * sizes`` stays small; beyond that, ``batch`` times the least cost per
    sample, which is never more (a valid bound, cheaper by far).
    """
    top = per_size.shape[0] - 1
    if batch * top > MAX_KNAPSACK:
        sizes = np.arange(1, top + 1)[:, None]
        return batch * np.min(per_size[1:] / sizes, axis=0)
    best = np.zeros((batch + 1, per_size.shape[1]))
    for n in range(1, batch + 1):
        k = min(n, top)
        best[n] = np.min(best[n - 1 :: -1][:k] + per_size[1 : k + 1], axis=0)
    return best[batch]


def whole_param_bytes(tables: CostTables) -> float:
    """The parameter bytes of one rank holding every layer: each tied weight once (docs/model.md 5)."""
    return float(tables.param_prefix[-1]) - sum((len(t.layers) - 1) * t.bytes for t in tables.tied)


def max_sizes(tables: CostTables, limit: float, whole: bool = False) -> np.ndarray:
    """(L,) per layer, the largest backward microbatch any plan under ``limit`` bytes per device can run
    through it (``inf`` where its stash is free, below 1 where nothing fits); slightly generous, so
    rounding never makes it a size too small. ``whole``: one rank holds every layer's state, each tied
    weight once. A layer's fixed stash (``stash_fixed_bytes``) is resident with its stash."""
    param, stash = np.diff(tables.param_prefix), np.diff(tables.stash_prefix)
    if whole:
        param = np.full_like(param, whole_param_bytes(tables))
    # The simulator adds bytes in floating point: a stash far below the state's last bit may vanish.
    room = limit - tables.state_factor * param - np.diff(tables.stash_fixed_prefix) + 1e-9 * abs(limit)
    safe = np.where(stash > 0, stash, 1.0)
    with np.errstate(over="ignore", invalid="ignore"):  # tiny stashes: any size fits
        n = np.floor(room / safe * (1 + 1e-9))
    return np.where(stash > 0, n, np.where(room >= 0, np.inf, 0.0))


def _fitting(per_size: np.ndarray, nmax: np.ndarray) -> np.ndarray:
    """``per_size`` (sizes 0.. by layer) with every size above a layer's ``nmax`` made impossible."""
    sizes = np.arange(per_size.shape[0])[:, None]
    return np.where((sizes <= nmax[None, :]) | (sizes == 0), per_size, np.inf)


def kept_or_recomputed(per_size: np.ndarray, forward: np.ndarray, stash: np.ndarray, room: float,
                       batch: int) -> float:  # fmt: skip
    """Fact 4: a lower bound on the total work of ``batch`` samples through every layer when the layers that
    keep their stash hold at most ``room`` bytes per sample of mean microbatch size together.

    ``per_size[n, l]``: layer ``l``'s time of a microbatch of ``n`` samples (row 0 unused; ``inf`` where the
    size cannot run); ``forward[l]``: the least time per sample of the forward its stage reruns when it
    recomputes (``inf``: it may not); ``stash[l]``: its stash bytes per sample. With ``unit[n, l] = B *
    per_size[n, l] / n``, the value is the dual ``max over lam >= 0 of sum_l min(min_n unit[n, l] + B *
    forward_l, min_n unit[n, l] + lam * stash_l * n) - lam * room``, every multiplier giving a bound; ``inf``
    where the layers that may not recompute cannot keep one sample each (a negative ``room``: the ranks'
    state alone is over their limits)."""
    sizes = np.arange(1, per_size.shape[0], dtype=np.float64)[:, None]
    unit = batch * per_size[1:] / sizes  # (sizes, L): the work of every sample at that size
    rc = unit.min(axis=0) + batch * forward
    held = np.where(stash > 0, stash, 0.0)[None, :] * sizes  # a layer saving nothing costs no room

    def dual(lam: float) -> float:
        kept = np.min(unit + lam * held, axis=0)
        return float(np.sum(np.minimum(kept, rc)) - lam * room)

    if room < float(np.sum(stash[~np.isfinite(rc)])):  # the layers that must keep their stash cannot, even one sample
        return math.inf
    finite, positive = unit[np.isfinite(unit)], stash[stash > 0]
    if not finite.size or not positive.size:
        return dual(0.0)
    # Past ``top`` a kept sample costs more than all the work there is, so the dual only falls; it is concave
    # in lam, so unimodal in log(lam), which spans the scales of bytes and milliseconds evenly.
    top = min(1e200, 2.0 * float(finite.max()) * per_size.shape[1] / float(positive.min()))
    t = _golden_max(lambda x: dual(math.exp(x)), math.log(top) - 70.0, math.log(top))
    return max(dual(0.0), dual(math.exp(t)))


def _golden_max(f: Callable[[float], float], lo: float, hi: float, steps: int = 90) -> float:
    """An argument in ``[lo, hi]`` near the maximum of the unimodal ``f`` (golden-section search)."""
    g = (math.sqrt(5) - 1) / 2
    a, b = hi - g * (hi - lo), lo + g * (hi - lo)
    fa, fb = f(a), f(b)
    for _ in range(steps):
        if fa < fb:
            lo, a, fa = a, b, fb
            b = lo + g * (hi - lo)
            fb = f(b)
        else:
            hi, b, fb = b, a, fa
            a = hi - g * (hi - lo)
            fa = f(a)
    return a if fa >= fb else b


def lower_bound(tables: CostTables, rules: Rules) -> float:
    """No plan of the space under ``rules.memory_limit`` can finish an iteration faster than this (ms);
    ``inf`` where no plan fits."""
    B, R = rules.batch, rules.ranks
    top = min(B, tables.b_max)  # microbatches are never larger than the largest allowed size
    nmax = max_sizes(tables, rules.memory_limit, whole=R == 1)
    if nmax.min() < 1:
        return float("inf")
    fwd, bwd = _per_layer(tables, 0, top), _backward(tables, top, rules.split)
    grad = np.minimum(_per_layer(tables, 2, top), _per_layer(tables, 1, top)) if rules.split else _per_layer(tables, 1, top)
    least_f, least_g = fwd[1:].min(axis=0), grad[1:].min(axis=0)
    lat, op, msg = tables.latency_ms, tables.op_overhead_ms, tables.message_overhead_ms
    head = np.concatenate([[0.0], np.cumsum(least_f)])  # head[i]: sample 0 through layers < i
    both = _fitting(fwd + bwd, nmax)
    # Each rank runs a forward and a backward at least; the stage with the least nmax, ceil(B / nmax) backwards.
    actions = 2 * R + max(0, -(-B // int(min(nmax.min(), B))) - 1)
    work = float(min_split(both, B).sum())
    if math.isfinite(rules.memory_limit):
        work = max(work, _memory_work(tables, rules, fwd, both, top))
    work += actions * op + 4 * (R - 1) * msg
    fill = float(sum(head[i] + lat for i in range(1, R)))
    bounds = [(work + fill) / R]
    bounds.append(float(least_f.sum() + least_g.sum()) + 2 * R * op + 2 * (R - 1) * (lat + 2 * msg))
    if rules.stages_per_rank == (1,) and rules.num_layers <= MAX_DP_LAYERS:
        bounds.append(_one_stage_per_rank(tables, rules, fwd + bwd, nmax, head, np.concatenate([[0.0], np.cumsum(least_g)])))
    return max(bounds)


def _memory_work(tables: CostTables, rules: Rules, fwd: np.ndarray, both: np.ndarray, top: int) -> float:
    """Fact 4 for the space: the state of every layer resident over the ranks, a little room given for
    rounding (as :func:`max_sizes` does)."""
    R = rules.ranks
    limit = rules.memory_limit
    room = R * limit - tables.state_factor * whole_param_bytes(tables) + 1e-9 * R * abs(limit)
    stash = np.diff(tables.stash_prefix)
    if rules.recompute:
        forward = np.min(fwd[1:] / np.arange(1, top + 1, dtype=np.float64)[:, None], axis=0)
    else:
        forward = np.full(stash.shape, np.inf)
    return kept_or_recomputed(both, forward, stash, room, rules.batch)


def _one_stage_per_rank(tables: CostTables, rules: Rules, per_size: np.ndarray, nmax: np.ndarray, head: np.ndarray,
                        tail: np.ndarray) -> float:  # fmt: skip
    """Fact 3: min over partitions of the largest ``head + work + tail`` over stages (exact DP), each
    stage's sizes no larger than its layers' least ``nmax``."""
    B, R, L = rules.batch, rules.ranks, rules.num_layers
    prefix = np.hstack([np.zeros((per_size.shape[0], 1)), np.cumsum(per_size, axis=1)])  # (B+1, L+1)
    lo, hi = np.triu_indices(L + 1, k=1)
    work = np.full((L + 1, L + 1), np.inf)
    # per_size carries the least scale; each range takes its own exact scale instead.
    range_max = np.array([np.minimum.accumulate(nmax[a:])[b - a - 1] for a, b in zip(lo, hi, strict=True)])
    sizes = np.arange(per_size.shape[0])[:, None]
    ranged = np.where(sizes <= range_max[None, :], prefix[:, hi] - prefix[:, lo], np.inf)
    work[lo, hi] = min_split(ranged, B) * tables.stage_scale(lo, hi) / tables.least_scale
    lat, op, msg = tables.latency_ms, tables.op_overhead_ms, tables.message_overhead_ms
    best = np.full((R + 1, L + 1), np.inf)
    best[0, 0] = 0.0
    for s in range(R):
        for a in range(s, L):
            if not np.isfinite(best[s, a]):
                continue
            waits = (head[a] + lat) if a else 0.0
            back = 0.0 if rules.split or a == 0 else tail[a] + lat
            stage = waits + work[a, a + 1 :] + 2 * op + back + (2 * msg if R > 1 else 0.0)
            np.minimum(best[s + 1, a + 1 :], np.maximum(best[s, a], stage), out=best[s + 1, a + 1 :])
    return float(best[R, L])
