"""The lower bound: never above any plan of the space (hypothesis), exact on closed forms."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.contract import EXAMPLE3, EXAMPLE4, example1, unit_profile
from tests.sim.test_memory import fixed_and_tied
from tests.strategies import dp_plans, plans, profiles
from umsearch.core.cost import CostModel
from umsearch.core.plan import Plan
from umsearch.core.profile import TiedWeight
from umsearch.search.bound import lower_bound, max_sizes, min_split, whole_param_bytes
from umsearch.search.factorize import ClusterPlacement, Factorization
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


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_never_above_any_plan_that_fits(data: st.DataObject) -> None:
    """Under a memory limit (the plan's own peak, or a little above) the memory-aware bound stays below
    the plan's time, with every stage-count and split assumption the plain bound makes."""
    profile = data.draw(profiles(split=True))
    plan = data.draw(plans(profile.num_layers))
    cost = CostModel(profile, state_factor=data.draw(st.sampled_from([1.0, 2.0, 4.0])))
    res = simulate(plan, cost)
    if res.iteration_ms is None or res.peak_memory_bytes is None:
        return
    limit = max(res.peak_memory_bytes) * data.draw(st.sampled_from([1.0, 1.0 + 1e-12, 1.1, 2.0]))
    one_stage = plan.num_stages == plan.ranks and data.draw(st.booleans())
    split = any(plan.uses_split) or data.draw(st.booleans())
    rules = replace(_rules_for(plan, split, one_stage), memory_limit=limit)
    bound = lower_bound(cost.tables(plan.global_batch), rules)
    assert bound <= res.iteration_ms * (1 + 1e-9)
    assert bound >= lower_bound(cost.tables(plan.global_batch), replace(rules, memory_limit=math.inf))


def test_memory_raises_the_bound_and_nothing_fits_below_a_layer() -> None:
    """Unit layers with a stash of 1 byte a sample: a limit of 2 bytes allows microbatches of at most 2
    samples, which costs more actions than one microbatch of 4; below one layer's state, no plan fits."""
    profile = unit_profile(4)
    cost = CostModel(profile, state_factor=0.0)
    tables = cost.tables(4)
    rules = Rules(num_layers=4, ranks=1, batch=4, sizes=(1, 2, 3, 4), max_count=4, stages_per_rank=(1,),
                  placements=("loop",), split=False, recompute=True)  # fmt: skip
    stash = np.diff(tables.stash_prefix)
    free = lower_bound(tables, rules)
    tight = lower_bound(tables, replace(rules, memory_limit=float(2 * stash.max())))
    assert max_sizes(tables, float(2 * stash.max())).max() == 2
    assert tight > free
    assert lower_bound(tables, replace(rules, memory_limit=float(stash.max()) / 2)) == math.inf


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_never_above_any_data_parallel_plan_that_fits(data: st.DataObject) -> None:
    """On a cluster, one replica's bound under the factorization's tables (the cheaper link, ZeRO-1's
    sharded state) stays below every data-parallel plan that fits."""
    profile = data.draw(profiles(split=True))
    plan = data.draw(dp_plans(profile.num_layers))
    if plan.cluster is None:
        return
    cost = CostModel(profile, state_factor=data.draw(st.sampled_from([2.0, 4.0])))
    res = simulate(plan, cost)
    if res.iteration_ms is None or res.peak_memory_bytes is None:
        return
    D = plan.data_parallel
    f = Factorization(ranks=plan.ranks, replicas=D, layout=plan.layout, zero1=plan.zero1)
    where = ClusterPlacement(factorization=f, cluster=plan.cluster, batch=plan.global_batch)
    replica = dataclasses.replace(plan, global_batch=plan.global_batch // D, data_parallel=1, cluster=None, zero1=False)
    rules = replace(_rules_for(replica, any(plan.uses_split) or data.draw(st.booleans()), False),
                    memory_limit=max(res.peak_memory_bytes))  # fmt: skip
    bound = lower_bound(where.bound_tables(cost.tables(replica.global_batch)), rules)
    assert bound <= res.iteration_ms * (1 + 1e-9)


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_never_above_any_plan_that_fits_with_fixed_parts_and_ties(data: st.DataObject) -> None:
    """Version 2.3's terms (a fixed stash per microbatch, weights tied between layers) keep the memory-aware
    bound below every plan that fits, one rank (a tied weight held once) included."""
    profile = data.draw(fixed_and_tied(data.draw(profiles(split=True))))
    plan = data.draw(plans(profile.num_layers, max_ranks=data.draw(st.sampled_from([1, 2, 4]))))
    cost = CostModel(profile, state_factor=data.draw(st.sampled_from([1.0, 2.0, 4.0])))
    res = simulate(plan, cost)
    if res.iteration_ms is None or res.peak_memory_bytes is None:
        return
    limit = max(res.peak_memory_bytes) * data.draw(st.sampled_from([1.0, 1.0 + 1e-12, 1.1]))
    one_stage = plan.num_stages == plan.ranks and data.draw(st.booleans())
    rules = replace(_rules_for(plan, any(plan.uses_split) or data.draw(st.booleans()), one_stage), memory_limit=limit)
    assert lower_bound(cost.tables(plan.global_batch), rules) <= res.iteration_ms * (1 + 1e-9)


def test_one_rank_holds_a_tied_weight_once_and_every_fixed_stash() -> None:
    """Unit layers (params 100, stash 10 a sample), layers 0 and 3 tying 40 bytes, layer 1 saving 5 bytes per
    microbatch: one rank holds 400 - 40 parameter bytes, so under 360 + 40 bytes each layer fits 4 samples,
    layer 1 (its fixed 5 resident too) 3."""
    base = unit_profile(4)
    layers = tuple(dataclasses.replace(x, stash_fixed_bytes=5.0 if i == 1 else 0.0) for i, x in enumerate(base.layers))
    profile = dataclasses.replace(base, layers=layers, tied_weights=(TiedWeight(layers=(0, 3), bytes=40.0),))
    tables = CostModel(profile, state_factor=1.0).tables(4)
    assert whole_param_bytes(tables) == 360.0
    assert max_sizes(tables, 400.0, whole=True).tolist() == [4.0, 3.0, 4.0, 4.0]
    assert max_sizes(tables, 140.0).tolist() == [4.0, 3.0, 4.0, 4.0]  # one layer's own 100 bytes on a rank


def test_layers_whose_stash_cannot_stay_pay_a_recomputation() -> None:
    """Fact 4 on unit layers (a microbatch of 1-4 samples takes F = 1, B = 2; stash 10 bytes a sample; no state)
    on one rank, B = 4. The stashes held at once (every kept layer's microbatch holding one sample) fit the
    limit: under 20 bytes one layer keeps microbatches of 2 (6 ms) and three recompute (a forward of 4 and
    microbatches of 2: 7 ms each), 27 ms, where microbatches of 2 everywhere would be 24; under 40 bytes one
    layer keeps a microbatch of 4 (3 ms) and three recompute (4 ms each), 15; under 10 one layer keeps single
    samples (12 ms), three recompute single ones (13 ms each), 51. Without recomputation every layer keeps
    single samples under 40 bytes (48 ms), and nothing fits under 20."""
    tables = CostModel(unit_profile(4, split=False), state_factor=0.0).tables(4)
    rules = Rules(num_layers=4, ranks=1, batch=4, sizes=(1, 2), max_count=4, stages_per_rank=(1, 2, 4),
                  placements=("loop",), split=False, recompute=True)  # fmt: skip
    assert lower_bound(tables, rules) == 12.0
    for limit, bound in ((20.0, 27.0), (40.0, 15.0), (10.0, 51.0)):
        assert lower_bound(tables, replace(rules, memory_limit=limit)) == pytest.approx(bound, rel=1e-8)
    assert lower_bound(tables, replace(rules, memory_limit=40.0, recompute=False)) == pytest.approx(48.0, rel=1e-8)
    assert lower_bound(tables, replace(rules, memory_limit=20.0, recompute=False)) == math.inf
