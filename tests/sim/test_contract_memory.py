"""docs/model.md section 8.9 (version 2.3's memory), exactly, for both simulators."""

from __future__ import annotations

import dataclasses

import pytest

from tests.contract import EXAMPLE4, explicit_plan, unit_profile, warmup_plan
from tests.sim.test_contract import SIMULATORS
from umsearch.core.cost import CostModel
from umsearch.core.plan import Plan
from umsearch.core.profile import Profile


def example9_profile(*, v23: bool = True) -> Profile:
    """Section 8.9's profile: section 8's four layers with 5 bytes per sample of output (and of input to layer 0)
    and, with ``v23``, boundary_shared_bytes 4 (layers 1-3), input_saved_bytes 3 and weight_stash_bytes 6
    (10 on layer 0, whose input needs no gradient)."""
    base = unit_profile(4)
    layers = tuple(dataclasses.replace(x, out_bytes=5.0) for x in base.layers)
    if v23:
        layers = tuple(dataclasses.replace(x, boundary_shared_bytes=4.0 if i else 0.0, input_saved_bytes=3.0,
                                           weight_stash_bytes=6.0 if i else 10.0) for i, x in enumerate(layers))  # fmt: skip
    return dataclasses.replace(base, input_bytes=5.0, layers=layers)


def _two_stage(recompute: bool) -> Plan:
    ones = [1] * 4
    return warmup_plan(4, [(ones, ones, 2, recompute), (ones, ones, 1, recompute)], layers_per_stage=2)


def _split_recompute() -> Plan:
    plan = explicit_plan(1, [0, 1], [[1], [1]], ["0F0 0I0 0W0", "1F0 1I0 1W0"], layers_per_stage=2)
    return dataclasses.replace(plan, stages=tuple(dataclasses.replace(st, recompute=True) for st in plan.stages))


@pytest.fixture(params=sorted(SIMULATORS))
def sim(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _peaks(sim: str, plan: Plan, v23: bool = True) -> tuple[float, ...] | None:
    return SIMULATORS[sim](plan, CostModel(example9_profile(v23=v23))).peak_memory_bytes


def test_example9_shared_boundary(sim: str) -> None:
    # stash 10 + 10 - 4 = 16 per stage: 1F1B holds 2 and 1 microbatches.
    assert _peaks(sim, _two_stage(False)) == (832.0, 816.0)
    assert _peaks(sim, _two_stage(False), v23=False) == (840.0, 820.0)


def test_example9_recompute_rebuilds_on_the_kept_input(sim: str) -> None:
    # Rank 0: two kept inputs (2 x 5), then B adds 16 - 3: 23. Rank 1: 5 + 13 = 18.
    assert _peaks(sim, _two_stage(True)) == (823.0, 818.0)
    assert _peaks(sim, _two_stage(True), v23=False) == (830.0, 825.0)


def test_example9_zero_bubble_v_hands_a_boundary_on(sim: str) -> None:
    # Rank 1 holds stages 1 and 2; stage 1 hands its output to stage 2, which counts 10 - 4 = 6 per sample.
    assert _peaks(sim, EXAMPLE4) == (840.0, 836.0)


def test_example9_split_recompute_frees_at_i(sim: str) -> None:
    # 5 kept, + 13 at I (peak 18), I frees 5 - 3 + 4 = 6, W the remaining 12.
    assert _peaks(sim, _split_recompute()) == (818.0, 818.0)


def test_example9_levels_return_to_zero() -> None:
    """Every list releases what it added: the level after the last action is 0 on every rank."""
    cost = CostModel(example9_profile())
    from umsearch.sim.reference import hand_offs

    for plan in (_two_stage(False), _two_stage(True), EXAMPLE4, _split_recompute()):
        handed = hand_offs(plan)
        for r in range(plan.ranks):
            level = 0.0
            for a in plan.actions[r]:
                st = plan.stages[a.stage]
                terms = cost.stage_memory(st.lo, st.hi, st.recompute, a.stage > 0 and handed[a.stage - 1],
                                          handed[a.stage])  # fmt: skip
                add, rel = a.memory(st.recompute, *terms)
                level += add - rel
            assert level == pytest.approx(0.0, abs=1e-9)
