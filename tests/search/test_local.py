"""Local search: only improvements, feasible steps, same seed same path."""

from __future__ import annotations

import numpy as np

from umsearch.core.cost import CostModel
from umsearch.core.plan import uniform_plan
from umsearch.measure.synthetic import simnet_profile
from umsearch.search.genome import Rules
from umsearch.search.local import ClimbConfig, Step, climb, iterated_climb
from umsearch.search.scoring import Scorer
from umsearch.sim.reference import simulate

RULES = Rules(num_layers=12, stages=3, batch=48, sizes=tuple(range(1, 49)), max_count=48, schedule="any",
              recompute=True)  # fmt: skip


def _start(cost: CostModel) -> Step:
    plan = uniform_plan([0, 4, 8, 12], 48, 4, "1f1b")
    res = simulate(plan, cost)
    assert res.iteration_ms is not None
    return Step(plan=plan, iteration_ms=res.iteration_ms, peak_memory_bytes=res.peak_memory_bytes)


def test_climb_improves_and_every_step_is_real() -> None:
    cost = CostModel(simnet_profile(layers=12, seed=2), b_max=48)
    start = _start(cost)
    limit = 2 * max(start.peak_memory_bytes)
    path = iterated_climb(start, Scorer(cost), RULES, limit, np.random.default_rng(0), ClimbConfig(kicks=3))
    times = [s.iteration_ms for s in path]
    assert path[0] == start and len(path) > 1
    assert all(b < a for a, b in zip(times, times[1:], strict=False))
    for step in path:
        res = simulate(step.plan, cost)  # the step's numbers are the reference simulator's
        assert res.iteration_ms is not None and abs(res.iteration_ms - step.iteration_ms) <= 1e-9 * step.iteration_ms
        assert max(res.peak_memory_bytes) <= limit


def test_climb_respects_a_tight_memory_limit() -> None:
    cost = CostModel(simnet_profile(layers=12, seed=2), b_max=48)
    start = _start(cost)
    limit = max(start.peak_memory_bytes)  # no room to keep more samples in flight
    path = climb(start, Scorer(cost), RULES, limit, np.random.default_rng(1))
    assert all(max(s.peak_memory_bytes) <= limit for s in path)


def test_same_seed_same_path() -> None:
    cost = CostModel(simnet_profile(layers=12, seed=2), b_max=48)
    start = _start(cost)
    a = iterated_climb(start, Scorer(cost), RULES, 1e30, np.random.default_rng(5), ClimbConfig(kicks=2))
    b = iterated_climb(start, Scorer(cost), RULES, 1e30, np.random.default_rng(5), ClimbConfig(kicks=2))
    assert [s.plan for s in a] == [s.plan for s in b]
