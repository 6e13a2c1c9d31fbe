"""The reference simulator: one plan, event by event, written straight from docs/model.md sections 4 and 5.

It favours being obviously right over being fast; :mod:`umsearch.sim.population`
is the compiled twin the search uses, and tests hold the two equal on every
plan, deadlocks included.

Events are action ends and message arrivals. Whenever one happens, every idle
rank whose next action has all its inputs delivered starts it at that time.
Which messages an action waits for and which it makes are its rank's lowered
program's (:mod:`umsearch.core.program`, read through
:func:`umsearch.core.deps.messages`), as the runtime runs them.
An output goes to a stage on the same rank at the action's end, else as one
message on the directed link between the two ranks, after the link's previous
message. When no event is left while actions remain, the plan deadlocks.

With data-parallel replicas (docs/model.md section 9) each replica is timed on its
own, its messages on the links its devices have; then every stage's copies
all-reduce once its last ``B`` or ``W`` has ended in all of them.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from umsearch.core.actions import KINDS, Action, ActionRecord, F, hands_on
from umsearch.core.cluster import (
    allreduce_ms,
    bucket_cap_bytes,
    bucket_firsts,
    bucket_ready_ms,
    chain_allreduces,
    copies_span_nodes,
    ms_per_byte,
    replica_nodes,
)
from umsearch.core.cost import CostModel, device_state_factor
from umsearch.core.deps import Dependencies, Message, find_deadlock, messages
from umsearch.core.plan import Plan
from umsearch.core.plan_rules import validate_plan
from umsearch.core.profile import Link
from umsearch.core.program import lower
from umsearch.errors import PlanError
from umsearch.sim.result import AllReduceSpan, SimResult

_QUANTITY = {"F": "fwd", "B": "bwd", "I": "bwd_input", "W": "bwd_weight"}


class ActionTiming:
    """Sizes, durations and destinations of a plan's actions under one cost model."""

    def __init__(self, plan: Plan, cost: CostModel, deps: Dependencies) -> None:
        self.plan, self.cost, self.deps = plan, cost, deps

    def size(self, a: Action) -> int:
        st = self.plan.stages[a.stage]
        return a.size(st.forward, st.backward)

    def consumer(self, a: Action) -> int | None:
        """The stage that receives ``a``'s output (:meth:`Action.consumer`)."""
        return a.consumer(self.plan.num_stages)

    def cross_rank(self, a: Action, other: int) -> bool:
        return self.plan.stages[a.stage].rank != self.plan.stages[other].rank

    def base_ms(self, a: Action) -> float:
        """The layers' own time of ``a`` (recomputation included) times the stage's scale, without the
        runtime's overheads (docs/model.md 4 and 2.1)."""
        st, c, n = self.plan.stages[a.stage], self.cost, self.size(a)
        t = c.time_ms(_QUANTITY[a.kind], st.lo, st.hi, n)
        if a.reruns_forward(st.recompute):
            t += c.time_ms(_QUANTITY[KINDS[F]], st.lo, st.hi, n)
        return t * c.stage_scale(st.lo, st.hi)

    def boundary(self, a: Action) -> int:
        """The layer whose output ``a``'s message carries (:meth:`Action.sent_boundary`)."""
        st = self.plan.stages[a.stage]
        return a.sent_boundary(st.lo, st.hi)

    def messages(self, a: Action) -> list[tuple[int, int]]:
        """The cross-rank messages charged to ``a``, as ``(boundary layer, samples)``: the one it sends,
        and one per producer on another rank."""
        to = self.consumer(a)
        sent = [(self.boundary(a), self.size(a))] if to is not None and self.cross_rank(a, to) else []
        return sent + [(self.boundary(p), self.size(p)) for p in self.deps.producers(a) if self.cross_rank(a, p.stage)]

    def message_ms(self, a: Action) -> float:
        """What the messages charged to ``a`` cost its compute timeline: the one it sends and one per
        producer on another rank, each by its own full size."""
        return sum(self.cost.message_charge_ms(edge, n) for edge, n in self.messages(a))

    def duration(self, a: Action) -> float:
        """docs/model.md section 4: the base time plus the per-action and per-message overheads."""
        return self.base_ms(a) + self.cost.op_overhead_ms + self.message_ms(a)

    def transfer(self, a: Action) -> float:
        """Link time of ``a``'s message, across :meth:`boundary`."""
        return self.cost.transfer_ms(self.boundary(a), self.size(a))


