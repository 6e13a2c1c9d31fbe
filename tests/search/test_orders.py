"""The order generator: valid lists, never a deadlock, and exactly the evaluator's numbers."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.search.helpers import assert_plan_obeys, genomes, rules_st
from tests.strategies import profiles, uniform_profile
from umsearch.core.cluster import Cluster
from umsearch.core.cost import CostModel
from umsearch.core.plan import equal_split
from umsearch.core.profile import Link, Profile
from umsearch.core.schedules import one_f_one_b
from umsearch.search.genome import Genome, Rules, genome_of
from umsearch.search.orders import generate, pack_genomes
from umsearch.sim.population import decode, evaluate, pack, stage_memory
from umsearch.sim.reference import simulate


@st.composite
def memory_profiles(draw: st.DrawFn, num_layers: int) -> Profile:
    """:func:`tests.strategies.profiles` of ``num_layers`` layers, with or without docs/model.md 5's version 2.3
    fields (each layer's drawn or left out)."""
    base = draw(profiles(min_layers=num_layers, max_layers=num_layers, split=True))
    if draw(st.booleans()):
        return base
    share = st.none() | st.floats(0, 1)  # None: the field left out
    layers = []
    for i, x in enumerate(base.layers):
        shared, kept, weight = draw(share), draw(share), draw(share)
        layers.append(replace(
            x, boundary_shared_bytes=shared * x.stash_bytes if i and shared is not None else 0.0,
            input_saved_bytes=None if kept is None else kept * x.stash_bytes,
            weight_stash_bytes=None if weight is None else weight * x.stash_bytes))  # fmt: skip
    return replace(base, layers=tuple(layers))


@st.composite
def handing_genomes(draw: st.DrawFn, rules: Rules) -> Genome:
    """:func:`tests.search.helpers.genomes`, where a stage that does not recompute often takes the forward
    list of the stage before: on a shared rank (a V's turn, one rank) it is then handed that stage's output."""
    g = draw(genomes(rules))
    fwd, bwd = list(g.forward), list(g.backward)
    for j in range(1, len(fwd)):
        if not g.recompute[j] and draw(st.booleans()):
            fwd[j] = bwd[j] = fwd[j - 1]
    return replace(g, forward=tuple(fwd), backward=tuple(bwd))


@settings(max_examples=250, deadline=None)
@given(rules_st(max_layers=8, max_batch=12), st.data())
def test_generated_lists_are_valid_and_timed_exactly(rules: Rules, data: st.DataObject) -> None:
    profile = data.draw(memory_profiles(rules.num_layers))
    population = data.draw(st.lists(handing_genomes(rules), min_size=1, max_size=4))
    tables = CostModel(profile).tables(rules.largest)
    limit = data.draw(st.sampled_from([math.inf, 1e4, 1e7]))
    packed = pack_genomes(population, rules)
    gen = generate(packed, tables, limit)
    plans = [gen.array_plan(g, rules, c) for c, g in enumerate(population)]
    ev = evaluate(pack(plans), tables)
    assert not ev.deadlock.any()
    np.testing.assert_allclose(ev.iteration_ms, gen.iteration_ms, rtol=1e-9)
    np.testing.assert_allclose(ev.peak_memory_bytes, gen.peak_memory_bytes, rtol=1e-9)
    np.testing.assert_allclose(ev.busy_ms, gen.busy_ms, rtol=1e-9)
    np.testing.assert_array_equal(stage_memory(packed, tables), stage_memory(pack(plans), tables))
    for ap in plans:
        assert_plan_obeys(decode(ap), rules)


@settings(max_examples=120, deadline=None)
@given(rules_st(max_layers=8, max_batch=12), st.data())
def test_generated_candidates_pack_as_their_plans_do(rules: Rules, data: st.DataObject) -> None:
    """A cluster search's candidates go to the evaluator packed straight from the generator's arrays: the very
    arrays :func:`pack` makes of their array plans, with or without a cluster, both layouts, ZeRO-1."""
    population = data.draw(st.lists(handing_genomes(rules), min_size=1, max_size=4))
    gen = generate(pack_genomes(population, rules), CostModel(uniform_profile(rules.num_layers)).tables(rules.largest),
                   math.inf)  # fmt: skip
    link = Link(latency_ms=0.01, bandwidth_gb_per_s=data.draw(st.sampled_from([25.0, 300.0])))
    cluster = data.draw(st.sampled_from([None, Cluster(gpus_per_node=data.draw(st.sampled_from([1, 2, 4])),
                                                       intra=link, inter=replace(link, latency_ms=0.02))]))  # fmt: skip
    fields = {"batch": rules.batch * 2, "replicas": data.draw(st.sampled_from([1, 2, 3])), "cluster": cluster,
              "layout": data.draw(st.sampled_from(["dp_inner", "pp_inner"])), "zero1": data.draw(st.booleans())}  # fmt: skip
    want = pack([gen.array_plan(g, rules, c, **fields) for c, g in enumerate(population)])
    got = gen.packed_plans(rules.ranks, **fields)
    for f in dataclasses.fields(want):
        np.testing.assert_array_equal(getattr(got, f.name), getattr(want, f.name), err_msg=f.name)


@pytest.mark.slow  # compiles the kept generator (about 20 s)
@settings(max_examples=200, deadline=None)
@given(rules_st(max_layers=8, max_batch=12), st.data())
def test_the_generator_writes_what_the_one_before_its_tables_did(rules: Rules, data: st.DataObject) -> None:
    """Issue 37: the generator on the evaluator's tables writes, times and weighs bit for bit what it did
    before them (kept in benchmarks/evaluator.py): the same lists, times, memory and relaxations, at limits
    from none to ones that hold most forwards back, with fixed stashes or without."""
    from benchmarks.evaluator import GENERATED, old_generate

    profile = data.draw(memory_profiles(rules.num_layers))
    fixed = st.sampled_from([0.0]) | st.floats(0, 50)
    profile = replace(profile, layers=tuple(replace(x, stash_fixed_bytes=data.draw(fixed)) for x in profile.layers))
    population = data.draw(st.lists(handing_genomes(rules), min_size=1, max_size=4))
    tables = CostModel(profile, state_factor=data.draw(st.sampled_from([1.0, 4.0]))).tables(rules.largest)
    limit = data.draw(st.sampled_from([math.inf, 1e4, 1e7]) | st.floats(0, 1e5))
    packed = pack_genomes(population, rules)
    new, old = generate(packed, tables, limit), old_generate(packed, tables, limit)
    for field in GENERATED:
        np.testing.assert_array_equal(getattr(new, field), getattr(old, field), err_msg=field)


@pytest.mark.parametrize(("second", "held"), [((1, 1), 10 + 6), ((2,), 10 + 10)])
def test_a_boundary_handed_on_is_counted_once(second: tuple[int, ...], held: int) -> None:
    """docs/model.md 5 (version 2.3): one rank, two stages; the second layer saves 4 of the 10 bytes per
    sample the first one saved. Forwards first, both samples in flight. With one forward list the first
    stage hands its output on and the storage is counted once (10 + 6 per sample); with another list the
    second stage's input is a new storage (10 + 10), as the reference simulator counts."""
    M = 2
    rules = Rules(num_layers=2, ranks=1, batch=M, sizes=(1, 2), max_count=M, stages_per_rank=(2,),
                  placements=("loop",), split=False, recompute=False)  # fmt: skip
    g = genome_of(rules, 2, "loop", (0, 1, 2), [(1, 1), second])
    g = replace(g, rank_cap=(2 * M,), policy=(3,))
    base = uniform_profile(2)
    profile = replace(base, layers=(base.layers[0], replace(base.layers[1], boundary_shared_bytes=4.0)))
    cost = CostModel(profile)
    gen = generate(pack_genomes([g], rules), cost.tables(M), math.inf)
    assert gen.peak_memory_bytes[0] == 4 * 200 + M * held
    assert simulate(decode(gen.array_plan(g, rules, 0)), cost).peak_memory_bytes == (gen.peak_memory_bytes[0],)


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
