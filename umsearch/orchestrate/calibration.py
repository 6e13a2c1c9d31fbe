"""Calibrating the runtime's own costs (MODEL.md section 7): ``op_overhead_ms`` and ``message_overhead_ms``.

A profile times layers alone; the runtime adds a fixed cost to every action
(autograd bookkeeping, stamps, Python) and to every cross-rank message the
action sends or needs (posting, waiting, assembling). Both are fitted here
from short runs of the real runtime: a few probe plans with many and few
microbatches (GPipe, 1F1B, interleaved, and a split-backward schedule when the
profile has I/W times), each action's measured duration (median over the
rounds) against the profile's time for it:

    measured - base = op_overhead_ms + message_overhead_ms x messages

by least squares over every action of every probe, both values kept
non-negative. The fit is pure (:func:`fit_overheads`); :func:`calibrate` runs
the probes (through :mod:`umsearch.runtime.fidelity`, so torch is imported
only there).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from umsearch.core.cost import CostModel
from umsearch.core.deps import Dependencies
from umsearch.core.errors import ProfilingError
from umsearch.core.plan import Plan, equal_split, placed_plan
from umsearch.core.profile import Profile, RuntimeCosts
from umsearch.core.schedules import PEER_SCHEDULES
from umsearch.search.partition import balanced_cuts, stage_work

PROBES: tuple[tuple[str, int, int], ...] = (
    ("GPipe", 1, 2), ("GPipe", 1, 16), ("1F1B", 1, 8), ("Interleaved1F1B", 2, 4), ("ZBVZeroBubble", 2, 8),
)  # fmt: skip
"""``(schedule, stages per rank, microbatches)`` of the probe plans."""


@dataclass(frozen=True, kw_only=True)
class Sample:
    """One action of a probe: what it measured, what the profile says, how many messages it handles."""

    measured_ms: float
    base_ms: float
    messages: int


@dataclass(frozen=True, kw_only=True)
class Fit:
    """The fitted overheads and how well they explain the samples."""

    op_overhead_ms: float
    message_overhead_ms: float
    rms_residual_ms: float
    """Root mean square of what the fit leaves unexplained, per action."""
    samples: int


def _lstsq(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """``y = a + c x`` by least squares (``c = 0`` when x does not vary)."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    c = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx > 0 else 0.0
    return my - c * mx, c


def fit_overheads(samples: Sequence[Sample]) -> Fit:
    """Least squares of ``measured - base = op + msg x messages``, with ``op, msg >= 0``.

    Where the unconstrained optimum has a negative value, that value is 0 and
    the other is refitted alone (the constrained optimum of a 2-variable
    problem lies on that edge).
    """
    if not samples:
        raise ProfilingError("no action was measured; the probes did not run")
    xs = [float(s.messages) for s in samples]
    ys = [s.measured_ms - s.base_ms for s in samples]
    op, msg = _lstsq(xs, ys)
    if msg < 0:
        op, msg = statistics.fmean(ys), 0.0
    if op < 0:
        sxx = sum(x * x for x in xs)
        op, msg = 0.0, max(0.0, sum(x * y for x, y in zip(xs, ys, strict=True)) / sxx) if sxx > 0 else 0.0
    op = max(op, 0.0)
    rms = statistics.fmean((y - op - msg * x) ** 2 for x, y in zip(xs, ys, strict=True)) ** 0.5
    return Fit(op_overhead_ms=op, message_overhead_ms=msg, rms_residual_ms=rms, samples=len(samples))


