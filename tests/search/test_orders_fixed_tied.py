"""The order generator counts docs/model.md 5's last version 2.3 terms (the stash's fixed part per microbatch, a
tied weight once per rank) exactly as the evaluator does."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.search.helpers import rules_st
from tests.search.test_orders import handing_genomes, memory_profiles
from tests.sim.test_memory import fixed_and_tied
from umsearch.core.cost import CostModel
from umsearch.search.genome import Rules
from umsearch.search.orders import generate, pack_genomes
from umsearch.sim.population import evaluate, pack


@settings(max_examples=120, deadline=None)
@given(rules_st(max_layers=8, max_batch=12), st.data())
def test_generated_memory_is_the_evaluator_s_with_fixed_parts_and_ties(rules: Rules, data: st.DataObject) -> None:
    profile = data.draw(fixed_and_tied(data.draw(memory_profiles(rules.num_layers))))
    population = data.draw(st.lists(handing_genomes(rules), min_size=1, max_size=4))
    tables = CostModel(profile).tables(rules.largest)
    gen = generate(pack_genomes(population, rules), tables, data.draw(st.sampled_from([math.inf, 1e4, 1e7])))
    ev = evaluate(pack([gen.array_plan(g, rules, c) for c, g in enumerate(population)]), tables)
    assert not ev.deadlock.any()
    np.testing.assert_allclose(ev.peak_memory_bytes, gen.peak_memory_bytes, rtol=1e-9)
    np.testing.assert_allclose(ev.iteration_ms, gen.iteration_ms, rtol=1e-9)
