"""The reference simulator against closed forms, hand-worked transfers and timing properties."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.contract import warmup_plan
from tests.strategies import plans, profiles, uniform_profile
from umsearch.core.cost import CostModel
from umsearch.core.deps import Dependencies
from umsearch.sim.reference import simulate


def _gpipe_or_1f1b(S: int, M: int, schedule: str) -> object:
    ones = [1] * M
    return warmup_plan(M, [(ones, ones, M if schedule == "gpipe" else S - j, False) for j in range(S)])


@pytest.mark.parametrize("S,M,f,b", [(2, 4, 1.0, 2.0), (4, 8, 0.5, 1.5), (3, 5, 2.0, 2.0), (1, 3, 1.0, 1.0)])
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_gpipe_closed_form(S: int, M: int, f: float, b: float, schedule: str) -> None:
    cost = CostModel(uniform_profile(layers=S, fwd=f, bwd=b))
    res = simulate(_gpipe_or_1f1b(S, M, schedule), cost)  # type: ignore[arg-type]
    assert res.iteration_ms == pytest.approx((M + S - 1) * (f + b), rel=1e-12)


def test_transfer_by_hand() -> None:
    # 2 stages, 1 layer each, f=1, b=2; 2 microbatches of 1; each message: 0.5 + 1 * 1e6 B / 1e6 B/ms = 1.5 ms.
    cost = CostModel(uniform_profile(layers=2, out_bytes=1e6, latency=0.5, bandwidth=1.0))
    res = simulate(_gpipe_or_1f1b(2, 2, "gpipe"), cost)  # type: ignore[arg-type]
    # rank 0: F0 0-1, F1 1-2; messages arrive 2.5, 4.0. rank 1: F0 2.5-3.5, F1 4-5, B0 5-7, B1 7-9.
    # gradients: B0's message 7-8.5, B1's 9-10.5. rank 0: B0 8.5-10.5, B1 10.5-12.5.
    at = {r.label: (r.start_ms, r.end_ms) for r in res.records}
    assert at["1F0"] == (2.5, 3.5)
    assert at["1F1"] == (4.0, 5.0)
    assert at["0B0"] == (8.5, 10.5)
    assert at["0B1"] == (10.5, 12.5)
    assert res.iteration_ms == 12.5


def test_link_serializes_messages() -> None:
    # Transfers (3 ms) longer than compute (1 ms): messages queue on the link.
    cost = CostModel(uniform_profile(layers=2, out_bytes=3e6, latency=0.0, bandwidth=1.0))
    res = simulate(_gpipe_or_1f1b(2, 3, "gpipe"), cost)  # type: ignore[arg-type]
    assert [r.start_ms for r in res.records if r.stage == 1 and r.kind == "F"] == [4.0, 7.0, 10.0]


def test_same_rank_hand_off_is_immediate() -> None:
    # Two stages on one rank: no link, no latency, even with a slow link.
    from tests.contract import explicit_plan

    plan = explicit_plan(2, [0, 0], [[1, 1], [1, 1]], ["0F0 1F0 0F1 1F1 1B0 0B0 1B1 0B1"])
    res = simulate(plan, CostModel(uniform_profile(layers=2, out_bytes=1e9, latency=5.0, bandwidth=0.001)))
    assert res.iteration_ms == 12.0


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_properties(data: st.DataObject) -> None:
    profile = data.draw(profiles(split=True))
    plan = data.draw(plans(profile.num_layers))
    cost = CostModel(profile, state_factor=data.draw(st.floats(1, 8)))
    res = simulate(plan, cost)
    if res.deadlock:
        assert res.iteration_ms is None and res.blocked
        return
    assert res.iteration_ms is not None and res.busy_ms is not None and res.peak_memory_bytes is not None
    assert len(res.records) == sum(len(a) for a in plan.actions)
    for r in range(plan.ranks):
        assert res.iteration_ms >= res.busy_ms[r] - 1e-9
        state = sum(cost.param_bytes(plan.stages[j].lo, plan.stages[j].hi) for j in plan.stages_of(r))
        assert res.peak_memory_bytes[r] >= cost.state_factor * state * (1 - 1e-12)
    deps = Dependencies(plan)
    end = {r.label: r.end_ms for r in res.records}
    for rec in res.records:
        from umsearch.core.actions import Action

        for p in deps.producers(Action(rec.stage, rec.kind, rec.mb)):
            assert rec.start_ms >= end[str(p)] - 1e-12
    for r in range(plan.ranks):  # one action at a time per rank, in list order
        mine = [rec for rec in res.records if rec.rank == r]
        assert [rec.label for rec in mine] == [str(a) for a in plan.actions[r]]
        for a, b in zip(mine, mine[1:], strict=False):
            assert b.start_ms >= a.end_ms
