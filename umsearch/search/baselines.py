"""What users run today, scored under the same model: the plans umsearch must beat.

Every peer schedule of docs/model.md 6.2 (torch.distributed.pipelining's orders,
equal microbatches split as torch splits a batch) on every stage count the
space allows it, at its best microbatch count and its best partition of the
layers into ``R * v`` stages; plus a local greedy plan (every stage at its own
most efficient size). A plan that fits no memory limit is no baseline.

The partition: where every (stage count, microbatch count, partition) of a
schedule adds up to at most :data:`EXACT_LIMIT` plans, all are scored: the
exact best under the simulator. Otherwise every count is scored on the
balanced cuts (:func:`~umsearch.search.partition.balanced_cuts`) and the
:data:`REFINED_COUNTS` fastest per stage count get their partition searched:
over every partition where there are at most :data:`EXHAUSTIVE_LIMIT`, else by
descent from the balanced cuts (a local optimum). Each baseline's ``method``
says which, so no heuristic result passes for an exact one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from umsearch.core.cost import CostTables
from umsearch.core.plan import equal_split
from umsearch.core.schedules import PEER_SCHEDULES, PeerSchedule, warmup_rule
from umsearch.search.genome import Rules
from umsearch.search.partition import Cuts, all_cuts, count_cuts, descend, stage_cuts
from umsearch.search.scoring import Scored, Scorer
from umsearch.search.space import SearchSpace
from umsearch.sim.batch import ArrayPlan

Stop = Callable[[], bool]
"""Asked between steps: True once the baselines' share of the time budget is spent."""

EXACT_LIMIT = 40_000
"""Most plans (shapes times partitions) one schedule's exact search scores."""
EXHAUSTIVE_LIMIT = 5_000
"""Most partitions scored one by one for one schedule, stage count and microbatch count."""
REFINED_COUNTS = 3
"""Microbatch counts per schedule and stage count whose partition is searched beyond the balanced cuts."""


@dataclass(frozen=True, kw_only=True)
class Shape:
    """One peer schedule at one stage count and microbatch count, with its fixed action lists."""

    peer: PeerSchedule
    """The schedule."""
    v: int
    """Stages per rank."""
    microbatches: int
    """Equal microbatches per stage."""
    template: ArrayPlan
    """The plan on placeholder cuts (only the cuts change between partitions)."""

    def on(self, cuts: Cuts) -> ArrayPlan:
        t = self.template
        return ArrayPlan(batch=t.batch, ranks=t.ranks, cuts=np.asarray(cuts, dtype=np.int64), rank=t.rank,
                         recompute=t.recompute, fwd=t.fwd, fwd_len=t.fwd_len, bwd=t.bwd, bwd_len=t.bwd_len,
                         act=t.act, act_len=t.act_len, replicas=t.replicas, cluster=t.cluster, layout=t.layout,
                         zero1=t.zero1)  # fmt: skip


GREEDY = "local greedy"
"""The name of the local greedy baseline (not a torch schedule: never the bar to clear)."""

def _template(peer: PeerSchedule, rules: Rules, v: int, m: int) -> ArrayPlan:
    R, S = rules.ranks, rules.ranks * v
    split = np.tile(np.asarray(equal_split(rules.batch, m), dtype=np.int64), S)
    acts = peer.generate(R, v, m)
    codes = np.array([a.code for r in acts for a in r], dtype=np.int64)
    return ArrayPlan(batch=rules.batch, ranks=R, cuts=np.arange(S + 1, dtype=np.int64),
                     rank=np.asarray(peer.stage_ranks(R, v), dtype=np.int64), recompute=np.zeros(S, dtype=np.bool_),
                     fwd=split, fwd_len=np.full(S, m, dtype=np.int64), bwd=split, bwd_len=np.full(S, m, dtype=np.int64),
                     act=codes, act_len=np.array([len(r) for r in acts], dtype=np.int64))  # fmt: skip


