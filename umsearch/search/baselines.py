"""What users run today, scored under the same model: the plans umsearch must beat.

Every peer schedule of docs/model.md 6.2 (torch.distributed.pipelining's orders,
equal microbatches split as torch splits a batch) on every stage count torch
builds it with for the model (:func:`stage_counts`: any ``v`` with
``R * v <= L``, the space's own counts first), without or, where a shape does
not fit, with full activation checkpointing (every stage recomputes, as
torchtitan's ``activation_checkpoint.mode = "full"``), at its best microbatch
count and its best partition of the layers into ``R * v`` stages; on a
cluster, with ZeRO-1 wherever the factorization allows it (the scorer's
placement stamps it). Plus a local greedy plan (every stage at its own most
efficient size). A plan that does not fit the memory limit is no baseline.

The partition: where every (stage count, microbatch count, partition) of a
schedule adds up to at most :data:`EXACT_LIMIT` plans, all are scored: the
exact best under the simulator. Otherwise every count is scored on the
balanced cuts (:func:`~umsearch.search.partition.balanced_cuts`) and the
:data:`REFINED_COUNTS` fastest per stage count get their partition searched:
over every partition where there are at most :data:`EXHAUSTIVE_LIMIT`, else by
descent from the balanced cuts (a local optimum); stage counts outside the
space share :data:`REFINED_COUNTS` refinements between them, so the cost grows
with the screen (one plan per shape), not with the descents. Each baseline's
``method`` says which, so no heuristic result passes for an exact one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from umsearch.core.cost import CostTables
from umsearch.core.plan import equal_split
from umsearch.core.schedules import PEER_SCHEDULES, PeerSchedule, warmup_rule
from umsearch.search.genome import Rules
from umsearch.search.partition import Cuts, all_cuts, count_cuts, descend, stage_cuts
from umsearch.search.scoring import Scored, Scorer
from umsearch.search.space import SearchSpace
from umsearch.sim.population import ArrayPlan

Stop = Callable[[], bool]
"""Asked between steps: True once the baselines' share of the time budget is spent."""

EXACT_LIMIT = 40_000
"""Most plans (shapes times partitions) one schedule's exact search scores."""
EXHAUSTIVE_LIMIT = 5_000
"""Most partitions scored one by one for one schedule, stage count and microbatch count."""
ALL_STAGE_COUNTS = 16
"""Stage counts per rank screened one by one; above, a geometric spread (see :func:`spread_counts`)."""
STAGE_COUNT_STEP = 1.5
"""Ratio between neighbouring stage counts of the spread."""
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
    recompute: bool = False
    """Full activation checkpointing: every stage recomputes (torchtitan's ``activation_checkpoint.mode = "full"``)."""
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

