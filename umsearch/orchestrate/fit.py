"""The calibration fit (docs/model.md sections 4 and 7, version 2.1): one least-squares fit of every runtime term.

Under the contract an action of a stage ``[lo, hi)`` takes

    s(lo, hi) x base + op_overhead_ms + message_overhead_ms x n + message_overhead_ms_per_mib x MiB

``base`` its layers' own time, ``n`` the cross-rank messages charged to it
and ``MiB`` their full sizes. With ``s`` piecewise linear in the layer count
``k = hi - lo`` at fixed knots (or one scale per exact range), every term is
linear in the unknowns, so measured action durations give linear equations;
a profiler's stage-sized range timing gives one more (``measured = s x sum``,
no overheads: the profiler runs layers without the runtime). All of them go
into one bounded least-squares problem: overheads and the per-MiB cost
``>= 0``, scales ``>= SCALE_FLOOR`` (the contract wants them positive).

Everything here is pure and deterministic: no torch, no timing. The fit is
judged by the iteration times of plans left out of it
(:func:`leave_one_plan_out`), since an in-sample error is no evidence.

Ranks replayed alone (``umsearch calibrate --replay``) measure every action
with no peer: no message is waited for or posted, so they say nothing of the
message terms. Their fit keeps the profile's message terms (``messages=``)
and fits the compute terms only (op overhead and the scales), and is judged
by busy time (every rank's action durations summed, with no message charge)
instead of the iteration time no replay has (``MeasuredPlan.judged``).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from scipy.optimize import lsq_linear

from umsearch.core.cost import CostModel
from umsearch.core.deps import Dependencies
from umsearch.core.plan import Plan
from umsearch.core.profile import Profile, RuntimeCosts
from umsearch.errors import ProfilingError

Judged = Literal["iteration", "busy"]
"""What a measured plan's ``measured_ms`` is: its iteration time (a real run), or the sum of its ranks'
busy times (ranks replayed alone, which have no iteration time)."""
Scales = Literal["stage_scale", "ranges", "none"]
"""How the fit models layers run together: ``s(k)`` at knots, one scale per exact range, or s = 1."""
SCALES: tuple[Scales, ...] = ("stage_scale", "ranges", "none")
SCALE_FLOOR = 0.05
"""Smallest scale the fit may return (the contract wants scales > 0; a stage 20x faster than its layers
alone is a broken measurement, not a cache effect)."""


@dataclass(frozen=True, kw_only=True)
class ActionSample:
    """One measured action, as the fit sees it."""

    plan: str
    """Label of the plan it ran in (the unit left out by :func:`leave_one_plan_out`)."""
    measured_ms: float
    """Its measured duration (median over rounds)."""
    base_ms: float
    """Its layers' own time, recomputation included, unscaled and without overheads."""
    lo: int
    """First layer of its stage."""
    hi: int
    """One past the last layer of its stage."""
    messages: int
    """Cross-rank messages charged to it (docs/model.md 4)."""
    mib: float
    """Full size of those messages, in MiB."""


@dataclass(frozen=True, kw_only=True)
class RangeSample:
    """A stage-sized layer range timed end to end by the profiler (forward plus backward, one size)."""

    lo: int
    hi: int
    measured_ms: float
    """The range run as a stage runs it."""
    sum_ms: float
    """The profile's sum of its layers' times at that size."""


@dataclass(frozen=True, kw_only=True)
class MeasuredPlan:
    """A plan that ran on umsearch's runtime: its actions and its measured iteration time."""

    name: str
    plan: Plan
    iteration_ms: float
    """Median measured iteration (latest action end), what the simulator predicts; with ``judged`` ``busy``,
    the sum over ranks of each rank's median busy time."""
    samples: tuple[ActionSample, ...]
    judged: Judged = "iteration"
    """Which of the simulator's figures ``iteration_ms`` is compared with (:data:`Judged`)."""


@dataclass(frozen=True, kw_only=True)
class RuntimeFit:
    """The fitted terms and how well they explain what they were fitted on."""

    op_overhead_ms: float
    message_overhead_ms: float
    message_overhead_ms_per_mib: float
    stage_scale: tuple[tuple[int, float], ...]
    """``(k, s)`` at the knots (``scales = "stage_scale"``), else empty."""
    ranges: tuple[tuple[int, int, float], ...]
    """``(lo, hi, s)`` per range (``scales = "ranges"``), else empty."""
    rms_residual_ms: float
    """Root mean square of what the fit leaves unexplained, over every equation."""
    actions: int
    """Action equations."""
    range_rows: int
    """Range equations."""

    def runtime(self, calibration: dict[str, Any] | None = None) -> RuntimeCosts:
        """The profile's ``runtime`` terms."""
        return RuntimeCosts(op_overhead_ms=self.op_overhead_ms, message_overhead_ms=self.message_overhead_ms,
                            message_overhead_ms_per_mib=self.message_overhead_ms_per_mib,
                            stage_scale=self.stage_scale, ranges=self.ranges, calibration=calibration)  # fmt: skip


