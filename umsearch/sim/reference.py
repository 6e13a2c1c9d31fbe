"""The reference simulator: one plan, event by event, written straight from docs/model.md sections 4 and 5.

It favours being obviously right over being fast; :mod:`umsearch.sim.batch`
is the compiled twin the search uses, and tests hold the two equal on every
plan, deadlocks included.

Events are action ends and message arrivals. Whenever one happens, every idle
rank whose next action has all its inputs delivered starts it at that time.
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

from umsearch.core.actions import KINDS, Action, ActionRecord, F
from umsearch.core.cluster import allreduce_ms, copies_span_nodes, ms_per_byte, replica_nodes
from umsearch.core.cost import CostModel, device_state_factor
from umsearch.core.deps import Dependencies, find_deadlock
from umsearch.core.plan import Plan
from umsearch.core.plan_rules import validate_plan
from umsearch.core.profile import Link
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


def rank_peak_memory(plan: Plan, cost: CostModel, r: int) -> float:
    """docs/model.md section 5 (and 9) for rank ``r``: state plus the largest activation level at any of its
    actions (the same in every replica: memory follows the list order, not the links)."""
    level = peak = 0.0
    for a in plan.actions[r]:
        st = plan.stages[a.stage]
        n = a.size(st.forward, st.backward)
        add, release = a.memory(st.recompute, cost.stash_bytes(st.lo, st.hi) * n, cost.input_bytes_of(st.lo) * n)
        level += add
        peak = max(peak, level)
        level -= release
    state = sum(cost.param_bytes(plan.stages[j].lo, plan.stages[j].hi) for j in plan.stages_of(r))
    return state_factor(plan, cost) * state + peak


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
    """docs/model.md section 4 for one replica whose messages take ``transfer``."""
    deps = timing.deps
    R = plan.ranks
    delivered: dict[Action, float] = {}
    link_free: dict[tuple[int, int], float] = {}
    pos, free_at, busy, end = [0] * R, [0.0] * R, [0.0] * R, [0.0] * R
    records: list[ActionRecord] = []
    events = [0.0]

    def ready(a: Action, now: float) -> bool:
        return all(p in delivered and delivered[p] <= now for p in deps.producers(a))

    while events:
        now = heapq.heappop(events)
        for r in range(R):
            acts = plan.actions[r]
            # A zero-length action frees its rank at once: keep going while the next one is ready too.
            while free_at[r] <= now and pos[r] < len(acts) and ready(acts[pos[r]], now):
                a = acts[pos[r]]
                dur = timing.duration(a)
                stop = now + dur
                records.append(ActionRecord(rank=r, stage=a.stage, kind=a.kind, mb=a.mb, size=timing.size(a),
                                            start_ms=now, end_ms=stop))  # fmt: skip
                busy[r] += dur
                free_at[r] = end[r] = stop
                pos[r] += 1
                heapq.heappush(events, stop)
                to = timing.consumer(a)
                if to is None:
                    continue
                if not timing.cross_rank(a, to):
                    delivered[a] = stop
                    continue
                link = (r, plan.stages[to].rank)
                arrival = max(stop, link_free.get(link, 0.0)) + transfer(a, *link)
                link_free[link] = delivered[a] = arrival
                heapq.heappush(events, arrival)
    finished = all(pos[r] == len(plan.actions[r]) for r in range(R))
    return _Timeline(records=tuple(records), busy=tuple(busy), end=tuple(end), finished=finished)


def _allreduce_link(plan: Plan, cost: CostModel, rank: int) -> Link:
    """The link a stage's copies on ``rank`` all-reduce over: ``inter`` if they span nodes, else
    ``intra``; without a cluster the profile's."""
    c = plan.cluster
    if c is None:
        return cost.profile.link
    return c.inter if copies_span_nodes(c, rank, plan.ranks, plan.data_parallel, plan.layout) else c.intra


def _allreduces(plan: Plan, cost: CostModel, timelines: list[_Timeline]) -> tuple[AllReduceSpan, ...]:
    """docs/model.md section 9: each stage's ring all-reduce, ready when its last B or W has ended in every
    replica (``timelines``: each distinct one once); one rank's run one at a time in the order they
    become ready (lower stage first on ties)."""
    ready = [0.0] * plan.num_stages
    for tl in timelines:
        for a in tl.records:
            if a.action.ends_backward:
                ready[a.stage] = max(ready[a.stage], a.end_ms)
    free = [0.0] * plan.ranks
    spans: dict[int, AllReduceSpan] = {}
    for j in sorted(range(plan.num_stages), key=lambda j: (ready[j], j)):
        st = plan.stages[j]
        start = max(ready[j], free[st.rank])
        took = allreduce_ms(cost.param_bytes(st.lo, st.hi), plan.data_parallel, _allreduce_link(plan, cost, st.rank))
        free[st.rank] = start + took
        spans[j] = AllReduceSpan(stage=j, rank=st.rank, ready_ms=ready[j], start_ms=start, end_ms=start + took)
    return tuple(spans[j] for j in range(plan.num_stages))


def simulate(plan: Plan, cost: CostModel) -> SimResult:
    """Simulate one iteration of ``plan`` (every replica, then the all-reduces); raises PlanError if
    the plan is invalid or does not fit the profile (layer count, I/W split)."""
    cost.check(validate_plan(plan))
    timing = ActionTiming(plan, cost, Dependencies(plan))
    R, D = plan.ranks, plan.data_parallel
    done: dict[tuple[int, ...] | None, _Timeline] = {}
    timelines = []
    for d in range(D):
        key = _link_pattern(plan, d)
        if key not in done:
            done[key] = _run(plan, timing, _transfer(plan, timing, d))
        timelines.append(done[key])
        if not timelines[-1].finished:  # links change times, never what waits for what
            return SimResult(deadlock=True, iteration_ms=None, busy_ms=None, peak_memory_bytes=None,
                             rank_end_ms=timelines[-1].end, records=timelines[-1].records,
                             blocked=find_deadlock(plan), replica=d)  # fmt: skip
    last = [max(tl.end) for tl in timelines]
    slowest = last.index(max(last))
    compute_end = last[slowest]
    spans = _allreduces(plan, cost, list(done.values())) if D > 1 else ()
    allreduce_end = max((s.end_ms for s in spans), default=None)
    return SimResult(
        deadlock=False, iteration_ms=max(compute_end, allreduce_end or 0.0), busy_ms=timelines[0].busy,
        peak_memory_bytes=tuple(rank_peak_memory(plan, cost, r) for r in range(R)),
        rank_end_ms=tuple(max(tl.end[r] for tl in timelines) for r in range(R)),
        records=timelines[slowest].records, compute_end_ms=compute_end, allreduce_end_ms=allreduce_end,
        allreduces=spans, replica=slowest,
    )  # fmt: skip