def probe_plans(profile: Profile, ranks: int = 2, batch: int = 16) -> list[tuple[str, Plan]]:
    """The probe plans this profile allows (the split one only with I/W times)."""
    tables = CostModel(profile).tables(batch)
    out = []
    for name, v, m in PROBES:
        peer = PEER_SCHEDULES[name]
        if peer.split_backward and not all(lay.has_split for lay in profile.layers):
            continue
        if peer.accepts(ranks, v, m) is not None or ranks * v > profile.num_layers or m > batch:
            continue
        sizes = equal_split(batch, m)
        cuts = balanced_cuts(stage_work(tables, sizes[0]), ranks * v)
        plan = placed_plan(cuts, peer.stage_ranks(ranks, v), batch, [sizes] * (ranks * v),
                           peer.generate(ranks, v, m))  # fmt: skip
        out.append((f"{name} x{m}" + (f" v{v}" if v > 1 else ""), plan))
    return out


def action_samples(plan: Plan, cost: CostModel, rounds: Sequence[Any]) -> list[Sample]:
    """One sample per action of ``plan``: its median measured duration over ``rounds`` (StepResults)."""
    from umsearch.core.actions import Action
    from umsearch.sim.reference import ActionTiming

    timing = ActionTiming(plan, cost, Dependencies(plan))
    durations: dict[Action, list[float]] = {}
    for step in rounds:
        for r in step.records:
            durations.setdefault(Action(r.stage, r.kind, r.mb), []).append(r.end_ms - r.start_ms)
    return [Sample(measured_ms=statistics.median(d), base_ms=timing.base_ms(a), messages=timing.messages(a))
            for a, d in durations.items()]  # fmt: skip


def calibrate(profile: Profile, factory: Any, *, rounds: int = 7, ranks: int = 2, batch: int = 16,
              threads: int | None = 1) -> tuple[Profile, dict[str, Any]]:  # fmt: skip
    """Run the probes, fit the overheads; the profile with them and a report of the fit.

    ``factory`` builds the profiled model in every rank (picklable). The
    report gives the fit, and per probe the measured median iteration and
    its prediction without and with the fitted overheads.
    """
    from umsearch.runtime.config import LaunchConfig, RunConfig
    from umsearch.runtime.fidelity import Contender, measure_rounds
    from umsearch.sim.reference import simulate

    bare = dataclasses.replace(profile, runtime=RuntimeCosts())
    cost = CostModel(bare)
    probes = probe_plans(profile, ranks, batch)
    cfg = RunConfig(warmup_steps=2, launch=LaunchConfig(threads=threads, timeout_s=600))
    steps = measure_rounds([Contender(name=n, plan=p, cost=cost, factory=factory) for n, p in probes], cfg,
                           rounds=rounds)  # fmt: skip
    samples = [s for (_, p), st in zip(probes, steps, strict=True) for s in action_samples(p, cost, st)]
    fit = fit_overheads(samples)
    how = {"method": "least squares on per-action durations of the probe plans (MODEL.md section 7)",
           "probes": [n for n, _ in probes], "ranks": ranks, "global_batch": batch, "rounds": rounds,
           "threads": threads, "actions": fit.samples, "rms_residual_ms": fit.rms_residual_ms}  # fmt: skip
    calibrated = dataclasses.replace(profile, runtime=RuntimeCosts(
        op_overhead_ms=fit.op_overhead_ms, message_overhead_ms=fit.message_overhead_ms, calibration=how))
    after = CostModel(calibrated)
    rows: list[dict[str, Any]] = []
    for (name, plan), st in zip(probes, steps, strict=True):
        measured = statistics.median(s.iteration_ms for s in st)
        rows.append({"probe": name, "measured_ms": measured, "predicted_bare_ms": simulate(plan, cost).iteration_ms,
                     "predicted_ms": simulate(plan, after).iteration_ms})  # fmt: skip

    def mape(key: str) -> float:
        return 100.0 * statistics.fmean(abs(r[key] - r["measured_ms"]) / r["measured_ms"] for r in rows)

    report = {**how, "op_overhead_ms": fit.op_overhead_ms, "message_overhead_ms": fit.message_overhead_ms,
              "mape_percent_bare": mape("predicted_bare_ms"), "mape_percent": mape("predicted_ms"),
              "probe_rows": rows}  # fmt: skip
    return calibrated, report
