"""Deadlock detection reads the plan's programs (:func:`umsearch.core.program.lower`): it finds exactly the stuck
ranks, actions and missing inputs that the producer ranges of :class:`umsearch.core.deps.Dependencies` give."""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from tests.contract import EXAMPLE3, EXAMPLE4, EXAMPLE5, EXAMPLE5_DEADLOCK
from tests.strategies import plans
from umsearch.core.actions import Action
from umsearch.core.deps import Dependencies, find_deadlock
from umsearch.core.plan import Plan


def by_producers(plan: Plan) -> tuple[str, ...]:
    """Deadlock detection on the producer ranges: every rank runs its list in order, an action once every
    action it needs has run."""
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
            missing = next(p for p in deps.producers(acts[pos[r]]) if p not in done)
            stuck.append(f"rank {r} is stuck at {acts[pos[r]]}, waiting for {missing} on rank "
                         f"{plan.stages[missing.stage].rank}")  # fmt: skip
    return tuple(stuck)


def test_model_md_deadlock_names_the_stuck_action_and_its_missing_input() -> None:
    assert find_deadlock(EXAMPLE5_DEADLOCK) == by_producers(EXAMPLE5_DEADLOCK) != ()
    # 2F0 (4 samples) needs 1F0 and 1F1; 1F0 (samples 0-1) needs 0F0 and 0F1, which rank 0 lists after 2F0.
    assert find_deadlock(EXAMPLE5_DEADLOCK) == ("rank 0 is stuck at 2F0, waiting for 1F0 on rank 1",
                                                "rank 1 is stuck at 1F0, waiting for 0F1 on rank 0")  # fmt: skip


@pytest.mark.parametrize("plan", [EXAMPLE3, EXAMPLE4, EXAMPLE5])
def test_model_md_plans_run_to_the_end(plan: Plan) -> None:
    assert find_deadlock(plan) == ()


@settings(max_examples=150, deadline=None)
@given(plans(num_layers=6))
def test_the_programs_give_the_producers_verdict(plan: Plan) -> None:
    assert find_deadlock(plan) == by_producers(plan)
