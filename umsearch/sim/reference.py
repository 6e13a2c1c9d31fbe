"""The reference simulator: one plan, event by event, straight from MODEL.md sections 3-5.

It favours being obviously right over being fast; :mod:`umsearch.sim.batch`
is the fast twin the search uses, and tests hold the two equal on every plan.

Events are op ends and message arrivals. Whenever time advances, every idle
stage whose next op (in its static order) has all its messages starts it at
the current time. Messages on a link direction leave one at a time, in order.
If the event queue runs dry while ops remain, the plan deadlocks.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Literal

from umsearch.core.cost import CostModel
from umsearch.core.plan import Plan, StagePlan, validate_plan
from umsearch.core.samples import Op, message_span, op_order, peak_inflight


@dataclass(frozen=True, kw_only=True)
class OpRecord:
    """One executed op."""

    stage: int
    """Stage index."""
    kind: Literal["F", "B"]
    """Forward or backward."""
    index: int
    """Microbatch index within the stage's forward or backward list."""
    size: int
    """Samples in the microbatch."""
    start_ms: float
    """Start time."""
    end_ms: float
    """End time."""


@dataclass(frozen=True, kw_only=True)
class SimResult:
    """What one plan costs under the model."""

    deadlock: bool
    """True when no op could start while some remained; times then cover the ops that ran."""
    iteration_ms: float | None
    """Latest end of any op; None on deadlock."""
    stage_end_ms: tuple[float, ...]
    """End of each stage's last op (of those that ran)."""
    busy_ms: tuple[float, ...]
    """Sum of op durations per stage (of those that ran)."""
    peak_memory_bytes: tuple[float, ...]
    """Peak memory per stage (MODEL.md section 5); defined even on deadlock."""
    ops: tuple[OpRecord, ...] = field(repr=False)
    """Every op that ran, in start order."""
    blocked: tuple[str, ...] = ()
    """On deadlock: for each stuck stage, the op it waits on."""

    @property
    def bubble_fraction(self) -> float | None:
        """Idle share of all stages over the iteration: ``1 - sum(busy) / (S * T)``."""
        if self.iteration_ms is None or self.iteration_ms <= 0:
            return None
        return 1.0 - sum(self.busy_ms) / (len(self.busy_ms) * self.iteration_ms)

    def stage_bubble(self, s: int) -> float | None:
        """Idle share of stage ``s`` over the iteration."""
        if self.iteration_ms is None or self.iteration_ms <= 0:
            return None
        return 1.0 - self.busy_ms[s] / self.iteration_ms

    def predicted(self) -> dict[str, object]:
        """The plan's ``predicted`` block."""
        return {
            "iteration_ms": self.iteration_ms,
            "peak_memory_bytes": list(self.peak_memory_bytes),
            "stage_busy_ms": list(self.busy_ms),
            "bubble_fraction": self.bubble_fraction,
        }


def stage_peak_memory(st: StagePlan, cost: CostModel) -> float:
    """Peak memory of one stage under the cost model."""
    inflight = peak_inflight(st.forward, st.backward, st.warmup)
    return cost.peak_memory_bytes(st.lo, st.hi, inflight, st.recompute, max(st.backward))


class _Link:
    """One direction of one stage boundary: messages leave in order, one at a time."""

    def __init__(self) -> None:
        self.free_at = 0.0
        self.arrival: dict[int, float] = {}

    def send(self, msg: int, ready_ms: float, duration_ms: float) -> float:
        start = max(ready_ms, self.free_at)
        self.free_at = start + duration_ms
        self.arrival[msg] = self.free_at
        return self.free_at


def simulate(plan: Plan, cost: CostModel) -> SimResult:
    """Simulate one iteration of ``plan``; raises PlanError if the plan is malformed."""
    validate_plan(plan, cost.num_layers)
    stages = plan.stages
    S = len(stages)
    orders: list[list[Op]] = [op_order(st.forward, st.backward, st.warmup) for st in stages]
    fwd_links = [_Link() for _ in range(S - 1)]  # fwd_links[s]: stage s -> s+1
    bwd_links = [_Link() for _ in range(S - 1)]  # bwd_links[s]: stage s+1 -> s
    pos = [0] * S
    running = [False] * S
    busy = [0.0] * S
    stage_end = [0.0] * S
    records: list[OpRecord] = []
    events: list[tuple[float, int, int]] = [(0.0, 0, -1)]  # (time, seq, stage or -1)
    seq = 1

    def ready(s: int, now: float) -> bool:
        kind, idx = orders[s][pos[s]]
        st = stages[s]
        if kind == "F" and s > 0:
            need = message_span(stages[s - 1].forward, st.forward, idx)
            arrivals = fwd_links[s - 1].arrival
        elif kind == "B" and s < S - 1:
            need = message_span(stages[s + 1].backward, st.backward, idx)
            arrivals = bwd_links[s].arrival
        else:
            return True
        return all(m in arrivals and arrivals[m] <= now for m in need)

    def duration(s: int, kind: str, size: int) -> float:
        st = stages[s]
        if kind == "F":
            return cost.stage_fwd_ms(st.lo, st.hi, size)
        return cost.stage_bwd_ms(st.lo, st.hi, size, st.recompute)

    while events:
        now, _, finished = heapq.heappop(events)
        if finished >= 0:
            running[finished] = False
        for s in range(S):
            if running[s] or pos[s] == len(orders[s]) or not ready(s, now):
                continue
            kind, idx = orders[s][pos[s]]
            st = stages[s]
            size = st.forward[idx] if kind == "F" else st.backward[idx]
            end = now + duration(s, kind, size)
            records.append(OpRecord(stage=s, kind=kind, index=idx, size=size, start_ms=now, end_ms=end))
            busy[s] += end - now
            stage_end[s] = end
            running[s] = True
            pos[s] += 1
            heapq.heappush(events, (end, seq, s))
            seq += 1
            # The message leaves when the op ends; its arrival is an event that may wake the peer.
            if kind == "F" and s < S - 1:
                arr = fwd_links[s].send(idx, end, cost.transfer_ms(st.hi - 1, size))
                heapq.heappush(events, (arr, seq, -1))
                seq += 1
            elif kind == "B" and s > 0:
                arr = bwd_links[s - 1].send(idx, end, cost.transfer_ms(st.lo - 1, size))
                heapq.heappush(events, (arr, seq, -1))
                seq += 1

    deadlock = any(pos[s] < len(orders[s]) for s in range(S))
    blocked = tuple(
        f"stage {s} waits to run {orders[s][pos[s]][0]}{orders[s][pos[s]][1]}"
        for s in range(S)
        if pos[s] < len(orders[s])
    )
    return SimResult(
        deadlock=deadlock,
        iteration_ms=None if deadlock else max(stage_end),
        stage_end_ms=tuple(stage_end),
        busy_ms=tuple(busy),
        peak_memory_bytes=tuple(stage_peak_memory(st, cost) for st in stages),
        ops=tuple(records),
        blocked=blocked,
    )
