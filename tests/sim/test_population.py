"""The compiled batch evaluator equals the reference simulator on every plan, deadlocks included."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.strategies import dp_plans, partitions, plans, profiles
from umsearch.core.cost import CostModel
from umsearch.core.plan import Plan
from umsearch.core.samples import spans
from umsearch.sim.action_rows import _producers
from umsearch.sim.population import BatchResult, decode, encode, evaluate, pack
from umsearch.sim.reference import simulate
from umsearch.sim.result import SimResult


def _agree(population: list[Plan], cost: CostModel) -> None:
    fast = evaluate(pack([encode(p) for p in population]), cost.tables(max(p.global_batch for p in population)))
    for c, plan in enumerate(population):
        ref = simulate(plan, cost)
        assert bool(fast.deadlock[c]) == ref.deadlock
        if ref.deadlock:
            assert math.isinf(fast.iteration_ms[c]) and math.isinf(fast.max_memory_bytes[c])
            continue
        assert ref.iteration_ms is not None and ref.busy_ms is not None and ref.peak_memory_bytes is not None
        assert math.isclose(fast.iteration_ms[c], ref.iteration_ms, rel_tol=1e-9, abs_tol=1e-12)
        np.testing.assert_allclose(fast.ranks_of(c, fast.peak_memory_bytes), ref.peak_memory_bytes, rtol=1e-9)
        np.testing.assert_allclose(fast.ranks_of(c, fast.busy_ms), ref.busy_ms, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(fast.ranks_of(c, fast.rank_end_ms), ref.rank_end_ms, rtol=1e-9, atol=1e-12)
        assert math.isclose(fast.max_memory_bytes[c], max(ref.peak_memory_bytes), rel_tol=1e-9)
        assert ref.compute_end_ms is not None
        assert math.isclose(fast.compute_end_ms[c], ref.compute_end_ms, rel_tol=1e-9, abs_tol=1e-12)
        _agree_allreduces(fast, c, ref)


def _agree_allreduces(fast: BatchResult, c: int, ref: SimResult) -> None:
    """Section 9's all-reduces: the same per stage (ready, start, end) and the same latest end."""
    if not ref.allreduces:
        assert ref.allreduce_end_ms is None and fast.allreduce_end_ms[c] == 0.0
        return
    assert ref.allreduce_end_ms is not None
    assert math.isclose(fast.allreduce_end_ms[c], ref.allreduce_end_ms, rel_tol=1e-9, abs_tol=1e-12)
    rows = fast.stages_of(c, fast.allreduce_span_ms)
    want = [(s.ready_ms, s.start_ms, s.end_ms) for s in ref.allreduces]
    np.testing.assert_allclose(rows, want, rtol=1e-9, atol=1e-12)


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_matches_reference(data: st.DataObject) -> None:
    """Random placements, unequal lists, recompute, I/W splits, overheads and any valid order."""
    profile = data.draw(profiles(split=True))
    population = data.draw(st.lists(plans(profile.num_layers), min_size=1, max_size=4))
    _agree(population, CostModel(profile, state_factor=data.draw(st.floats(1, 8))))


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_matches_reference_with_replicas(data: st.DataObject) -> None:
    """docs/model.md section 9: replicas, clusters of any node width, both layouts, zero1, and plans
    without replicas in the same population."""
    profile = data.draw(profiles(split=True))
    population = data.draw(st.lists(dp_plans(profile.num_layers), min_size=1, max_size=4))
    _agree(population, CostModel(profile, state_factor=data.draw(st.floats(1, 8))))


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_array_round_trip(data: st.DataObject) -> None:
    plan = data.draw(plans(data.draw(st.integers(1, 8))))
    assert decode(encode(plan)) == plan
    replicated = data.draw(dp_plans(data.draw(st.integers(1, 8))))
    assert decode(encode(replicated)) == replicated


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_splitting_nothing_changes_nothing(data: st.DataObject) -> None:
    """One stage, one microbatch: exactly F(B) + G(B) (+ F(B) when recomputing)."""
    from umsearch.core.actions import Action
    from umsearch.core.plan import Stage

    profile = data.draw(profiles(overheads=False))
    B = data.draw(st.integers(1, 40))
    rec = data.draw(st.booleans())
    L = profile.num_layers
    plan = Plan(global_batch=B, ranks=1, stages=(Stage(layers=(0, L), rank=0, forward=(B,), backward=(B,), recompute=rec),),
                actions=((Action(0, "F", 0), Action(0, "B", 0)),))  # fmt: skip
    cost = CostModel(profile)
    f, g = cost.time_ms("fwd", 0, L, B), cost.time_ms("bwd", 0, L, B)
    expect = f + g + (f if rec else 0.0)
    assert math.isclose(simulate(plan, cost).iteration_ms or -1, expect, rel_tol=1e-12)
    assert math.isclose(evaluate(pack([encode(plan)]), cost.tables(B)).iteration_ms[0], expect, rel_tol=1e-12)


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_producers_are_the_spans(data: st.DataObject) -> None:
    """The evaluator's producer ranges (a running count per sample where microbatches are many for their
    samples, a merge where few) are :func:`umsearch.core.samples.spans`, with the producers' samples; a
    second sender list equal to the first (a stage's backward list that is its forward one) reads the
    first one's map, an unequal one maps its own."""
    batch = data.draw(st.integers(1, 200))
    lists = st.sampled_from([2, 8, 64]).flatmap(lambda most: partitions(batch, max_parts=most))
    sender, receiver, other = data.draw(lists), data.draw(lists), data.draw(lists)
    second = sender if data.draw(st.booleans()) else data.draw(lists)
    pairs = [(sender, receiver), (second, other)]
    sizes = np.array([0, *(v for pair in pairs for part in pair for v in part)], dtype=np.int64)  # slot 0: absolute slots
    offset = np.array([0, *(x for pair in pairs for part in pair for x in np.cumsum([0, *part[:-1]]))], dtype=np.int64)
    first, last, samples = (np.full(sizes.shape[0], -1, dtype=np.int64) for _ in range(3))
    owner, held, at = np.empty(batch, dtype=np.int64), (-1, -1), 1
    for snd, rcv in pairs:
        sb, rb = at, at + len(snd)
        held = _producers(sizes, offset, sb, rb, rb, rb + len(rcv), owner, *held, first, last, samples)
        for q, want in enumerate(spans(snd, rcv)):
            assert (first[rb + q] - sb, last[rb + q] - sb) == (want[0], want[-1])
            assert samples[rb + q] == sum(snd[m] for m in want)
        at = rb + len(rcv)
