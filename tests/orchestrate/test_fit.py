"""The calibration fit: it recovers, exactly, the v2.1 terms that generated measurements made by the simulator."""

from __future__ import annotations

import dataclasses

import pytest

from tests.strategies import uniform_profile
from umsearch.core.cost import CostModel
from umsearch.core.profile import Profile, RuntimeCosts
from umsearch.orchestrate.calibration import probe_plans
from umsearch.orchestrate.fit import (
    MeasuredPlan,
    action_samples,
    fit_report,
    fit_runtime,
    knot_weights,
    leave_one_plan_out,
    range_samples,
)
from umsearch.sim.reference import simulate

MIB = 2**20
TRUE = RuntimeCosts(op_overhead_ms=0.3, message_overhead_ms=0.2, message_overhead_ms_per_mib=0.5,
                    stage_scale=((2, 1.2), (4, 0.9)))  # fmt: skip


def _profile(spans: tuple[tuple[int, int], ...] = ((0, 4), (4, 8), (0, 2), (2, 4)), scale: RuntimeCosts = TRUE,
             ) -> Profile:  # fmt: skip
    """Eight layers, 1 MiB per sample at every boundary, and profiler range timings made with ``scale``."""
    base = uniform_profile(layers=8, out_bytes=MIB, bandwidth=1e9)
    cost = CostModel(dataclasses.replace(base, runtime=scale))
    record = [{"layers": [lo, hi], "size": 2, "sum_ms": 3.0 * (hi - lo),
               "measured_ms": 3.0 * (hi - lo) * cost.stage_scale(lo, hi)} for lo, hi in spans]  # fmt: skip
    return dataclasses.replace(base, extra={"calibration": record})


def _measured(profile: Profile, truth: RuntimeCosts) -> list[MeasuredPlan]:
    """The probe plans 'measured' on a machine that is the simulator under ``truth``."""
    machine = CostModel(dataclasses.replace(profile, runtime=truth))
    out = []
    for name, plan in probe_plans(profile):
        res = simulate(plan, machine)
        assert res.iteration_ms is not None
        out.append(MeasuredPlan(name=name, plan=plan, iteration_ms=res.iteration_ms,
                                samples=action_samples(name, plan, profile, [res])))  # fmt: skip
    return out


def test_knot_weights_read_stage_scale_as_the_cost_model_does() -> None:
    assert knot_weights([2, 4], 1) == [1.0, 0.0] and knot_weights([2, 4], 9) == [0.0, 1.0]
    assert knot_weights([2, 4], 3) == [0.5, 0.5] and knot_weights([1, 3, 7], 5) == [0.0, 0.5, 0.5]


def test_the_fit_recovers_stage_scales_and_per_mib_costs_exactly() -> None:
    profile = _profile()
    measured = _measured(profile, TRUE)
    fit = fit_runtime([s for m in measured for s in m.samples], range_samples(profile))
    assert fit.op_overhead_ms == pytest.approx(0.3, abs=1e-9)
    assert fit.message_overhead_ms == pytest.approx(0.2, abs=1e-9)
    assert fit.message_overhead_ms_per_mib == pytest.approx(0.5, abs=1e-9)
    assert [k for k, _ in fit.stage_scale] == [2, 4]
    assert [s for _, s in fit.stage_scale] == pytest.approx([1.2, 0.9], abs=1e-9)
    assert fit.rms_residual_ms == pytest.approx(0.0, abs=1e-9) and fit.range_rows == 4


def test_the_fit_recovers_per_range_scales_exactly() -> None:
    truth = RuntimeCosts(op_overhead_ms=0.1, message_overhead_ms_per_mib=0.25,
                         ranges=((0, 4, 1.1), (4, 8, 0.8), (0, 2, 1.3), (2, 4, 0.7), (4, 6, 1.0), (6, 8, 1.05)))  # fmt: skip
    profile = _profile(scale=truth)
    fit = fit_runtime([s for m in _measured(profile, truth) for s in m.samples], range_samples(profile),
                      scales="ranges")  # fmt: skip
    assert fit.stage_scale == ()
    assert fit.op_overhead_ms == pytest.approx(0.1, abs=1e-9)
    assert fit.message_overhead_ms == pytest.approx(0.0, abs=1e-9)
    assert fit.message_overhead_ms_per_mib == pytest.approx(0.25, abs=1e-9)
    got = {(lo, hi): s for lo, hi, s in fit.ranges}
    assert got == pytest.approx({(lo, hi): s for lo, hi, s in truth.ranges}, abs=1e-9)


