"""The reference simulator against MODEL.md's reference values and closed forms."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.strategies import plans, profiles, uniform_profile
from umsearch.core.cost import CostModel
from umsearch.core.plan import Plan, StagePlan, uniform_plan
from umsearch.core.samples import message_span
from umsearch.sim.reference import simulate


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_model_md_reference_time(schedule: str) -> None:
    res = simulate(uniform_plan([0, 1, 2, 3, 4], 8, 8, schedule), CostModel(uniform_profile()))
    assert res.iteration_ms == 33.0
    assert not res.deadlock


def test_model_md_reference_memory() -> None:
    cost = CostModel(uniform_profile())
    gpipe = simulate(uniform_plan([0, 1, 2, 3, 4], 8, 8, "gpipe"), cost)
    one_f = simulate(uniform_plan([0, 1, 2, 3, 4], 8, 8, "1f1b"), cost)
    assert gpipe.peak_memory_bytes == (480.0,) * 4
    assert one_f.peak_memory_bytes[0] == 440.0
    # 1F1B stage s holds S - s samples.
    assert one_f.peak_memory_bytes == (440.0, 430.0, 420.0, 410.0)


def test_model_md_reference_deadlock() -> None:
    plan = Plan(
        global_batch=8,
        stages=(
            StagePlan(layers=(0, 2), forward=(1, 3, 4), backward=(2, 6), warmup=1, recompute=True),
            StagePlan(layers=(2, 4), forward=(4, 4), backward=(8,), warmup=2, recompute=True),
        ),
    )
    res = simulate(plan, CostModel(uniform_profile()))
    assert res.deadlock
    assert res.iteration_ms is None
    assert "stage 0 waits to run B0" in res.blocked


@pytest.mark.parametrize("S,M,f,b", [(2, 4, 1.0, 2.0), (4, 8, 0.5, 1.5), (3, 5, 2.0, 2.0), (1, 3, 1.0, 1.0)])
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_gpipe_closed_form(S: int, M: int, f: float, b: float, schedule: str) -> None:
    cost = CostModel(uniform_profile(layers=S, fwd=f, bwd=b))
    res = simulate(uniform_plan(list(range(S + 1)), M, M, schedule), cost)
    assert res.iteration_ms == pytest.approx((M + S - 1) * (f + b), rel=1e-12)


def test_transfer_by_hand() -> None:
    # 2 stages, 1 layer each, f=1, b=2; 2 microbatches of 1; each message: 0.5 + 1 * 1e6 B / 1e6 B/ms = 1.5 ms.
    cost = CostModel(uniform_profile(layers=2, out_bytes=1e6, latency=0.5, bandwidth=1.0))
    res = simulate(uniform_plan([0, 1, 2], 2, 2, "gpipe"), cost)
    # stage0: F0 0-1, F1 1-2; msgs arrive 2.5, 4.0. stage1: F0 2.5-3.5, F1 4-5, B0 5-7, B1 7-9.
    # grads: B0 msg 7-8.5, B1 msg 9-10.5. stage0: B0 8.5-10.5, B1 10.5-12.5.
    starts = {(r.stage, r.kind, r.index): (r.start_ms, r.end_ms) for r in res.ops}
    assert starts[(1, "F", 0)] == (2.5, 3.5)
    assert starts[(1, "F", 1)] == (4.0, 5.0)
    assert starts[(0, "B", 0)] == (8.5, 10.5)
    assert starts[(0, "B", 1)] == (10.5, 12.5)
    assert res.iteration_ms == 12.5


def test_link_serializes_messages() -> None:
    # Transfers (3 ms) longer than compute (1 ms): messages queue on the link.
    cost = CostModel(uniform_profile(layers=2, out_bytes=3e6, latency=0.0, bandwidth=1.0))
    res = simulate(uniform_plan([0, 1, 2], 3, 3, "gpipe"), cost)
    f_starts = [r.start_ms for r in res.ops if r.stage == 1 and r.kind == "F"]
    assert f_starts == [4.0, 7.0, 10.0]


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_properties(data: st.DataObject) -> None:
    profile = data.draw(profiles())
    plan = data.draw(plans(profile.num_layers))
    cost = CostModel(profile, state_factor=data.draw(st.floats(1, 8)))
    res = simulate(plan, cost)
    for s, st_ in enumerate(plan.stages):
        assert res.peak_memory_bytes[s] >= cost.state_factor * cost.param_bytes(st_.lo, st_.hi)
    if res.deadlock:
        assert res.iteration_ms is None
        return
    assert res.iteration_ms is not None
    assert len(res.ops) == sum(len(s.forward) + len(s.backward) for s in plan.stages)
    for s in range(plan.num_stages):
        assert res.iteration_ms >= res.busy_ms[s] - 1e-9
    end = {(r.stage, r.kind, r.index): r.end_ms for r in res.ops}
    by_stage: dict[int, list[tuple[float, float]]] = {}
    for r in res.ops:
        by_stage.setdefault(r.stage, []).append((r.start_ms, r.end_ms))
        if r.kind == "F" and r.stage > 0:
            prev = plan.stages[r.stage - 1].forward
            for m in message_span(prev, plan.stages[r.stage].forward, r.index):
                assert r.start_ms >= end[(r.stage - 1, "F", m)]
        if r.kind == "B" and r.stage < plan.num_stages - 1:
            nxt = plan.stages[r.stage + 1].backward
            for m in message_span(nxt, plan.stages[r.stage].backward, r.index):
                assert r.start_ms >= end[(r.stage + 1, "B", m)]
    for spans in by_stage.values():  # one op at a time per stage
        for (_, e0), (s1, _) in zip(spans, spans[1:], strict=False):
            assert s1 >= e0
