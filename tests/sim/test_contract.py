"""docs/model.md section 8, exactly, for both simulators (the reference and the compiled evaluator)."""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import pytest

from tests.contract import (
    EXAMPLE2,
    EXAMPLE3,
    EXAMPLE4,
    EXAMPLE5,
    EXAMPLE5_DEADLOCK,
    example1,
    example8,
    example8_profile,
    unit_profile,
    warmup_plan,
)
from umsearch.core.cost import CostModel
from umsearch.core.plan import Plan
from umsearch.core.profile import Profile, RuntimeCosts
from umsearch.sim.population import encode, evaluate, pack
from umsearch.sim.reference import simulate
from umsearch.sim.result import AllReduceSpan, SimResult


def _batch(plan: Plan, cost: CostModel) -> SimResult:
    """The evaluator's answer in the reference's shape (no records: it keeps none)."""
    res = evaluate(pack([encode(plan)]), cost.tables(plan.global_batch))
    dead = bool(res.deadlock[0])
    per = lambda v: tuple(float(x) for x in res.ranks_of(0, v))  # noqa: E731
    spans_ms = res.stages_of(0, res.allreduce_span_ms)
    spans = () if dead or plan.data_parallel == 1 else tuple(
        AllReduceSpan(stage=j, rank=st.rank, ready_ms=float(spans_ms[j, 0]),
                      start_ms=float(spans_ms[j, 1]), end_ms=float(spans_ms[j, 2]))
        for j, st in enumerate(plan.stages))  # fmt: skip
    return SimResult(deadlock=dead, iteration_ms=None if dead else float(res.iteration_ms[0]),
                     busy_ms=None if dead else per(res.busy_ms), peak_memory_bytes=None if dead else per(res.peak_memory_bytes),
                     rank_end_ms=per(res.rank_end_ms), records=(),
                     compute_end_ms=None if dead else float(res.compute_end_ms[0]),
                     allreduce_end_ms=None if dead or not spans else float(res.allreduce_end_ms[0]),
                     allreduces=spans)  # fmt: skip


SIMULATORS: dict[str, Callable[[Plan, CostModel], SimResult]] = {"reference": simulate, "batch": _batch}


def _run(name: str, plan: Plan, profile: Profile) -> SimResult:
    return SIMULATORS[name](plan, CostModel(profile))


