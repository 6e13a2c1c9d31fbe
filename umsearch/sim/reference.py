"""The reference simulator: one plan, event by event, written straight from MODEL.md sections 4 and 5.

It favours being obviously right over being fast; :mod:`umsearch.sim.batch`
is the compiled twin the search uses, and tests hold the two equal on every
plan, deadlocks included.

Events are action ends and message arrivals. Whenever one happens, every idle
rank whose next action has all its inputs delivered starts it at that time.
An output goes to a stage on the same rank at the action's end, else as one
message on the directed link between the two ranks, after the link's previous
message. When no event is left while actions remain, the plan deadlocks.
"""

from __future__ import annotations

import heapq

from umsearch.core.actions import Action, ActionRecord
from umsearch.core.cost import CostModel
from umsearch.core.deps import Dependencies, find_deadlock
from umsearch.core.plan import Plan, validate_plan
from umsearch.sim.result import SimResult

_QUANTITY = {"F": "fwd", "B": "bwd", "I": "bwd_input", "W": "bwd_weight"}


class ActionTiming:
    """Sizes, durations and destinations of a plan's actions under one cost model."""

    def __init__(self, plan: Plan, cost: CostModel, deps: Dependencies) -> None:
        self.plan, self.cost, self.deps = plan, cost, deps

    def size(self, a: Action) -> int:
        st = self.plan.stages[a.stage]
        return st.forward[a.mb] if a.kind == "F" else st.backward[a.mb]

    def consumer(self, a: Action) -> int | None:
        """The stage that receives ``a``'s output (:meth:`Action.consumer`)."""
        return a.consumer(self.plan.num_stages)

    def cross_rank(self, a: Action, other: int) -> bool:
        return self.plan.stages[a.stage].rank != self.plan.stages[other].rank

    def base_ms(self, a: Action) -> float:
        """The layers' own time of ``a`` (recomputation included) times the stage's scale, without the
        runtime's overheads (MODEL.md 4 and 2.1)."""
        st, c, n = self.plan.stages[a.stage], self.cost, self.size(a)
        t = c.time_ms(_QUANTITY[a.kind], st.lo, st.hi, n)
        if st.recompute and a.kind in ("B", "I"):
            t += c.time_ms("fwd", st.lo, st.hi, n)
        return t * c.stage_scale(st.lo, st.hi)

    def boundary(self, a: Action) -> int:
        """The layer whose output ``a``'s message carries: a forward's last layer, a gradient's
        stage's first layer minus one."""
        st = self.plan.stages[a.stage]
        return st.hi - 1 if a.kind == "F" else st.lo - 1

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
        """MODEL.md section 4: the base time plus the per-action and per-message overheads."""
        return self.base_ms(a) + self.cost.op_overhead_ms + self.message_ms(a)

    def transfer(self, a: Action) -> float:
        """Link time of ``a``'s message: a forward crosses after layer hi-1, a gradient after lo-1."""
        return self.cost.transfer_ms(self.boundary(a), self.size(a))


def rank_peak_memory(plan: Plan, cost: CostModel, r: int) -> float:
    """MODEL.md section 5 for rank ``r``: state plus the largest activation level at any of its actions."""
    level = peak = 0.0
    for a in plan.actions[r]:
        st = plan.stages[a.stage]
        n = st.forward[a.mb] if a.kind == "F" else st.backward[a.mb]
        add, release = a.memory(st.recompute, cost.stash_bytes(st.lo, st.hi) * n, cost.input_bytes_of(st.lo) * n)
        level += add
        peak = max(peak, level)
        level -= release
    state = sum(cost.param_bytes(plan.stages[j].lo, plan.stages[j].hi) for j in plan.stages_of(r))
    return cost.state_factor * state + peak


def simulate(plan: Plan, cost: CostModel) -> SimResult:
    """Simulate one iteration of ``plan``; raises PlanError if the plan is invalid or does not fit the
    profile (layer count, I/W split)."""
    cost.check(validate_plan(plan))
    deps = Dependencies(plan)
    timing = ActionTiming(plan, cost, deps)
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
                arrival = max(stop, link_free.get(link, 0.0)) + timing.transfer(a)
                link_free[link] = delivered[a] = arrival
                heapq.heappush(events, arrival)
    if any(pos[r] < len(plan.actions[r]) for r in range(R)):
        return SimResult(deadlock=True, iteration_ms=None, busy_ms=None, peak_memory_bytes=None,
                         rank_end_ms=tuple(end), records=tuple(records), blocked=find_deadlock(plan))  # fmt: skip
    return SimResult(
        deadlock=False, iteration_ms=max(end), busy_ms=tuple(busy),
        peak_memory_bytes=tuple(rank_peak_memory(plan, cost, r) for r in range(R)),
        rank_end_ms=tuple(end), records=tuple(records),
    )  # fmt: skip
