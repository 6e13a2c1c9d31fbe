"""docs/model.md section 5 (version 2.3): the compiled evaluator equals the reference on profiles carrying the
per-layer memory fields and on plans that hand boundaries on; the rule's own properties."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.strategies import partitions, plan_shapes, profiles, random_orders
from umsearch.core.cost import CostModel
from umsearch.core.plan import Plan, Stage
from umsearch.core.profile import Profile, TiedWeight
from umsearch.sim.population import encode, evaluate, pack, stage_memory
from umsearch.sim.reference import hand_offs, rank_state_bytes, simulate


@st.composite
def fixed_and_tied(draw: st.DrawFn, base: Profile) -> Profile:
    """``base`` with version 2.3's fixed stash per microbatch (each layer's drawn or left out) and up to two tied
    weights, each shared by two or three layers and within what their parameters hold."""
    layers = tuple(dataclasses.replace(x, stash_fixed_bytes=draw(st.just(0.0) | st.floats(0, 1e4)))
                   for x in base.layers)  # fmt: skip
    room = [x.param_bytes for x in layers]
    ties = []
    for _ in range(draw(st.integers(0, 2)) if len(layers) > 1 else 0):
        held = tuple(sorted(draw(st.sets(st.integers(0, len(layers) - 1), min_size=2, max_size=3))))
        size = draw(st.floats(0, 1)) * min(room[i] for i in held)
        room = [r - size if i in held else r for i, r in enumerate(room)]
        ties.append(TiedWeight(layers=held, bytes=size))
    return dataclasses.replace(base, layers=layers, tied_weights=tuple(ties))


@st.composite
def memory_profiles(draw: st.DrawFn) -> Profile:
    """:func:`tests.strategies.profiles` with version 2.3's fields, each layer's drawn or left out, and often
    :func:`fixed_and_tied`'s."""
    base = draw(profiles(split=True))
    if draw(st.booleans()):
        base = draw(fixed_and_tied(base))
    layers = []
    share = st.none() | st.floats(0, 1)  # None: the field left out
    for i, x in enumerate(base.layers):
        shared, kept, weight = draw(share), draw(share), draw(share)
        layers.append(dataclasses.replace(
            x, boundary_shared_bytes=shared * x.stash_bytes if i and shared is not None else 0.0,
            input_saved_bytes=None if kept is None else kept * x.stash_bytes,
            weight_stash_bytes=None if weight is None else weight * x.stash_bytes))  # fmt: skip
    return dataclasses.replace(base, layers=tuple(layers))


@st.composite
def handing_plans(draw: st.DrawFn, num_layers: int, max_batch: int = 10, max_ranks: int = 3) -> Plan:
    """Random valid plans where neighbouring stages often share a rank and a forward list (so they hand
    boundaries on), with recompute and I/W splits drawn per stage and microbatch."""
    R, S, placement, cuts, B = draw(plan_shapes(num_layers, max_batch, max_ranks))
    common = draw(partitions(B))
    stages = []
    for j in range(S):
        fwd = common if draw(st.integers(0, 3)) else draw(partitions(B))
        rec = draw(st.integers(0, 3)) == 0
        stages.append(Stage(layers=(cuts[j], cuts[j + 1]), rank=placement[j], forward=fwd,
                            backward=draw(partitions(B)) if rec else fwd, recompute=rec))  # fmt: skip
    cut = [[draw(st.booleans()) for _ in s.backward] for s in stages]
    orders = random_orders(stages, R, cut, random.Random(draw(st.integers(0, 2**32))), causal=True)
    return Plan(global_batch=B, ranks=R, stages=tuple(stages), actions=orders)


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_the_evaluator_equals_the_reference_with_the_v23_fields(data: st.DataObject) -> None:
    profile = data.draw(memory_profiles())
    population = data.draw(st.lists(handing_plans(profile.num_layers), min_size=1, max_size=4))
    cost = CostModel(profile, state_factor=data.draw(st.floats(1, 8)))
    fast = evaluate(pack([encode(p) for p in population]), cost.tables(max(p.global_batch for p in population)))
    for c, plan in enumerate(population):
        ref = simulate(plan, cost)
        assert bool(fast.deadlock[c]) == ref.deadlock
        if not ref.deadlock:
            assert ref.peak_memory_bytes is not None
            np.testing.assert_allclose(fast.ranks_of(c, fast.peak_memory_bytes), ref.peak_memory_bytes, rtol=1e-9)