def counts(rules: Rules) -> list[int]:
    """Microbatch counts that divide the batch (docs/model.md 6.2: equal microbatches) into a size inside the
    space's sizes and count limit.

    Only divisors: torch's ``PipelineStage`` sizes its buffers from the first microbatch, so a batch split
    into sizes that differ by one fails in its loss (measured: B=16 as 6+5+5 on Interleaved1F1B), and
    torchtitan refuses a microbatch size that does not divide the batch.
    """
    lo, hi = rules.sizes[0], rules.largest
    return [m for m in range(1, min(rules.batch, rules.max_count) + 1)
            if rules.batch % m == 0 and lo <= rules.batch // m <= hi]  # fmt: skip


def shapes(peer: PeerSchedule, rules: Rules, stamp: Callable[[ArrayPlan], ArrayPlan] | None = None) -> list[Shape]:
    """Every (stage count, microbatch count) the space allows and torch accepts for ``peer``;
    ``stamp`` (:meth:`~umsearch.search.scoring.Scorer.stamp`) makes each template the plan scored."""
    out = []
    for v in rules.stages_per_rank:
        for m in counts(rules):
            if peer.accepts(rules.ranks, v, m) is None:
                t = _template(peer, rules, v, m)
                out.append(Shape(peer=peer, v=v, microbatches=m, template=stamp(t) if stamp else t))
    return out


def _partition(shape: Shape, rules: Rules, score: Scorer, tables: CostTables,
               stop: Stop) -> tuple[Cuts, float, str]:  # fmt: skip
    S, L = rules.ranks * shape.v, rules.num_layers
    times = lambda cs: score.plans([shape.on(c) for c in cs])[0]  # noqa: E731
    n = count_cuts(L, S)
    if n <= EXHAUSTIVE_LIMIT:
        cands = all_cuts(L, S)
        t = times(cands)
        i = int(np.argmin(t))
        return cands[i], float(t[i]), f"best of all {n} partitions"
    b = -(-rules.batch // shape.microbatches)
    start = [stage_cuts(tables, b, S)]
    cuts, t_best = descend(start, times, stop=stop)
    if stop():
        return cuts, t_best, f"cut descent from the balanced partition, cut short by the time budget ({n} partitions)"
    return cuts, t_best, f"cut descent from the balanced partition (local optimum; {n} partitions)"


def _never() -> bool:
    return False


def peer_baseline(peer: PeerSchedule, rules: Rules, score: Scorer, tables: CostTables,
                  stop: Stop = _never) -> Scored | None:  # fmt: skip
    """``peer``'s fastest plan that fits: best stage count, microbatch count and partition.

    Once ``stop()`` is true, partitions are no longer refined (the method says so).
    """
    cands = shapes(peer, rules, score.stamp)
    if not cands:
        return None
    total = sum(count_cuts(rules.num_layers, rules.ranks * s.v) for s in cands)
    if total <= EXACT_LIMIT:
        return _exact(peer, cands, rules, score, total)
    first = [s.on(stage_cuts(tables, -(-rules.batch // s.microbatches), rules.ranks * s.v))
             for s in cands]  # fmt: skip
    t0 = score.plans(first)[0]
    best: tuple[float, Shape, Cuts, str] | None = None
    order = np.argsort(t0, kind="stable")
    by_v: dict[int, int] = {}
    for i in order:
        s = cands[int(i)]
        if not np.isfinite(t0[i]) and best is not None:
            break
        if by_v.get(s.v, 0) >= REFINED_COUNTS:
            continue
        by_v[s.v] = by_v.get(s.v, 0) + 1
        if stop() and best is not None:
            break
        cuts, t, how = _partition(s, rules, score, tables, stop)
        if np.isfinite(t) and (best is None or t < best[0]):
            best = (t, s, cuts, how)
    if best is None:
        return None
    _, s, cuts, how = best
    method = (f"{peer.torch_class}, {s.v} stage(s)/rank, M={s.microbatches}, {how}, for the "
              f"{REFINED_COUNTS} fastest counts per stage count on balanced cuts")  # fmt: skip
    return score.scored_plan(s.on(cuts), peer.name, method)


def _exact(peer: PeerSchedule, cands: list[Shape], rules: Rules, score: Scorer, total: int) -> Scored | None:
    best: tuple[float, Shape, Cuts] | None = None
    for s in cands:
        cuts = all_cuts(rules.num_layers, rules.ranks * s.v)
        t = score.plans([s.on(c) for c in cuts])[0]
        i = int(np.argmin(t))
        if np.isfinite(t[i]) and (best is None or t[i] < best[0]):
            best = (float(t[i]), s, cuts[i])
    if best is None:
        return None
    _, s, cut = best
    method = (f"{peer.torch_class}, {s.v} stage(s)/rank, M={s.microbatches}, best of all {total} "
              "(stage count, microbatch count, partition) choices")  # fmt: skip
    return score.scored_plan(s.on(cut), peer.name, method)


def greedy_baseline(rules: Rules, score: Scorer, tables: CostTables, cuts: Sequence[int]) -> Scored | None:
    """One stage per rank, each at its own best per-sample size, 1F1B order (the warmup rule)."""
    R = rules.ranks
    if len(cuts) != R + 1:
        return None
    lists = []
    for j in range(R):
        lo, hi = cuts[j], cuts[j + 1]
        ok = [b for b in rules.sizes if -(-rules.batch // b) <= rules.max_count]
        per = [(tables.times[0, b, hi] - tables.times[0, b, lo] + tables.times[1, b, hi] - tables.times[1, b, lo]) / b
               for b in ok]  # fmt: skip
        b = ok[int(np.argmin(per))]
        q, r = divmod(rules.batch, b)
        lists.append([b] * q + ([r] if r else []))
    acts = [warmup_rule(j, lists[j], lists[j], R - j) for j in range(R)]
    flat = np.array([v for f in lists for v in f], dtype=np.int64)
    lens = np.array([len(f) for f in lists], dtype=np.int64)
    ap = ArrayPlan(batch=rules.batch, ranks=R, cuts=np.asarray(cuts, dtype=np.int64), rank=np.arange(R, dtype=np.int64),
                   recompute=np.zeros(R, dtype=np.bool_), fwd=flat, fwd_len=lens, bwd=flat, bwd_len=lens,
                   act=np.array([a.code for r in acts for a in r], dtype=np.int64),
                   act_len=np.array([len(a) for a in acts], dtype=np.int64))  # fmt: skip
    s = score.scored_plan(ap, GREEDY, "each stage at its best per-sample size, 1F1B order")
    return s if np.isfinite(s.iteration_ms) and s.max_memory <= score.memory_limit else None


def baselines(space: SearchSpace, rules: Rules, score: Scorer, tables: CostTables, *, stop: Stop = _never,
              tick: Callable[[int, int], None] | None = None) -> dict[str, Scored | None]:  # fmt: skip
    """Every requested peer schedule's best plan, and the local greedy plan; None where none fits
    (or the profile lacks the I/W split a zero-bubble schedule needs). ``tick(done, total)`` after
    each peer; past ``stop()``, partitions are left unrefined (large models, short budgets)."""
    out: dict[str, Scored | None] = {}
    for i, name in enumerate(space.schedule.peers):
        peer = PEER_SCHEDULES[name]
        out[name] = (None if peer.split_backward and not rules.split
                     else peer_baseline(peer, rules, score, tables, stop))  # fmt: skip
        if tick is not None:
            tick(i + 1, len(space.schedule.peers) + 1)
    v1 = [s for s in out.values() if s is not None and s.plan.num_stages == rules.ranks]
    cuts = ((0, *[st.lo for st in v1[0].plan.stages[1:]], rules.num_layers) if v1
            else stage_cuts(tables, rules.largest, rules.ranks))  # fmt: skip
    out[GREEDY] = greedy_baseline(rules, score, tables, cuts)
    if tick is not None:
        tick(len(space.schedule.peers) + 1, len(space.schedule.peers) + 1)
    return out
