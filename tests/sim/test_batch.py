"""The compiled batch evaluator equals the reference simulator on every plan."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.strategies import plans, profiles, uniform_profile
from umsearch.core.cost import CostModel
from umsearch.core.plan import Plan, StagePlan, uniform_plan
from umsearch.sim.batch import evaluate, pack_plans
from umsearch.sim.reference import simulate


def _agree(plan_list: list[Plan], cost: CostModel) -> None:
    fast = evaluate(pack_plans(plan_list), cost)
    for c, plan in enumerate(plan_list):
        ref = simulate(plan, cost)
        assert bool(fast.deadlock[c]) == ref.deadlock
        np.testing.assert_allclose(fast.peak_memory_bytes[c], ref.peak_memory_bytes, rtol=1e-9)
        np.testing.assert_allclose(fast.stage_end_ms[c], ref.stage_end_ms, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(fast.busy_ms[c], ref.busy_ms, rtol=1e-9, atol=1e-12)
        if ref.deadlock:
            assert math.isinf(fast.iteration_ms[c])
        else:
            assert ref.iteration_ms is not None
            assert math.isclose(fast.iteration_ms[c], ref.iteration_ms, rel_tol=1e-9, abs_tol=1e-12)


def test_reference_values() -> None:
    cost = CostModel(uniform_profile())
    res = evaluate(pack_plans([uniform_plan([0, 1, 2, 3, 4], 8, 8, s) for s in ("gpipe", "1f1b")]), cost)
    assert res.iteration_ms.tolist() == [33.0, 33.0]
    assert res.peak_memory_bytes[0].tolist() == [480.0] * 4
    assert res.peak_memory_bytes[1, 0] == 440.0


def test_reference_deadlock() -> None:
    plan = Plan(global_batch=8, stages=(
        StagePlan(layers=(0, 2), forward=(1, 3, 4), backward=(2, 6), warmup=1, recompute=True),
        StagePlan(layers=(2, 4), forward=(4, 4), backward=(8,), warmup=2, recompute=True),
    ))  # fmt: skip
    res = evaluate(pack_plans([plan]), CostModel(uniform_profile()))
    assert res.deadlock.tolist() == [True]
    assert math.isinf(res.iteration_ms[0])


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_matches_reference(data: st.DataObject) -> None:
    profile = data.draw(profiles())
    n_stages = data.draw(st.integers(1, min(4, profile.num_layers)))
    batch = data.draw(st.integers(1, 12))
    population = data.draw(
        st.lists(plans(profile.num_layers).filter(lambda p: p.num_stages == n_stages and p.global_batch == batch),
                 min_size=1, max_size=4)
    )  # fmt: skip
    _agree(population, CostModel(profile, state_factor=data.draw(st.floats(1, 8))))


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_splitting_nothing_changes_nothing(data: st.DataObject) -> None:
    """A one-stage, one-microbatch plan costs exactly F(B) + G(B)."""
    profile = data.draw(profiles())
    B = data.draw(st.integers(1, 40))
    rec = data.draw(st.booleans())
    plan = Plan(global_batch=B, stages=(StagePlan(layers=(0, profile.num_layers), forward=(B,),
                backward=(B,), warmup=1, recompute=rec),))  # fmt: skip
    cost = CostModel(profile)
    L = profile.num_layers
    expect = cost.stage_fwd_ms(0, L, B) + cost.stage_bwd_ms(0, L, B, rec)
    assert math.isclose(simulate(plan, cost).iteration_ms or -1, expect, rel_tol=1e-12)
    assert math.isclose(evaluate(pack_plans([plan]), cost).iteration_ms[0], expect, rel_tol=1e-12)