def knot_weights(knots: Sequence[int], k: int) -> list[float]:
    """Weights of the knot values in ``s(k)``: linear between knots, constant beyond the ends (as
    :func:`umsearch.core.cost.stage_scales` reads ``stage_scale``), so ``s(k) = sum(w_i s_i)``."""
    w = [0.0] * len(knots)
    if k <= knots[0]:
        w[0] = 1.0
    elif k >= knots[-1]:
        w[-1] = 1.0
    else:
        i = next(i for i in range(len(knots) - 1) if knots[i] <= k < knots[i + 1])
        t = (k - knots[i]) / (knots[i + 1] - knots[i])
        w[i], w[i + 1] = 1.0 - t, t
    return w


def _scale_columns(scales: Scales, spans: Sequence[tuple[int, int]]) -> list[Any]:
    """The scale unknowns: knots k (stage_scale), ranges (lo, hi) (ranges) or none."""
    if scales == "stage_scale":
        return sorted({hi - lo for lo, hi in spans})
    if scales == "ranges":
        return sorted(set(spans))
    return []


def _scale_row(scales: Scales, columns: Sequence[Any], lo: int, hi: int, base: float) -> list[float]:
    if scales == "stage_scale":
        return [base * w for w in knot_weights(columns, hi - lo)]
    if scales == "ranges":
        return [base if c == (lo, hi) else 0.0 for c in columns]
    return []


def fit_runtime(actions: Sequence[ActionSample], ranges: Sequence[RangeSample] = (), *,
                scales: Scales = "stage_scale", messages: tuple[float, float] | None = None) -> RuntimeFit:  # fmt: skip
    """The bounded least-squares fit of every runtime term to ``actions`` and ``ranges`` (module docstring).

    A term no equation constrains (no cross-rank message, no message bytes)
    is 0; a scale column no equation reaches does not exist (knots and ranges
    are taken from the stages and ranges measured). ``messages``:
    ``(message_overhead_ms, message_overhead_ms_per_mib)`` kept as given, not
    fitted (their charge leaves the measured side first). Deterministic: the
    same samples give the same values.
    """
    if not actions:
        raise ProfilingError("no action was measured; the probe plans did not run, so nothing can be fitted")
    if scales not in SCALES:
        raise ProfilingError(f"scales {scales!r} is not a calibration mode; use one of {', '.join(SCALES)}")
    spans = [(a.lo, a.hi) for a in actions] + [(r.lo, r.hi) for r in ranges]
    columns = _scale_columns(scales, spans)
    fixed = scales == "none"  # s = 1: the layer time moves to the measured side
    rows, target = [], []
    msg_ms, mib_ms = messages if messages is not None else (0.0, 0.0)
    for a in actions:
        charge = msg_ms * a.messages + mib_ms * a.mib if messages is not None else 0.0
        count, size = (0.0, 0.0) if messages is not None else (float(a.messages), a.mib)
        rows.append([1.0, count, size, *_scale_row(scales, columns, a.lo, a.hi, a.base_ms)])
        target.append(a.measured_ms - charge - (a.base_ms if fixed else 0.0))
    if not fixed:
        for r in ranges:
            rows.append([0.0, 0.0, 0.0, *_scale_row(scales, columns, r.lo, r.hi, r.sum_ms)])
            target.append(r.measured_ms)
    A, y = np.asarray(rows, dtype=np.float64), np.asarray(target, dtype=np.float64)
    lower = np.array([0.0, 0.0, 0.0] + [SCALE_FLOOR] * len(columns))
    used = np.flatnonzero(np.any(A != 0.0, axis=0))
    x = np.where(np.arange(A.shape[1]) < 3, 0.0, 1.0)
    if used.size:
        sol = lsq_linear(A[:, used], y, bounds=(lower[used], np.full(used.size, np.inf)), method="bvls")
        x[used] = sol.x
    resid = y - A @ x
    op, msg, mib = (max(0.0, float(v)) for v in x[:3])
    if messages is not None:
        msg, mib = float(messages[0]), float(messages[1])
    knots = tuple((int(k), float(s)) for k, s in zip(columns, x[3:], strict=True)) if scales == "stage_scale" else ()
    per_range = tuple((int(c[0]), int(c[1]), float(s)) for c, s in zip(columns, x[3:], strict=True)) \
        if scales == "ranges" else ()  # fmt: skip
    return RuntimeFit(op_overhead_ms=op, message_overhead_ms=msg, message_overhead_ms_per_mib=mib,
                      stage_scale=knots, ranges=per_range, rms_residual_ms=float(np.sqrt(np.mean(resid**2))),
                      actions=len(actions), range_rows=0 if fixed else len(ranges))  # fmt: skip


