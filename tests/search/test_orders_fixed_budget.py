"""The order generator's memory budget admits a forward by all it adds (docs/model.md 5, version 2.3): the
stash per sample and the stage's fixed part."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.search.helpers import genomes, rules_st
from tests.strategies import profiles
from umsearch.core.cost import CostModel
from umsearch.core.profile import Profile
from umsearch.search.genome import Rules
from umsearch.search.orders import generate, pack_genomes


def _folded(profile: Profile) -> Profile:
    """``profile`` with each layer's fixed stash moved into its stash per sample (and into what its weight
    gradient keeps, so ``I`` frees the same): the same bytes where every microbatch holds one sample."""
    return replace(profile, layers=tuple(
        replace(x, stash_bytes=x.stash_bytes + x.stash_fixed_bytes, stash_fixed_bytes=0.0,
                weight_stash_bytes=None if x.weight_stash_bytes is None else x.weight_stash_bytes + x.stash_fixed_bytes)
        for x in profile.layers))  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(rules_st(max_layers=6, max_batch=8), st.data())
def test_a_fixed_stash_binds_as_the_same_bytes_per_sample_do(rules: Rules, data: st.DataObject) -> None:
    """Microbatches of one sample: a fixed stash of c bytes and c more bytes of stash per sample are the same
    memory, so the generator writes the same lists and peaks (whole bytes, so every sum is exact)."""
    rules = replace(rules, sizes=(1,), max_count=rules.batch)
    base = data.draw(profiles(min_layers=rules.num_layers, max_layers=rules.num_layers, split=True))
    whole = st.integers(0, 1000).map(float)
    layers = []
    for x in base.layers:
        stash = data.draw(whole)
        weight = data.draw(st.none() | st.integers(0, int(stash)).map(float))
        layers.append(replace(x, stash_bytes=stash, param_bytes=data.draw(whole), stash_fixed_bytes=data.draw(whole),
                              weight_stash_bytes=weight, boundary_shared_bytes=0.0, input_saved_bytes=None))  # fmt: skip
    fixed = replace(base, layers=tuple(layers))
    population = data.draw(st.lists(genomes(rules), min_size=1, max_size=4))
    limit = data.draw(st.sampled_from([math.inf]) | st.integers(0, 40_000).map(float))
    packed = pack_genomes(population, rules)
    a = generate(packed, CostModel(fixed, state_factor=1.0).tables(1), limit)
    b = generate(packed, CostModel(_folded(fixed), state_factor=1.0).tables(1), limit)
    np.testing.assert_array_equal(a.act, b.act)
    np.testing.assert_array_equal(a.peak_memory_bytes, b.peak_memory_bytes)
    np.testing.assert_array_equal(a.iteration_ms, b.iteration_ms)
