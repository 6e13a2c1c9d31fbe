"""The lower bound: exact where the optimum is known, never above any plan."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.strategies import plans, profiles, uniform_profile
from umsearch.core.cost import CostModel
from umsearch.core.plan import uniform_plan
from umsearch.core.profile import Profile
from umsearch.search.bound import lower_bound, min_compute_table
from umsearch.search.space import build_space
from umsearch.sim.reference import simulate


def _space(stages: int, batch: int):  # type: ignore[no-untyped-def]
    return build_space({"profile": "p.json", "stages": stages, "global_batch": batch})


def test_uniform_profile_bound_is_tight() -> None:
    # Every op costs 1 (fwd) or 2 (bwd) ms at any size: one microbatch of 8 through four stages,
    # 4 * 1 + 4 * 2 = 12 ms, is optimal, and the bound finds exactly that.
    cost = CostModel(uniform_profile(layers=4))
    bound = lower_bound(cost, _space(4, 8))
    assert bound == 12.0
    assert simulate(uniform_plan([0, 1, 2, 3, 4], 8, 1, "gpipe"), cost).iteration_ms == 12.0


def test_link_latency_counts_once_per_boundary_each_way() -> None:
    cost = CostModel(uniform_profile(layers=4, latency=0.5))
    assert lower_bound(cost, _space(4, 8)) == 12.0 + 2 * 3 * 0.5


def test_min_compute_table_is_the_knapsack() -> None:
    # fwd+bwd = 3 ms per op at any size: the least total over splits of 8 is one op.
    table = min_compute_table(CostModel(uniform_profile(layers=2)), 8)
    assert table[0, 1] == 3.0 and table[0, 2] == 6.0


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_no_plan_beats_the_bound(data: st.DataObject) -> None:
    prof: Profile = data.draw(profiles())
    plan = data.draw(plans(prof.num_layers))
    cost = CostModel(prof, b_max=plan.global_batch)
    res = simulate(plan, cost)
    if res.deadlock:
        return
    assert res.iteration_ms is not None
    bound = lower_bound(cost, _space(plan.num_stages, plan.global_batch))
    assert bound <= res.iteration_ms * (1 + 1e-9)


@pytest.mark.parametrize("stages", [1, 2, 3])
def test_bound_is_tight_for_one_microbatch_at_any_depth(stages: int) -> None:
    # Constant-time layers: one microbatch through all three layers and back (6 ms) is optimal
    # however the layers are split; the head and tail terms make the bound see that.
    cost = CostModel(uniform_profile(layers=3, fwd=1.0, bwd=1.0))
    cuts = [0, *range(1, stages), 3]
    assert lower_bound(cost, _space(stages, 4)) == 6.0
    assert simulate(uniform_plan(cuts, 4, 1, "gpipe"), cost).iteration_ms == 6.0
