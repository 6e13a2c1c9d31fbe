"""The order generator: valid lists, never a deadlock, and exactly the evaluator's numbers."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.search.helpers import assert_plan_obeys, genomes, rules_st
from tests.strategies import profiles, uniform_profile
from umsearch.core.cost import CostModel
from umsearch.core.plan import equal_split
from umsearch.core.schedules import one_f_one_b
from umsearch.search.genome import Rules, genome_of
from umsearch.search.orders import generate, pack_genomes
from umsearch.sim.batch import decode, evaluate, pack
from umsearch.sim.reference import simulate


@settings(max_examples=250, deadline=None)
@given(rules_st(max_layers=8, max_batch=12), st.data())
def test_generated_lists_are_valid_and_timed_exactly(rules: Rules, data: st.DataObject) -> None:
    profile = data.draw(profiles(min_layers=rules.num_layers, max_layers=rules.num_layers, split=True))
    population = data.draw(st.lists(genomes(rules), min_size=1, max_size=4))
    tables = CostModel(profile).tables(rules.largest)
    limit = data.draw(st.sampled_from([math.inf, 1e4, 1e7]))
    gen = generate(pack_genomes(population, rules), tables, limit)
    plans = [gen.array_plan(g, rules, c) for c, g in enumerate(population)]
    ev = evaluate(pack(plans), tables)
    assert not ev.deadlock.any()
    np.testing.assert_allclose(ev.iteration_ms, gen.iteration_ms, rtol=1e-9)
    np.testing.assert_allclose(ev.peak_memory_bytes, gen.peak_memory_bytes, rtol=1e-9)
    np.testing.assert_allclose(ev.busy_ms, gen.busy_ms, rtol=1e-9)
    for ap in plans:
        assert_plan_obeys(decode(ap), rules)


def test_one_stage_per_rank_with_1f1b_caps_is_1f1b() -> None:
    """Equal microbatches, one stage per rank, caps of R - r microbatches, backwards first: the
    generator's lists are torch's 1F1B (and so the time is the closed form)."""
    R, M = 4, 8
    rules = Rules(num_layers=R, ranks=R, batch=M, sizes=(1,), max_count=M, stages_per_rank=(1,),
                  placements=("loop",), split=False, recompute=False)  # fmt: skip
    g = genome_of(rules, 1, "loop", tuple(range(R + 1)), [equal_split(M, M)] * R)
    profile = uniform_profile(R)
    gen = generate(pack_genomes([g], rules), CostModel(profile).tables(1), math.inf)
    plan = decode(gen.array_plan(g, rules, 0))
    assert plan.actions == one_f_one_b(R, M)
    assert gen.iteration_ms[0] == (M + R - 1) * 3.0
    assert simulate(plan, CostModel(profile)).iteration_ms == gen.iteration_ms[0]


def test_memory_limit_holds_forwards_back() -> None:
    """Under a tight limit the generator keeps fewer samples in flight (and never deadlocks)."""
    R, M = 2, 8
    rules = Rules(num_layers=2, ranks=R, batch=M, sizes=(1,), max_count=M, stages_per_rank=(1,),
                  placements=("loop",), split=False, recompute=False)  # fmt: skip
    g = genome_of(rules, 1, "loop", (0, 1, 2), [equal_split(M, M)] * R)
    g = replace(g, rank_cap=(M, M), policy=(3, 3))  # forwards first, no cap: GPipe without a memory limit
    tables = CostModel(uniform_profile(2)).tables(1)
    free = generate(pack_genomes([g], rules), tables, math.inf)
    tight = generate(pack_genomes([g], rules), tables, 4 * 100 + 10 * 3)
    assert free.peak_memory_bytes[0] == 4 * 100 + 10 * M
    assert tight.peak_memory_bytes[0] <= 4 * 100 + 10 * 3
    assert math.isfinite(tight.iteration_ms[0])