def state_factor(plan: Plan, cost: CostModel) -> float:
    """Bytes of state per parameter byte on each device: the cost model's, or with ``zero1`` its
    optimizer part sharded over the replicas, ``2 + (state_factor - 2) / D`` (docs/model.md 9)."""
    return device_state_factor(cost.state_factor, plan.data_parallel, plan.zero1)


def hand_offs(plan: Plan) -> tuple[bool, ...]:
    """Per stage, whether it hands its output to the next stage as the very storage both save
    (:func:`~umsearch.core.actions.hands_on`; False for the last stage)."""
    st = plan.stages
    return tuple(j + 1 < len(st) and hands_on(st[j].rank == st[j + 1].rank, st[j].recompute, st[j + 1].recompute,
                                              st[j].forward == st[j + 1].forward) for j in range(len(st)))  # fmt: skip


def rank_peak_memory(plan: Plan, cost: CostModel, r: int) -> float:
    """docs/model.md section 5 (and 9) for rank ``r``: state plus the largest activation level at any of its
    actions (the same in every replica: memory follows the list order, not the links)."""
    level = peak = 0.0
    handed = hand_offs(plan)
    # Per stage once: the per-sample sizes and the fixed part (cost.microbatch_memory for a given n).
    terms = {j: (cost.stage_memory(st.lo, st.hi, st.recompute, j > 0 and handed[j - 1], handed[j]),
                 float(cost.stash_fixed(st.lo, st.hi)))
             for j, st in enumerate(plan.stages) if st.rank == r}  # fmt: skip
    for a in plan.actions[r]:
        st = plan.stages[a.stage]
        n = a.size(st.forward, st.backward)
        (stash, inp, kept, freed), fixed = terms[a.stage]
        add, release = a.memory(st.recompute, stash * n + fixed, inp * n, kept * n, freed * n)
        level += add
        peak = max(peak, level)
        level -= release
    return rank_state_bytes(plan, cost, r) + peak


def rank_state_bytes(plan: Plan, cost: CostModel, r: int) -> float:
    """docs/model.md section 5 (and 9): rank ``r``'s training state, the state factor times the parameter
    bytes of its stages, a weight tied between them once (:meth:`~umsearch.core.cost.CostModel.rank_param_bytes`)."""
    held = cost.rank_param_bytes([(plan.stages[j].lo, plan.stages[j].hi) for j in plan.stages_of(r)])
    return state_factor(plan, cost) * held


Transfer = Callable[[Action, int, int], float]
"""Link time of an action's message from one rank to another."""


@dataclass(frozen=True)
class _Timeline:
    """One replica's actions as they ran."""

    records: tuple[ActionRecord, ...]
    busy: tuple[float, ...]
    end: tuple[float, ...]
    finished: bool


def _transfer(plan: Plan, timing: ActionTiming, replica: int) -> Transfer:
    """How replica ``replica`` ships messages: the profile's link, or with a cluster ``intra`` between
    devices of one node and ``inter`` between nodes."""
    cluster = plan.cluster
    if cluster is None:
        return lambda a, src, dst: timing.transfer(a)
    nodes = replica_nodes(cluster, plan.ranks, plan.data_parallel, plan.layout, replica)

    def on_link(a: Action, src: int, dst: int) -> float:
        link = cluster.intra if nodes[src] == nodes[dst] else cluster.inter
        edge = timing.boundary(a)
        return link.latency_ms + timing.size(a) * float(timing.cost.out_bytes[edge]) * ms_per_byte(link)

    return on_link


def _link_pattern(plan: Plan, replica: int) -> tuple[int, ...] | None:
    """What decides replica ``replica``'s links: which of its ranks share a node (nodes numbered by
    first appearance). Replicas with equal patterns run identically."""
    if plan.cluster is None:
        return None
    nodes = replica_nodes(plan.cluster, plan.ranks, plan.data_parallel, plan.layout, replica)
    first: dict[int, int] = {}
    return tuple(first.setdefault(n, len(first)) for n in nodes)