def test_the_range_timings_alone_fix_a_scale_no_probe_stage_has() -> None:
    # Probes use stages of 4 and 2 layers; a profiler range of 3 layers adds knot 3, fitted from it alone.
    truth = dataclasses.replace(TRUE, stage_scale=((2, 1.2), (3, 1.5), (4, 0.9)))
    profile = _profile(spans=((0, 4), (4, 8), (0, 2), (2, 4), (1, 4)), scale=truth)
    fit = fit_runtime([s for m in _measured(profile, truth) for s in m.samples], range_samples(profile))
    assert [k for k, _ in fit.stage_scale] == [2, 3, 4]
    assert [s for _, s in fit.stage_scale] == pytest.approx([1.2, 1.5, 0.9], abs=1e-9)


def test_the_fit_keeps_overheads_non_negative_and_scales_positive() -> None:
    profile = _profile(spans=())
    measured = _measured(profile, RuntimeCosts())
    # Every action 0.2 ms faster than its layers: the op overhead would be -0.2 but is held at 0, and
    # the scales (which may shrink) take the difference.
    faster = [dataclasses.replace(s, measured_ms=s.measured_ms - 0.2) for m in measured for s in m.samples]
    fit = fit_runtime(faster)
    assert fit.op_overhead_ms == 0.0 and fit.message_overhead_ms >= 0.0 and fit.message_overhead_ms_per_mib >= 0.0
    assert all(0 < s < 1 for _, s in fit.stage_scale)
    # Without scales the layers' time is fixed and the overheads are held at 0.
    none = fit_runtime(faster, scales="none")
    assert none.op_overhead_ms == 0.0 and none.stage_scale == () and none.ranges == ()
    # Absurd measurements (near zero) meet the floor, never a zero or negative scale.
    tiny = fit_runtime([dataclasses.replace(s, measured_ms=1e-6) for s in faster])
    assert all(s >= 0.05 for _, s in tiny.stage_scale)


def test_held_out_error_is_zero_on_exact_data_and_every_plan_is_held_out() -> None:
    profile = _profile()
    measured = _measured(profile, TRUE)
    rows = leave_one_plan_out(profile, measured, range_samples(profile))
    assert [r["plan"] for r in rows] == [m.name for m in measured]
    assert all(r["error"] == pytest.approx(0.0, abs=1e-9) for r in rows)
    assert leave_one_plan_out(profile, measured[:1]) == []


def test_the_report_stores_the_fit_and_how_it_was_measured() -> None:
    profile = _profile()
    calibrated, report = fit_report(profile, _measured(profile, TRUE), how={"rounds": 3})
    rt = calibrated.runtime
    assert [s for _, s in rt.stage_scale] == pytest.approx([1.2, 0.9], abs=1e-9)
    assert rt.message_overhead_ms_per_mib == pytest.approx(0.5, abs=1e-9)
    assert rt.calibration is not None and rt.calibration["rounds"] == 3
    assert rt.calibration["held_out_mape_percent"] == pytest.approx(0.0, abs=1e-7)
    assert set(rt.calibration["terms"]) == {"op_overhead_ms", "message_overhead_ms", "message_overhead_ms_per_mib",
                                            "stage_scale"}  # fmt: skip
    assert report["mape_percent_bare"] > 1.0 and report["mape_percent"] == pytest.approx(0.0, abs=1e-7)
    assert len(report["probe_rows"]) == 5 and all(r["predicted_held_out_ms"] for r in report["probe_rows"])