# ------------------------------------------------------------------------------------ samples
def _charge_model(profile: Profile, message_ms: float = 0.0, per_mib_ms: float = 0.0) -> CostModel:
    runtime = RuntimeCosts(message_overhead_ms=message_ms, message_overhead_ms_per_mib=per_mib_ms)
    return CostModel(dataclasses.replace(profile, runtime=runtime))


def action_samples(name: str, plan: Plan, profile: Profile, rounds: Sequence[Any]) -> tuple[ActionSample, ...]:
    """One sample per action of ``plan``: its median duration over ``rounds`` (objects with ``records``
    of :class:`~umsearch.core.actions.ActionRecord`), with its base time, messages and MiB.

    The counts come from the reference simulator's own charge rule under unit
    terms (message overhead 1, then per-MiB 1), so the fit reads exactly what
    the simulator will charge.
    """
    from umsearch.core.actions import Action
    from umsearch.sim.reference import ActionTiming

    deps = Dependencies(plan)
    bare = ActionTiming(plan, _charge_model(profile), deps)
    count = ActionTiming(plan, _charge_model(profile, message_ms=1.0), deps)
    size = ActionTiming(plan, _charge_model(profile, per_mib_ms=1.0), deps)
    durations: dict[Action, list[float]] = {}
    for step in rounds:
        for r in step.records:
            durations.setdefault(Action(r.stage, r.kind, r.mb), []).append(r.end_ms - r.start_ms)
    out = []
    for a in sorted(durations, key=lambda a: (a.stage, a.kind, a.mb)):
        st = plan.stages[a.stage]
        out.append(ActionSample(plan=name, measured_ms=statistics.median(durations[a]), base_ms=bare.base_ms(a),
                                lo=st.lo, hi=st.hi, messages=round(count.message_ms(a)), mib=size.message_ms(a)))  # fmt: skip
    return tuple(out)


def range_samples(profile: Profile) -> tuple[RangeSample, ...]:
    """The stage-sized ranges the profiler timed end to end (the profile's ``calibration`` record)."""
    out = []
    for c in profile.extra.get("calibration", []) or []:
        try:
            lo, hi = (int(v) for v in c["layers"])
            measured, total = float(c["measured_ms"]), float(c["sum_ms"])
        except (KeyError, TypeError, ValueError):
            continue  # an older record without these fields: nothing to fit from it
        if 0 <= lo < hi <= profile.num_layers and measured > 0 and total > 0:
            out.append(RangeSample(lo=lo, hi=hi, measured_ms=measured, sum_ms=total))
    return tuple(out)


# ------------------------------------------------------------------------------------ judging a fit
def predict(plan: Plan, profile: Profile, runtime: RuntimeCosts) -> float:
    """The reference simulator's iteration time of ``plan`` under ``profile`` with ``runtime``."""
    from umsearch.sim.reference import simulate

    res = simulate(plan, CostModel(dataclasses.replace(profile, runtime=runtime)))
    if res.iteration_ms is None:
        raise ProfilingError("a measured plan deadlocks in the simulator; it cannot be part of a calibration")
    return res.iteration_ms


def predict_busy(plan: Plan, profile: Profile, runtime: RuntimeCosts) -> float:
    """The reference simulator's busy time of ``plan``, summed over its ranks, under ``profile`` with
    ``runtime`` less its message terms: what ranks replayed alone (no message posted or waited for) add up to."""
    from umsearch.sim.reference import simulate

    alone = dataclasses.replace(runtime, message_overhead_ms=0.0, message_overhead_ms_per_mib=0.0)
    res = simulate(plan, CostModel(dataclasses.replace(profile, runtime=alone)))
    if res.busy_ms is None:
        raise ProfilingError("a measured plan deadlocks in the simulator; it cannot be part of a calibration")
    return float(sum(res.busy_ms))


def predicted(m: MeasuredPlan, profile: Profile, runtime: RuntimeCosts) -> float:
    """What the simulator says of ``m``'s measured figure (:attr:`MeasuredPlan.judged`)."""
    return predict_busy(m.plan, profile, runtime) if m.judged == "busy" else predict(m.plan, profile, runtime)


def _mape(rows: Sequence[dict[str, Any]]) -> float | None:
    return 100.0 * statistics.fmean(abs(r["error"]) for r in rows) if rows else None


def _row(m: MeasuredPlan, predicted: float) -> dict[str, Any]:
    return {"plan": m.name, "measured_ms": m.iteration_ms, "predicted_ms": predicted,
            "error": (predicted - m.iteration_ms) / m.iteration_ms}  # fmt: skip