def _run(plan: Plan, timing: ActionTiming, transfer: Transfer) -> _Timeline:
    """docs/model.md section 4 for one replica whose messages take ``transfer``: each rank runs its lowered
    program's steps in order (:func:`~umsearch.core.program.lower`), a step once the messages its input is
    built from have arrived; what it makes arrives at once on its own rank, else after the link's previous
    message and its transfer."""
    R = plan.ranks
    flows = [messages(p) for p in lower(plan, run=False)]
    delivered: dict[Message, float] = {}
    link_free: dict[tuple[int, int], float] = {}
    pos, free_at, busy, end = [0] * R, [0.0] * R, [0.0] * R, [0.0] * R
    records: list[ActionRecord] = []
    events = [0.0]

    def ready(reads: tuple[Message, ...], now: float) -> bool:
        return all(m in delivered and delivered[m] <= now for m in reads)

    while events:
        now = heapq.heappop(events)
        for r, (steps, reads, makes) in enumerate(flows):
            # A zero-length action frees its rank at once: keep going while the next one is ready too.
            while free_at[r] <= now and pos[r] < len(steps) and ready(reads[pos[r]], now):
                a = steps[pos[r]].action
                dur = timing.duration(a) if a is not None else 0.0
                stop = now + dur
                if a is not None:
                    records.append(ActionRecord(rank=r, stage=a.stage, kind=a.kind, mb=a.mb, size=timing.size(a),
                                                start_ms=now, end_ms=stop))  # fmt: skip
                busy[r] += dur
                free_at[r] = end[r] = stop
                heapq.heappush(events, stop)
                for m, peer in makes[pos[r]]:
                    if peer is None:
                        delivered[m] = stop
                        continue
                    assert a is not None, "a message sent to another rank is an action's"
                    link = (r, peer)
                    arrival = max(stop, link_free.get(link, 0.0)) + transfer(a, *link)
                    link_free[link] = delivered[m] = arrival
                    heapq.heappush(events, arrival)
                pos[r] += 1
    finished = all(pos[r] == len(steps) for r, (steps, _, _) in enumerate(flows))
    return _Timeline(records=tuple(records), busy=tuple(busy), end=tuple(end), finished=finished)


def _allreduce_link(plan: Plan, cost: CostModel, rank: int) -> Link:
    """The link a stage's copies on ``rank`` all-reduce over: ``inter`` if they span nodes, else
    ``intra``; without a cluster the profile's."""
    c = plan.cluster
    if c is None:
        return cost.profile.link
    return c.inter if copies_span_nodes(c, rank, plan.ranks, plan.data_parallel, plan.layout) else c.intra


@dataclass(frozen=True, kw_only=True)
class BucketSpan:
    """One gradient bucket's all-reduce across a stage's copies (docs/model.md section 9)."""

    stage: int
    """The stage whose layers the bucket holds."""
    rank: int
    """The rank holding the stage: its buckets are all-reduced one at a time."""
    layers: tuple[int, int]
    """``[lo, hi)``: the bucket's layers."""
    param_bytes: float
    """The bytes it all-reduces."""
    ready_ms: float
    """When its layers' gradients are complete in every replica."""
    start_ms: float
    """Ready, and the rank's previous bucket done."""
    end_ms: float


def _last_backwards(plan: Plan, timeline: _Timeline) -> list[ActionRecord]:
    """Per stage, the record of its last ``B`` or ``W`` in ``timeline`` (its rank runs its list in order)."""
    last: dict[int, ActionRecord] = {}
    for a in timeline.records:
        if a.action.ends_backward and (a.stage not in last or a.end_ms >= last[a.stage].end_ms):
            last[a.stage] = a
    return [last[j] for j in range(plan.num_stages)]


def _buckets(plan: Plan, cost: CostModel, timelines: list[_Timeline]) -> list[BucketSpan]:
    """docs/model.md section 9: every stage's gradient buckets (at most ``plan.bucket_mib`` each, in reverse
    layer order), each ready when its layers are complete in every replica (``timelines``: each distinct one
    once), its ring all-reduce on the stages' link; one rank's buckets run one at a time in the order they
    become ready (lower stage first on ties, then the bucket filled first)."""
    lasts = [_last_backwards(plan, tl) for tl in timelines]
    cap = bucket_cap_bytes(plan.bucket_mib)
    found: list[tuple[int, int, int, float, float]] = []  # stage, lo, hi, bytes, ready
    for j, st in enumerate(plan.stages):
        firsts = np.empty(st.hi - st.lo, dtype=np.int64)
        m = bucket_firsts(cost.param_prefix, st.lo, st.hi, cap, firsts)
        kind = _QUANTITY[lasts[0][j].kind]
        total = cost.time_ms(kind, st.lo, st.hi, lasts[0][j].size)
        top = st.hi
        for a in firsts[:m].tolist():
            below = cost.time_ms(kind, st.lo, a, lasts[0][j].size)
            ready = max(bucket_ready_ms(r[j].end_ms, r[j].end_ms - r[j].start_ms, below, total) for r in lasts)
            found.append((j, a, top, cost.param_bytes(a, top), ready))
            top = a
    n = len(found)
    ready_at = np.array([b[4] for b in found])
    took = np.array([allreduce_ms(b[3], plan.data_parallel, _allreduce_link(plan, cost, plan.stages[b[0]].rank))
                     for b in found])  # fmt: skip
    ranks = np.array([plan.stages[b[0]].rank for b in found], dtype=np.int64)
    start = np.empty(n)
    chain_allreduces(ready_at, took, ranks, n, np.empty(n, dtype=np.int64), np.empty(plan.ranks), start)
    return [BucketSpan(stage=j, rank=plan.stages[j].rank, layers=(lo, hi), param_bytes=p, ready_ms=ready,
                       start_ms=float(start[i]), end_ms=float(start[i] + took[i]))
            for i, (j, lo, hi, p, ready) in enumerate(found)]  # fmt: skip


