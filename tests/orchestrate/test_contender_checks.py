"""A contender's plan is checked once, in the launcher: ``tune``'s ranks get it pickled and check nothing."""

from __future__ import annotations

import functools
from typing import Any

import pytest

from tests.orchestrate.test_contenders import CFG, JOBS
from tests.runtime.test_distributed import tiny_model
from umsearch.core.plan import Plan
from umsearch.orchestrate.contenders import make_runners
from umsearch.runtime.launch import launch

pytestmark = pytest.mark.slow


def counting_worker(rank: int, world: int, jobs: list[tuple[str, Plan, str | None]]) -> dict[str, int]:
    """Launch target: every contender's runner made and stepped once, counting the plan checks
    (:func:`umsearch.core.plan_rules.validate_plan`'s real checks) and the deadlock checks this rank runs."""
    from umsearch.core import deps, plan_rules

    counts = {"checks": 0, "deadlock": 0}
    check, find = plan_rules._check, deps.find_deadlock

    def counted_check(plan: Plan) -> None:
        counts["checks"] += 1
        check(plan)

    def counted_find(plan: Plan) -> Any:
        counts["deadlock"] += 1
        return find(plan)

    plan_rules._check, deps.find_deadlock = counted_check, counted_find
    try:
        for runner in make_runners(rank, world, jobs, functools.partial(tiny_model, 4), CFG):
            runner.step(0)
    finally:
        plan_rules._check, deps.find_deadlock = check, find
    return counts


def test_a_ranks_contenders_check_no_plan() -> None:
    """Two PlanSchedule contenders and two torch ones per rank: zero plan checks, zero deadlock checks."""
    assert sum(kind == "umsearch" for kind, _, _ in JOBS) == 2
    per_rank = launch(counting_worker, 2, (JOBS,), CFG.launch)
    assert per_rank == [{"checks": 0, "deadlock": 0}] * 2