@pytest.fixture(params=sorted(SIMULATORS))
def sim(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_example1_time(sim: str, schedule: str) -> None:
    assert _run(sim, example1(schedule), unit_profile(4)).iteration_ms == 33.0


def test_example1_memory(sim: str) -> None:
    assert _run(sim, example1("gpipe"), unit_profile(4)).peak_memory_bytes == (480.0,) * 4
    assert _run(sim, example1("1f1b"), unit_profile(4)).peak_memory_bytes == (440.0, 430.0, 420.0, 410.0)


def test_example2_deadlocks(sim: str) -> None:
    res = _run(sim, EXAMPLE2, unit_profile(2))
    assert res.deadlock and res.iteration_ms is None and res.peak_memory_bytes is None


def test_example2_names_the_stuck_actions() -> None:
    assert simulate(EXAMPLE2, CostModel(unit_profile(2))).blocked == (
        "rank 0 is stuck at 0B0, waiting for 1B0 on rank 1",
        "rank 1 is stuck at 1F1, waiting for 0F2 on rank 0",
    )


def test_example3_interleaved(sim: str) -> None:
    res = _run(sim, EXAMPLE3, unit_profile(4))
    assert res.iteration_ms == 27.0
    assert res.busy_ms == (24.0, 24.0)
    assert res.peak_memory_bytes == (850.0, 830.0)


def test_example3_against_two_stage_1f1b(sim: str) -> None:
    ones = [1] * 4
    plan = warmup_plan(4, [(ones, ones, 2 - j, False) for j in range(2)], layers_per_stage=2)
    assert _run(sim, plan, unit_profile(4)).iteration_ms == 30.0


def test_example4_zero_bubble_v(sim: str) -> None:
    res = _run(sim, EXAMPLE4, unit_profile(4))
    assert res.iteration_ms == 25.0
    assert res.peak_memory_bytes == (840.0, 840.0)


def test_example5_unequal_interleaved(sim: str) -> None:
    res = _run(sim, EXAMPLE5, unit_profile(4))
    assert res.iteration_ms == 19.0
    assert res.rank_end_ms[1] == 17.0
    assert res.peak_memory_bytes == (880.0, 860.0)


def test_example5_reordered_deadlocks(sim: str) -> None:
    assert _run(sim, EXAMPLE5_DEADLOCK, unit_profile(4)).deadlock


def test_example6_overheads(sim: str) -> None:
    res = _run(sim, EXAMPLE3, unit_profile(4, op_overhead_ms=0.1, message_overhead_ms=0.05))
    assert res.iteration_ms == pytest.approx(30.1, abs=1e-9)
    assert res.busy_ms == pytest.approx((26.8, 26.8), abs=1e-9)


def _example7(**runtime: object) -> Profile:
    """Section 8.7's profile: the unit profile of four layers with version 2.1 runtime terms."""
    import dataclasses

    base = unit_profile(4)
    layers = base.layers
    if "out_bytes_1" in runtime:
        layers = (layers[0], dataclasses.replace(layers[1], out_bytes=float(cast(float, runtime.pop("out_bytes_1")))), *layers[2:])
    link = dataclasses.replace(base.link, bandwidth_gb_per_s=1e18)  # transfers stay 0 ms
    return dataclasses.replace(base, layers=layers, link=link, runtime=RuntimeCosts(**runtime))  # type: ignore[arg-type]


EXAMPLE7 = warmup_plan(2, [([1, 1], [1, 1], 2, False)] * 2, layers_per_stage=2)
"""Section 8.7: two ranks, one stage of two layers each, GPipe with two microbatches of 1."""

_SCALE = ((1, 1.0), (3, 1.5))


@pytest.mark.parametrize(("runtime", "expected"), [
    ({}, 18.0),
    ({"stage_scale": _SCALE}, 22.5),
    ({"stage_scale": _SCALE, "ranges": ((2, 4, 1.0),)}, 21.0),
    ({"stage_scale": _SCALE, "out_bytes_1": 1048576, "message_overhead_ms_per_mib": 0.1}, 23.1),
])  # fmt: skip
def test_example7_v21_terms(sim: str, runtime: dict[str, object], expected: float) -> None:
    res = _run(sim, EXAMPLE7, _example7(**runtime))
    assert res.iteration_ms == pytest.approx(expected, abs=1e-9)


def test_example7_per_mib_busy(sim: str) -> None:
    res = _run(sim, EXAMPLE7, _example7(stage_scale=_SCALE, out_bytes_1=1048576, message_overhead_ms_per_mib=0.1))
    assert res.busy_ms == pytest.approx((15.4, 15.4), abs=1e-9)


def _spans(res: SimResult) -> list[tuple[int, float, float]]:
    return [(s.stage, s.start_ms, s.end_ms) for s in res.allreduces]


def test_example8_dp_inner(sim: str) -> None:
    """Pipeline messages cross nodes (1.02 ms); each stage's copies share a node (3 ms all-reduces)."""
    res = _run(sim, example8("dp_inner"), example8_profile())
    assert res.iteration_ms == pytest.approx(23.04, abs=1e-9)
    assert res.compute_end_ms == pytest.approx(20.04, abs=1e-9)
    assert res.allreduce_end_ms == pytest.approx(23.04, abs=1e-9)
    assert _spans(res) == [(0, pytest.approx(20.04, abs=1e-9), pytest.approx(23.04, abs=1e-9)),
                           (1, pytest.approx(15.02, abs=1e-9), pytest.approx(18.02, abs=1e-9))]  # fmt: skip
    assert res.peak_memory_bytes == (8_000_080.0, 8_000_040.0)


def test_example8_zero1_memory(sim: str) -> None:
    """zero1 shards the optimizer states over the two replicas: (2 + (4 - 2) / 2) * P; time unchanged."""
    res = _run(sim, example8("dp_inner", zero1=True), example8_profile())
    assert res.peak_memory_bytes == (6_000_080.0, 6_000_040.0)
    assert res.iteration_ms == pytest.approx(23.04, abs=1e-9)


def test_example8_pp_inner(sim: str) -> None:
    """Pipeline messages stay on a node (0.502 ms); the all-reduces cross nodes (22 ms each)."""
    res = _run(sim, example8("pp_inner"), example8_profile())
    assert res.iteration_ms == pytest.approx(41.004, abs=1e-9)
    assert res.compute_end_ms == pytest.approx(19.004, abs=1e-9)
    assert _spans(res) == [(0, pytest.approx(19.004, abs=1e-9), pytest.approx(41.004, abs=1e-9)),
                           (1, pytest.approx(14.502, abs=1e-9), pytest.approx(36.502, abs=1e-9))]  # fmt: skip
    assert res.peak_memory_bytes == (8_000_080.0, 8_000_040.0)


def test_example8_messages() -> None:
    """The messages example 8 names: 1.02 ms across nodes (dp_inner), 0.502 ms within one (pp_inner)."""
    for layout, took in (("dp_inner", 1.02), ("pp_inner", 0.502)):
        res = simulate(example8(layout), CostModel(example8_profile()))
        f0 = next(a for a in res.records if (a.stage, a.kind, a.mb) == (0, "F", 0))
        f1 = next(a for a in res.records if (a.stage, a.kind, a.mb) == (1, "F", 0))
        assert f1.start_ms - f0.end_ms == pytest.approx(took, abs=1e-9)


def test_example8_one_replica_keeps_the_cluster(sim: str) -> None:
    """A cluster applies with D = 1 too (device r is rank r, both on node 0 here): no all-reduce."""
    import dataclasses

    plan = dataclasses.replace(example8("dp_inner"), global_batch=4, data_parallel=1)
    res = _run(sim, plan, example8_profile())
    assert res.allreduces == () and res.allreduce_end_ms is None
    # Intra-node messages of 0.502 ms, as one replica of pp_inner: the compute end of that layout.
    assert res.iteration_ms == pytest.approx(19.004, abs=1e-9)
