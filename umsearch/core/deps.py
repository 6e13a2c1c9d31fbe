"""Which actions feed which (docs/model.md section 4), and whether a plan deadlocks.

An action waits for two things: its rank's previous action, and its inputs.
A forward of stage ``j`` needs the forwards of stage ``j-1`` holding its
samples; a ``B``/``I`` of stage ``j`` needs the ``B``/``I`` of stage ``j+1``
holding its samples; a ``W`` needs its own ``I``, earlier on the same rank
(the rules are :mod:`umsearch.core.actions`' ``NEEDS`` and ``FOLLOWS``).
Whether a plan deadlocks depends on these edges and the rank orders alone,
never on durations: :func:`find_deadlock` answers it without a cost model.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from umsearch.core.actions import Action, B, F, Kind, indexed_list, source_stage
from umsearch.core.errors import PlanError
from umsearch.core.plan import Plan
from umsearch.core.samples import spans


@dataclass(frozen=True)
class Dependencies:
    """The producer ranges of every action of one (valid) plan."""

    plan: Plan

    def _sources(self, kind: int) -> tuple[tuple[range, ...], ...]:
        """``[j][k]``: the microbatches of the stage that stage j's actions of kind code ``kind`` read
        (:func:`source_stage`) holding the samples of its microbatch k, on the list they index."""
        st, n = self.plan.stages, self.plan.num_stages
        out: list[tuple[range, ...]] = []
        for j in range(n):
            src = source_stage(kind, j, n)
            if src < 0:
                out.append(())
                continue
            theirs = indexed_list(kind, st[src].forward, st[src].backward)
            out.append(tuple(spans(theirs, indexed_list(kind, st[j].forward, st[j].backward))))
        return tuple(out)

    @cached_property
    def forward_sources(self) -> tuple[tuple[range, ...], ...]:
        """``[j][k]``: stage ``j-1``'s forward microbatches holding the samples of ``jFk`` (empty for j=0)."""
        return self._sources(F)

    @cached_property
    def gradient_sources(self) -> tuple[tuple[range, ...], ...]:
        """``[j][k]``: stage ``j+1``'s backward microbatches holding the samples of ``jBk``/``jIk``
        (empty for the last stage, whose loss is part of its own forward)."""
        return self._sources(B)

    @cached_property
    def gradient_kind(self) -> tuple[dict[int, Kind], ...]:
        """``[j][k]``: ``"B"`` or ``"I"``, whichever action of stage j's backward k sends its gradient."""
        out: list[dict[int, Kind]] = [{} for _ in self.plan.stages]
        for acts in self.plan.actions:
            for a in acts:
                if a.sends_gradient:
                    out[a.stage][a.mb] = a.kind
        return tuple(out)

    def producers(self, a: Action) -> list[Action]:
        """The actions on earlier stages whose outputs ``a`` needs (its own rank's order aside): a
        forward its source's forwards, a ``B``/``I`` whichever of its source's actions sent the gradient."""
        src = a.source(self.plan.num_stages)
        if src is None:
            return []
        if a.is_forward:
            return [Action(src, a.kind, i) for i in self.forward_sources[a.stage][a.mb]]
        return [Action(src, self.gradient_kind[src][i], i) for i in self.gradient_sources[a.stage][a.mb]]


def find_deadlock(plan: Plan) -> tuple[str, ...]:
    """For a valid plan: one line per rank that can never finish, naming the action it is stuck at and
    the first input that never comes; empty when the plan runs to the end.

    Every rank runs its list in order and an action runs once its producers
    have; the plan deadlocks exactly when this stops with actions left.
    """
    deps = Dependencies(plan)
    done: set[Action] = set()
    pos = [0] * plan.ranks
    progress = True
    while progress:
        progress = False
        for r, acts in enumerate(plan.actions):
            while pos[r] < len(acts) and all(p in done for p in deps.producers(acts[pos[r]])):
                done.add(acts[pos[r]])
                pos[r] += 1
                progress = True
    stuck = []
    for r, acts in enumerate(plan.actions):
        if pos[r] < len(acts):
            a = acts[pos[r]]
            missing = next(p for p in deps.producers(a) if p not in done)
            stuck.append(f"rank {r} is stuck at {a}, waiting for {missing} on rank {plan.stages[missing.stage].rank}")
    return tuple(stuck)


def check_deadlock(plan: Plan) -> None:
    """For a valid plan: raise PlanError naming every stuck rank's action and what it waits for when
    ``plan`` deadlocks."""
    stuck = find_deadlock(plan)
    if stuck:
        raise PlanError(
            "the plan deadlocks (" + "; ".join(stuck) + "); reorder the stuck ranks' actions so that every "
            "input is produced before it is needed, or align the microbatches with the neighbour's"
        )
