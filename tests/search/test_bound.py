"""The lower bound: never above any plan of the space (hypothesis), exact on closed forms."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.contract import EXAMPLE3, EXAMPLE4, example1, unit_profile
from tests.strategies import plans, profiles
from umsearch.core.cost import CostModel
from umsearch.core.plan import Plan
from umsearch.search.bound import lower_bound, min_split
from umsearch.search.genome import Rules
from umsearch.sim.reference import simulate


def _rules_for(plan: Plan, split: bool, one_stage: bool) -> Rules:
    B = plan.global_batch
    return Rules(num_layers=plan.num_layers, ranks=plan.ranks, batch=B, sizes=tuple(range(1, B + 1)), max_count=B,
                 stages_per_rank=(1,) if one_stage else (1, 2, 3), placements=("loop", "vshape"), split=split,
                 recompute=True)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_never_above_any_plan(data: st.DataObject) -> None:
    profile = data.draw(profiles(split=True))
    plan = data.draw(plans(profile.num_layers))
    cost = CostModel(profile, state_factor=1.0)
    res = simulate(plan, cost)
    if res.iteration_ms is None:
        return
    one_stage = plan.num_stages == plan.ranks
    split = any(plan.uses_split) or data.draw(st.booleans())
    bound = lower_bound(cost.tables(plan.global_batch), _rules_for(plan, split, one_stage and data.draw(st.booleans())))
    assert bound <= res.iteration_ms * (1 + 1e-9)


def test_tight_on_section8_examples() -> None:
    """One microbatch per sample, unit layers: the bounds are below, and the critical path is exact
    for one microbatch."""
    for plan, t in ((example1("gpipe"), 33.0), (EXAMPLE3, 27.0), (EXAMPLE4, 25.0)):
        cost = CostModel(unit_profile(plan.num_layers))
        assert lower_bound(cost.tables(plan.global_batch), _rules_for(plan, True, False)) <= t
    single = example1("gpipe")
    cost = CostModel(unit_profile(4))
    rules = Rules(num_layers=4, ranks=4, batch=1, sizes=(1,), max_count=1, stages_per_rank=(1,),
                  placements=("loop",), split=False, recompute=False)  # fmt: skip
    assert lower_bound(cost.tables(1), rules) == 12.0  # one sample: 4 forwards + 4 backwards, nothing overlaps
    del single


def test_min_split_is_the_knapsack() -> None:
    # cost of a microbatch of size b (column 0): 1 + b; of b in column 1: b * b.
    per = np.array([[0.0, 0.0], [2.0, 1.0], [3.0, 4.0], [4.0, 9.0]])
    best = min_split(per, 6)
    assert best[0] == 8.0  # two microbatches of 3: (1 + 3) * 2
    assert best[1] == 6.0  # six of 1
    assert math.isclose(min_split(per, 5)[0], 7.0)  # 3 + 2
