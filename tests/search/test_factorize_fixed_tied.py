"""Memory pruning of factorizations with docs/model.md 5's version 2.3 terms: a tied weight counts once in the
least state a rank holds, and the fixed stash per microbatch counts in GPipe's worst case."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.sim.test_memory import fixed_and_tied
from tests.strategies import plans, profiles
from umsearch.core.cost import CostModel
from umsearch.core.profile import Profile
from umsearch.search.factorize import Memory, comfortable_bytes, smallest_stage_bytes
from umsearch.sim.reference import simulate


def _state_only(profile: Profile, state_factor: float) -> Memory:
    """What pruning needs of ``profile``, its stashes left out (:func:`smallest_stage_bytes`'s state part)."""
    return Memory(param_bytes=tuple(x.param_bytes for x in profile.layers),
                  stash_bytes=(0.0,) * profile.num_layers, state_factor=state_factor, limit=0.0,
                  tied_bytes=sum((len(t.layers) - 1) * t.bytes for t in profile.tied_weights),
                  stash_fixed_bytes=tuple(x.stash_fixed_bytes for x in profile.layers))  # fmt: skip


MEM = Memory(param_bytes=(10.0, 100.0, 100.0, 10.0), stash_bytes=(1.0, 5.0, 5.0, 1.0), state_factor=4.0, limit=1e9)


def test_a_tie_lowers_the_least_state_and_a_fixed_stash_raises_the_worst_case() -> None:
    """Layers 1 and 2 tying 90 bytes: 220 - 90 parameter bytes over 2 ranks is below the largest layer's 100; over
    1 rank, 130. Fixed stashes of 1 + 2 bytes per microbatch add 3 bytes for each of the 8 samples."""
    tied = Memory(param_bytes=MEM.param_bytes, stash_bytes=MEM.stash_bytes, state_factor=4.0, limit=1e9,
                  tied_bytes=90.0, stash_fixed_bytes=(1.0, 0.0, 2.0, 0.0))  # fmt: skip
    assert smallest_stage_bytes(tied, 2, 1, zero1=False) == 4 * 100 + 5
    assert smallest_stage_bytes(tied, 1, 1, zero1=False) == 4 * 130
    assert smallest_stage_bytes(MEM, 1, 1, zero1=False) == 4 * 220
    assert comfortable_bytes(tied, 2, 2, 8) == comfortable_bytes(MEM, 2, 2, 8) + 3 * 8
    assert comfortable_bytes(MEM, 2, 2, 8) == 4 * 220 / 2 + 12 / 2 * 4


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_the_least_state_is_below_every_plan_s_fullest_rank(data: st.DataObject) -> None:
    """With fixed stashes and ties, no plan's fullest rank (reference simulator) is below the pruning bound's
    state part: some rank holds ``1/R`` of the parameters, each tied weight once, and some the largest layer."""
    profile = data.draw(fixed_and_tied(data.draw(profiles(split=True))))
    plan = data.draw(plans(profile.num_layers))
    factor = data.draw(st.sampled_from([1.0, 2.0, 4.0]))
    res = simulate(plan, CostModel(profile, state_factor=factor))
    if res.peak_memory_bytes is None:
        return
    bound = smallest_stage_bytes(_state_only(profile, factor), plan.ranks, 1, zero1=False)
    assert bound <= max(res.peak_memory_bytes) * (1 + 1e-9)