def leave_one_plan_out(profile: Profile, measured: Sequence[MeasuredPlan], ranges: Sequence[RangeSample] = (),
                       *, scales: Scales = "stage_scale",
                       messages: tuple[float, float] | None = None) -> list[dict[str, Any]]:  # fmt: skip
    """Per plan: its iteration (or busy time, :attr:`MeasuredPlan.judged`) predicted by a fit of every
    *other* plan's actions (and the ranges), against its measured one. Empty with fewer than two plans
    (nothing to hold out)."""
    if len(measured) < 2:
        return []
    rows = []
    for m in measured:
        rest = [s for other in measured if other is not m for s in other.samples]
        fit = fit_runtime(rest, ranges, scales=scales, messages=messages)
        rows.append(_row(m, predicted(m, profile, fit.runtime())))
    return rows


def fit_report(profile: Profile, measured: Sequence[MeasuredPlan], *, scales: Scales = "stage_scale",
               how: dict[str, Any] | None = None, keep_messages: bool = False) -> tuple[Profile, dict[str, Any]]:  # fmt: skip
    """Fit ``measured`` (and the profile's range timings) into ``profile``; the calibrated profile and
    the report, which the profile also keeps as ``runtime.calibration``.

    The report gives every term, the in-sample and the held-out (leave one plan
    out) MAPE of the iteration time (of the busy time for replayed ranks,
    :attr:`MeasuredPlan.judged`), and per plan the prediction without the
    runtime terms, with them, and held out. ``keep_messages``: the profile's
    message terms are kept, not fitted (replayed ranks pay none); the profile's
    links are never changed.
    """
    ranges = range_samples(profile) if scales != "none" else ()
    rt = profile.runtime
    messages = (rt.message_overhead_ms, rt.message_overhead_ms_per_mib) if keep_messages else None
    samples = [s for m in measured for s in m.samples]
    fit = fit_runtime(samples, ranges, scales=scales, messages=messages)
    held = leave_one_plan_out(profile, measured, ranges, scales=scales, messages=messages)
    inside = [_row(m, predicted(m, profile, fit.runtime())) for m in measured]
    bare = [_row(m, predicted(m, profile, RuntimeCosts())) for m in measured]
    judged = "busy" if measured and all(m.judged == "busy" for m in measured) else "iteration"
    kept = "kept from the profile, not fitted: replayed ranks post and wait for no message"
    record: dict[str, Any] = {
        "method": ("one bounded least-squares fit of op overhead and the stage scale on per-action durations of "
                   "ranks replayed alone and the profiler's stage-sized range timings, the message terms and "
                   "links kept as the profile has them (docs/model.md sections 4 and 7)") if keep_messages else
                  "one bounded least-squares fit of op overhead, message overhead, per-MiB message cost and the "
                  "stage scale on per-action durations and the profiler's stage-sized range timings "
                  "(docs/model.md sections 4 and 7)",
        **(how or {}),
        "scales": scales,
        "judged": "busy_ms" if judged == "busy" else "iteration_ms",
        "terms": {
            "op_overhead_ms": "per-action durations measured on umsearch's runtime"
                              + (", every rank replayed alone" if keep_messages else ""),
            "message_overhead_ms": kept if keep_messages else
                                   "per-action durations of actions that send or need cross-rank messages",
            "message_overhead_ms_per_mib": kept if keep_messages else
                                           "per-action durations, by the full size of their messages",
            "stage_scale" if scales != "ranges" else "ranges":
                "per-action durations by stage layer count, and the profiler's stage-sized ranges timed end to end"
                if scales != "none" else "not fitted (s = 1)",
            **({"links": "kept from the profile (measured or stated there), not fitted"} if keep_messages else {}),
        },
        "plans": [m.name for m in measured], "actions": fit.actions, "range_rows": fit.range_rows,
        "rms_residual_ms": fit.rms_residual_ms,
        "in_sample_mape_percent": _mape(inside), "held_out_mape_percent": _mape(held),
        "held_out": held,
    }  # fmt: skip
    calibrated = dataclasses.replace(profile, runtime=fit.runtime(record))
    report = {**record, "op_overhead_ms": fit.op_overhead_ms, "message_overhead_ms": fit.message_overhead_ms,
              "message_overhead_ms_per_mib": fit.message_overhead_ms_per_mib,
              "stage_scale": [list(p) for p in fit.stage_scale], "ranges": [list(r) for r in fit.ranges],
              "mape_percent_bare": _mape(bare), "mape_percent": _mape(inside),
              "probe_rows": [{"probe": m.name, "measured_ms": m.iteration_ms, "predicted_bare_ms": b["predicted_ms"],
                              "predicted_ms": i["predicted_ms"],
                              "predicted_held_out_ms": next((h["predicted_ms"] for h in held if h["plan"] == m.name),
                                                            None)}
                             for m, b, i in zip(measured, bare, inside, strict=True)]}  # fmt: skip
    return calibrated, report