def _template(peer: PeerSchedule, rules: Rules, v: int, m: int, recompute: bool = False) -> ArrayPlan:
    R, S = rules.ranks, rules.ranks * v
    split = np.tile(np.asarray(equal_split(rules.batch, m), dtype=np.int64), S)
    acts = peer.generate(R, v, m)
    codes = np.array([a.code for r in acts for a in r], dtype=np.int64)
    return ArrayPlan(batch=rules.batch, ranks=R, cuts=np.arange(S + 1, dtype=np.int64),
                     rank=np.asarray(peer.stage_ranks(R, v), dtype=np.int64), recompute=np.full(S, recompute, dtype=np.bool_),
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


def stage_counts(peer: PeerSchedule, rules: Rules) -> list[int]:
    """Every stage count per rank ``v`` with ``R * v <= L`` that torch builds ``peer`` with (for some
    microbatch count): the space's own counts first, then the others ascending. A user of a looped
    schedule picks any of them, so the bar to clear does too, whatever the space lets the search use."""
    top = rules.num_layers // rules.ranks
    own = [v for v in rules.stages_per_rank if v <= top]
    every = own + [v for v in spread_counts(top) if v not in own] if rules.all_peer_counts else own
    return [v for v in every if any(peer.accepts(rules.ranks, v, m) is None for m in counts(rules) or [1])]


def spread_counts(top: int) -> list[int]:
    """Stage counts per rank 1..``top``: all of them up to :data:`ALL_STAGE_COUNTS`, above it a
    geometric spread (each about :data:`STAGE_COUNT_STEP` times the last) that ends at ``top`` (one
    layer per stage where the layers divide evenly): a screen's cost grows with the sum of the counts."""
    out = list(range(1, min(top, ALL_STAGE_COUNTS) + 1))
    while out[-1] < top:
        out.append(min(top, max(out[-1] + 1, int(out[-1] * STAGE_COUNT_STEP))))
    return out


def shapes(peer: PeerSchedule, rules: Rules, stamp: Callable[[ArrayPlan], ArrayPlan] | None = None, *,
           stages: Sequence[int] | None = None, recompute: bool = False) -> list[Shape]:  # fmt: skip
    """Every (stage count, microbatch count) torch accepts for ``peer``, over ``stages`` (default
    :func:`stage_counts`), without or with full activation checkpointing; ``stamp``
    (:meth:`~umsearch.search.scoring.Scorer.stamp`) makes each template the plan scored."""
    out = []
    for v in stage_counts(peer, rules) if stages is None else stages:
        for m in counts(rules):
            if peer.accepts(rules.ranks, v, m) is None:
                t = _template(peer, rules, v, m, recompute)
                out.append(Shape(peer=peer, v=v, microbatches=m, recompute=recompute,
                                 template=stamp(t) if stamp else t))  # fmt: skip
    return out


def _checkpointed(shape: Shape, stamp: Callable[[ArrayPlan], ArrayPlan]) -> Shape:
    """``shape`` with full activation checkpointing (only the stages' recompute flags change)."""
    t = shape.template
    return replace(shape, recompute=True, template=stamp(replace(t, recompute=np.ones_like(t.recompute))))


def _label(s: Shape) -> str:
    ac = ", full activation checkpointing" if s.recompute else ""
    return f"{s.peer.torch_class}, {s.v} stage(s)/rank, M={s.microbatches}{ac}"


def _never() -> bool:
    return False


def best_partition(shape: Shape, rules: Rules, score: Scorer, tables: CostTables,
                   stop: Stop = _never) -> tuple[Cuts, float, str]:  # fmt: skip
    """``shape``'s fastest partition as ``score`` times it, that time and how it was found: every partition
    where there are at most :data:`EXHAUSTIVE_LIMIT`, else a cut descent from the balanced cuts."""
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


def _screen(peer: PeerSchedule, rules: Rules, score: Scorer, tables: CostTables,
            stop: Stop) -> tuple[list[Shape], np.ndarray]:  # fmt: skip
    """Every shape scored on its balanced cuts, one stage count at a time (the space's own first;
    past ``stop()`` no further stage count starts); a shape that does not fit is scored again with full
    activation checkpointing, which only lowers memory."""
    cands: list[Shape] = []
    times: list[float] = []
    own = set(rules.stages_per_rank)
    for v in stage_counts(peer, rules):
        if v not in own and stop():
            break
        group = shapes(peer, rules, score.stamp, stages=[v])
        if not group:
            continue
        t = score.plans([_balanced(s, rules, tables) for s in group])[0]
        cands += group
        times += [float(x) for x in t]
        heavy = [_checkpointed(s, score.stamp) for s, x in zip(group, t, strict=True) if not np.isfinite(x)]
        if heavy:
            cands += heavy
            times += [float(x) for x in score.plans([_balanced(s, rules, tables) for s in heavy])[0]]
    return cands, np.asarray(times, dtype=np.float64)


def _balanced(s: Shape, rules: Rules, tables: CostTables) -> ArrayPlan:
    return s.on(stage_cuts(tables, -(-rules.batch // s.microbatches), rules.ranks * s.v))


def peer_baseline(peer: PeerSchedule, rules: Rules, score: Scorer, tables: CostTables,
                  stop: Stop = _never) -> Scored | None:  # fmt: skip
    """``peer``'s fastest plan that fits: best stage count (:func:`stage_counts`), microbatch count,
    full activation checkpointing or none, and partition.

    Once ``stop()`` is true, no further stage count is screened and partitions are no longer refined
    (the method says so).
    """
    total = sum(count_cuts(rules.num_layers, rules.ranks * v) for v in stage_counts(peer, rules)
                for m in counts(rules) if peer.accepts(rules.ranks, v, m) is None)  # fmt: skip
    if total <= EXACT_LIMIT:
        return _exact(peer, rules, score)
    cands, t0 = _screen(peer, rules, score, tables, stop)
    if not cands:
        return None
    best: tuple[float, Shape, Cuts, str] | None = None
    order = np.argsort(t0, kind="stable")
    refined: dict[tuple[int, bool], int] = {}
    own = set(rules.stages_per_rank)
    for i in order:
        s = cands[int(i)]
        if not np.isfinite(t0[i]) and best is not None:
            break
        # The space's stage counts get REFINED_COUNTS each; all other stage counts together as many.
        key = (s.v if s.v in own else -1, s.recompute)
        if refined.get(key, 0) >= REFINED_COUNTS:
            continue
        refined[key] = refined.get(key, 0) + 1
        if stop() and best is not None:
            break
        cuts, t, how = best_partition(s, rules, score, tables, stop)
        if np.isfinite(t) and (best is None or t < best[0]):
            best = (t, s, cuts, how)
    if best is None:
        return None
    _, s, cuts, how = best
    method = (f"{_label(s)}, {how}, for the {REFINED_COUNTS} fastest counts per stage count on balanced cuts "
              f"(stage counts per rank screened: {sorted({c.v for c in cands})})")  # fmt: skip
    return score.scored_plan(s.on(cuts), peer.name, method)


def _exact(peer: PeerSchedule, rules: Rules, score: Scorer) -> Scored | None:
    """Every shape at every partition; full activation checkpointing where a shape fits at no partition."""
    best: tuple[float, Shape, Cuts] | None = None
    n = 0
    for plain in shapes(peer, rules, score.stamp):
        cuts = all_cuts(rules.num_layers, rules.ranks * plain.v)
        for s in (plain, _checkpointed(plain, score.stamp)):
            t = score.plans([s.on(c) for c in cuts])[0]
            n += len(cuts)
            i = int(np.argmin(t))
            if np.isfinite(t[i]):
                if best is None or t[i] < best[0]:
                    best = (float(t[i]), s, cuts[i])
                break
    if best is None:
        return None
    _, s, cut = best
    method = f"{_label(s)}, best of all {n} (stage count, microbatch count, checkpointing, partition) choices"
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