def _allreduces(buckets: list[BucketSpan], stages: int) -> tuple[AllReduceSpan, ...]:
    """Per stage, its buckets in one span: ready with its first bucket, from the first one's start to the
    last one's end (with one bucket, the stage's whole all-reduce of version 2.2)."""
    spans = []
    for j in range(stages):
        mine = [b for b in buckets if b.stage == j]
        spans.append(AllReduceSpan(stage=j, rank=mine[0].rank, ready_ms=min(b.ready_ms for b in mine),
                                   start_ms=min(b.start_ms for b in mine), end_ms=max(b.end_ms for b in mine)))
    return tuple(spans)


def _replicas(plan: Plan, cost: CostModel) -> tuple[list[_Timeline], dict[tuple[int, ...] | None, _Timeline]]:
    """Each replica's timeline (stopping at the first that deadlocks) and each distinct one once."""
    timing = ActionTiming(plan, cost, Dependencies(plan))
    done: dict[tuple[int, ...] | None, _Timeline] = {}
    timelines = []
    for d in range(plan.data_parallel):
        key = _link_pattern(plan, d)
        if key not in done:
            done[key] = _run(plan, timing, _transfer(plan, timing, d))
        timelines.append(done[key])
        if not timelines[-1].finished:  # links change times, never what waits for what
            break
    return timelines, done


def bucket_spans(plan: Plan, cost: CostModel) -> tuple[BucketSpan, ...]:
    """Every gradient bucket's all-reduce of ``plan`` (docs/model.md section 9), stage by stage, each stage's
    in the order they fill; empty with one replica. Raises PlanError as :func:`simulate` does, and for a
    plan that deadlocks."""
    cost.check(validate_plan(plan))
    timelines, done = _replicas(plan, cost)
    if not timelines[-1].finished:
        raise PlanError(f"the plan deadlocks ({'; '.join(find_deadlock(plan))}): it has no all-reduce")
    return tuple(_buckets(plan, cost, list(done.values()))) if plan.data_parallel > 1 else ()


def simulate(plan: Plan, cost: CostModel) -> SimResult:
    """Simulate one iteration of ``plan`` (every replica, then the all-reduces); raises PlanError if
    the plan is invalid or does not fit the profile (layer count, I/W split)."""
    cost.check(validate_plan(plan))
    R, D = plan.ranks, plan.data_parallel
    timelines, done = _replicas(plan, cost)
    if not timelines[-1].finished:
        return SimResult(deadlock=True, iteration_ms=None, busy_ms=None, peak_memory_bytes=None,
                         rank_end_ms=timelines[-1].end, records=timelines[-1].records,
                         blocked=find_deadlock(plan), replica=len(timelines) - 1)  # fmt: skip
    last = [max(tl.end) for tl in timelines]
    slowest = last.index(max(last))
    compute_end = last[slowest]
    spans = _allreduces(_buckets(plan, cost, list(done.values())), plan.num_stages) if D > 1 else ()
    allreduce_end = max((s.end_ms for s in spans), default=None)
    return SimResult(
        deadlock=False, iteration_ms=max(compute_end, allreduce_end or 0.0), busy_ms=timelines[0].busy,
        peak_memory_bytes=tuple(rank_peak_memory(plan, cost, r) for r in range(R)),
        rank_end_ms=tuple(max(tl.end[r] for tl in timelines) for r in range(R)),
        records=timelines[slowest].records, compute_end_ms=compute_end, allreduce_end_ms=allreduce_end,
        allreduces=spans, replica=slowest,
    )  # fmt: skip