@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_the_terms_are_sizes_a_stage_holds(data: st.DataObject) -> None:
    """Per stage: 0 <= freed <= stash <= the plain sum of its layers' stash, kept <= stash of its first layer,
    and every list releases exactly what it added."""
    profile = data.draw(memory_profiles())
    plan = data.draw(handing_plans(profile.num_layers))
    cost = CostModel(profile)
    handed = hand_offs(plan)
    for j, st_ in enumerate(plan.stages):
        stash, inp, kept, freed = cost.stage_memory(st_.lo, st_.hi, st_.recompute, j > 0 and handed[j - 1], handed[j])
        plain = sum(x.stash_bytes for x in profile.layers[st_.lo:st_.hi])
        assert -1e-6 <= freed <= stash + 1e-6 and stash <= plain * (1 + 1e-12) + 1e-9
        assert 0 <= kept <= profile.layers[st_.lo].stash_bytes and inp >= 0
    for r in range(plan.ranks):
        level = 0.0
        for a in plan.actions[r]:
            st_ = plan.stages[a.stage]
            n = a.size(st_.forward, st_.backward)
            sizes = cost.microbatch_memory(st_.lo, st_.hi, st_.recompute, a.stage > 0 and handed[a.stage - 1],
                                           handed[a.stage], n)  # fmt: skip
            add, rel = a.memory(st_.recompute, *sizes)
            level += add - rel
        held = sum(x.stash_bytes * 20 + x.stash_fixed_bytes * 20 for x in profile.layers)
        assert level == pytest.approx(0.0, abs=1e-6 * max(1.0, held))


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_without_the_v23_fields_memory_is_version_2_2(data: st.DataObject) -> None:
    """A profile that leaves the fields out: section 5's 2.2 table on the plain sum of stash_bytes."""
    profile = data.draw(profiles(split=True))
    plan = data.draw(handing_plans(profile.num_layers))
    cost = CostModel(profile)
    for st_ in plan.stages:
        stash, inp, kept, freed = cost.stage_memory(st_.lo, st_.hi, st_.recompute, True, True)
        assert stash == pytest.approx(sum(x.stash_bytes for x in profile.layers[st_.lo:st_.hi]), rel=1e-12, abs=1e-9)
        assert kept == 0.0 and freed == 0.0
        assert inp == (profile.input_bytes if st_.lo == 0 else profile.layers[st_.lo - 1].out_bytes)


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_a_rank_holds_each_tied_weight_once(data: st.DataObject) -> None:
    """Section 5's state: the rank's P less ``(m - 1) * bytes`` per tied weight of which it holds m >= 1 layers,
    in the reference and, stage by stage, in the evaluator's terms (whatever the other candidates are)."""
    profile = data.draw(fixed_and_tied(data.draw(profiles(split=True))))
    population = data.draw(st.lists(handing_plans(profile.num_layers), min_size=1, max_size=3))
    cost = CostModel(profile, state_factor=data.draw(st.floats(1, 8)))
    held_params = stage_memory(pack([encode(p) for p in population]), cost.tables(1))[:, 5]
    first = 0
    for plan in population:
        for r in range(plan.ranks):
            layers = {i for j in plan.stages_of(r) for i in range(plan.stages[j].lo, plan.stages[j].hi)}
            twice = sum((len(layers & set(t.layers)) - 1) * t.bytes for t in profile.tied_weights
                        if layers & set(t.layers))  # fmt: skip
            want = sum(profile.layers[i].param_bytes for i in layers) - twice
            assert rank_state_bytes(plan, cost, r) == pytest.approx(cost.state_factor * want, rel=1e-9, abs=1e-6)
            assert sum(held_params[first + j] for j in plan.stages_of(r)) == pytest.approx(want, rel=1e-9, abs=1e-6)
        first += plan.num_stages
