"""docs/model.md section 8.9's last two terms of version 2.3, exactly, for both simulators: the stash a layer
saves per microbatch whatever its size (``stash_fixed_bytes``), and a tied weight counted once per rank."""

from __future__ import annotations

import dataclasses

import pytest

from tests.contract import EXAMPLE4, explicit_plan, warmup_plan
from tests.sim.test_contract import SIMULATORS
from tests.sim.test_contract_memory import example9_profile
from umsearch.core.cost import CostModel
from umsearch.core.plan import Plan
from umsearch.core.profile import Profile, TiedWeight

FIXED = (0.0, 2.0, 7.0, 0.0)
"""Section 8.9's ``stash_fixed_bytes`` per layer: stage ``[0, 2)`` saves 2 bytes per microbatch, ``[2, 4)`` 7."""
TIE = TiedWeight(layers=(0, 3), bytes=40.0)
"""Section 8.9's tied weight: 40 of the 100 parameter bytes of layers 0 and 3."""


def fixed_profile(*, fixed: bool = True, tied: bool = False) -> Profile:
    """Section 8.9's profile, with :data:`FIXED` and, with ``tied``, :data:`TIE`."""
    base = example9_profile()
    layers = tuple(dataclasses.replace(x, stash_fixed_bytes=c if fixed else 0.0) for x, c in zip(base.layers, FIXED,
                                                                                                 strict=True))  # fmt: skip
    return dataclasses.replace(base, layers=layers, tied_weights=(TIE,) if tied else ())


def _two_stage(recompute: bool) -> Plan:
    """Two ranks, a stage of two layers each, B = 4 in two microbatches of 2, 1F1B (warmups 2 and 1)."""
    twos = [2, 2]
    return warmup_plan(4, [(twos, twos, 2, recompute), (twos, twos, 1, recompute)], layers_per_stage=2)


ONE_STAGE_SPLIT = explicit_plan(4, [0], [[2, 2]], ["0F0 0I0 0F1 0W0 0I1 0W1"], layers_per_stage=4)
"""One rank, one stage of all four layers, B = 4 in two microbatches of 2, the second forward after the
first ``I``."""


@pytest.fixture(params=sorted(SIMULATORS))
def sim(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _peaks(sim: str, plan: Plan, profile: Profile) -> tuple[float, ...] | None:
    return SIMULATORS[sim](plan, CostModel(profile)).peak_memory_bytes


def test_example9_a_fixed_part_per_microbatch(sim: str) -> None:
    # Rank 0 holds two microbatches of 2: 2 x (16 x 2 + 2); rank 1 one: 16 x 2 + 7.
    assert _peaks(sim, _two_stage(False), fixed_profile()) == (868.0, 839.0)
    assert _peaks(sim, _two_stage(False), fixed_profile(fixed=False)) == (864.0, 832.0)


def test_example9_a_recomputing_stage_rebuilds_the_fixed_part(sim: str) -> None:
    # Rank 0: two kept inputs (2 x 10), B adds 13 x 2 + 2 = 28: 48. Rank 1: 10 + 13 x 2 + 7 = 43.
    assert _peaks(sim, _two_stage(True), fixed_profile()) == (848.0, 843.0)
    assert _peaks(sim, _two_stage(True), fixed_profile(fixed=False)) == (846.0, 836.0)


def test_example9_i_frees_none_of_the_fixed_part(sim: str) -> None:
    # stash 40 - 12 = 28 per sample, c = 9, freed 4: 0F0 65, 0I0 frees 8 (57), 0F1 adds 65: 122.
    assert _peaks(sim, ONE_STAGE_SPLIT, fixed_profile()) == (4 * 400 + 122.0,)
    assert _peaks(sim, ONE_STAGE_SPLIT, fixed_profile(fixed=False)) == (4 * 400 + 104.0,)


def test_example9_a_tied_weight_counts_once_on_a_rank_holding_both_layers(sim: str) -> None:
    # The V's rank 0 holds layers 0 and 3: 4 x (200 - 40) + 40; rank 1 holds neither: as in 8.9.
    assert _peaks(sim, EXAMPLE4, fixed_profile(fixed=False, tied=True)) == (680.0, 836.0)
    assert _peaks(sim, EXAMPLE4, fixed_profile(fixed=False)) == (840.0, 836.0)
    # One stage holding both layers holds it once too.
    assert _peaks(sim, ONE_STAGE_SPLIT, fixed_profile(tied=True)) == (4 * 360 + 122.0,)


def test_example9_levels_return_to_zero_with_the_fixed_part() -> None:
    """Every list releases what it added, fixed parts included: the level after the last action is 0."""
    cost = CostModel(fixed_profile())
    from umsearch.sim.reference import hand_offs

    for plan in (_two_stage(False), _two_stage(True), EXAMPLE4, ONE_STAGE_SPLIT):
        handed = hand_offs(plan)
        for r in range(plan.ranks):
            level = 0.0
            for a in plan.actions[r]:
                st = plan.stages[a.stage]
                sizes = cost.microbatch_memory(st.lo, st.hi, st.recompute, a.stage > 0 and handed[a.stage - 1],
                                               handed[a.stage], a.size(st.forward, st.backward))  # fmt: skip
                add, rel = a.memory(st.recompute, *sizes)
                level += add - rel
            assert level == pytest.approx(0.0, abs=1e-9)
