"""The pure parts of benchmarks.runtime (the benchmark itself runs with `python -m`)."""

from __future__ import annotations

import pytest

from benchmarks.runtime import BATCH, contenders
from tests.strategies import uniform_profile
from umsearch.core.cost import CostModel
from umsearch.core.deps import find_deadlock
from umsearch.sim.reference import simulate


def test_contenders_are_the_searched_plan_and_every_peer_and_they_run() -> None:
    profile = uniform_profile(layers=8)
    plans = contenders(profile, budget_s=5.0)
    names = [n for n, _ in plans]
    assert names[0] == "umsearch" and len(set(names)) == len(names)
    assert {"GPipe", "1F1B", "Interleaved1F1B", "ZBVZeroBubble"} <= set(names)
    cost = CostModel(profile)
    best = simulate(plans[0][1], cost).iteration_ms
    for _, plan in plans:
        assert plan.global_batch == BATCH and plan.ranks == 2 and not find_deadlock(plan)
        t = simulate(plan, cost).iteration_ms
        assert t is not None and best is not None and best <= t + 1e-9


def test_kendall_tau() -> None:
    from benchmarks.stats import kendall_tau

    assert kendall_tau([1, 2, 3, 4], [10, 20, 30, 40]) == 1.0
    assert kendall_tau([1, 2, 3, 4], [4, 3, 2, 1]) == -1.0
    assert kendall_tau([1, 2, 3], [1, 3, 2]) == pytest.approx(1 / 3)


def test_the_probes_join_the_contenders() -> None:
    names = [n for n, _ in contenders(uniform_profile(layers=8), budget_s=3.0)]
    assert sum(n.startswith("probe ") for n in names) == 5
