"""The batch evaluator at the scale it is tuned for: long plans, many microbatches, every thread count.

``test_population.py`` holds it to the reference simulator on small plans; here the
plans have hundreds of actions, so ranks wait and resume many times, messages
queue on links and a slot reads several producers, as in the search's
populations (issue 37 item 4).
"""

from __future__ import annotations

import math
import random

import numba
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.strategies import partitions, placements, profiles, random_orders
from umsearch.core.cost import CostModel
from umsearch.core.plan import Plan, Stage
from umsearch.core.profile import Profile
from umsearch.sim.population import BatchResult, encode, evaluate, pack
from umsearch.sim.reference import simulate


@st.composite
def long_plans(draw: st.DrawFn, num_layers: int) -> Plan:
    """Valid, deadlock-free plans of 2-4 ranks, up to 2 stages per rank, a global batch of 24-48
    cut into up to 16 microbatches per list, recompute and I/W splits drawn per stage and microbatch."""
    R = draw(st.integers(2, min(4, num_layers)))
    S = draw(st.integers(R, min(num_layers, 2 * R)))
    placement = draw(placements(R, S))
    cuts = [0, *sorted(draw(st.sets(st.integers(1, num_layers - 1), min_size=S - 1, max_size=S - 1))), num_layers]
    B = draw(st.integers(24, 48))
    stages = []
    for j in range(S):
        fwd = draw(partitions(B, max_parts=16))
        rec = draw(st.booleans())
        stages.append(Stage(layers=(cuts[j], cuts[j + 1]), rank=placement[j], forward=fwd,
                            backward=draw(partitions(B, max_parts=16)) if rec else fwd, recompute=rec))  # fmt: skip
    cut = [[draw(st.booleans()) for _ in s.backward] for s in stages]
    orders = random_orders(stages, R, cut, random.Random(draw(st.integers(0, 2**32))), causal=True)
    return Plan(global_batch=B, ranks=R, stages=tuple(stages), actions=orders)


def _population(data: st.DataObject) -> tuple[Profile, list[Plan]]:
    profile = data.draw(profiles(min_layers=4, max_layers=8, split=True))
    return profile, data.draw(st.lists(long_plans(profile.num_layers), min_size=1, max_size=3))


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_long_plans_match_reference(data: st.DataObject) -> None:
    """Iteration time, per-rank busy time, end and peak memory equal the reference simulator's."""
    profile, population = _population(data)
    cost = CostModel(profile)
    fast = evaluate(pack([encode(p) for p in population]), cost.tables(max(p.global_batch for p in population)))
    for c, plan in enumerate(population):
        ref = simulate(plan, cost)
        assert not ref.deadlock and not fast.deadlock[c]
        assert ref.iteration_ms is not None and ref.busy_ms is not None and ref.peak_memory_bytes is not None
        assert math.isclose(fast.iteration_ms[c], ref.iteration_ms, rel_tol=1e-9, abs_tol=1e-12)
        np.testing.assert_allclose(fast.ranks_of(c, fast.busy_ms), ref.busy_ms, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(fast.ranks_of(c, fast.rank_end_ms), ref.rank_end_ms, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(fast.ranks_of(c, fast.peak_memory_bytes), ref.peak_memory_bytes, rtol=1e-9)


def _fields(res: BatchResult) -> list[np.ndarray]:
    return [res.iteration_ms, res.deadlock, res.max_memory_bytes, res.peak_memory_bytes, res.busy_ms,
            res.rank_end_ms, res.compute_end_ms, res.allreduce_end_ms]  # fmt: skip


@settings(max_examples=10, deadline=None)
@given(data=st.data())
def test_same_scores_on_any_thread_count(data: st.DataObject) -> None:
    """Candidates run in blocks on numba's threads; the scores never depend on how many there are."""
    profile, population = _population(data)
    packed = pack([encode(p) for p in population * 5])
    tables = CostModel(profile).tables(max(p.global_batch for p in population))
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = evaluate(packed, tables)
        numba.set_num_threads(before)
        every = evaluate(packed, tables)
    finally:
        numba.set_num_threads(before)
    for a, b in zip(_fields(one), _fields(every), strict=True):
        np.testing.assert_array_equal(a, b)
