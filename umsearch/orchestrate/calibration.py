"""Calibrating the runtime's own costs (docs/model.md sections 4 and 7, version 2.1).

A profile times layers alone; the runtime adds a fixed cost to every action
(autograd bookkeeping, stamps, Python), a cost to every cross-rank message an
action sends or needs (posting, waiting, assembling) that grows with the
message's size, and layers run together in one stage take longer or shorter
than their sum (caches, memory traffic). :func:`calibrate` runs a few short
probe plans with many and few microbatches (GPipe, 1F1B, interleaved, and a
split-backward schedule when the profile has I/W times) on the real runtime
and fits every term at once (:func:`umsearch.orchestrate.fit.fit_report`)
from the probes' per-action durations and the stage-sized ranges the
profiler timed end to end. The report gives the iteration-time error of
every probe predicted by a fit of the *other* probes (leave one plan out).
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any

from umsearch.core.cost import CostModel
from umsearch.core.errors import PlanError
from umsearch.core.plan import Plan, equal_split, placed_plan
from umsearch.core.profile import Profile, RuntimeCosts
from umsearch.core.schedules import PEER_SCHEDULES
from umsearch.orchestrate.fit import MeasuredPlan, Scales, action_samples, fit_report
from umsearch.search.partition import stage_cuts

PROBES: tuple[tuple[str, int, int], ...] = (
    ("GPipe", 1, 2), ("GPipe", 1, 16), ("1F1B", 1, 8), ("Interleaved1F1B", 2, 4), ("ZBVZeroBubble", 2, 8),
)  # fmt: skip
"""``(schedule, stages per rank, microbatches)`` of the probe plans."""


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
        cuts = stage_cuts(tables, sizes[0], ranks * v)
        plan = placed_plan(cuts, peer.stage_ranks(ranks, v), batch, [sizes] * (ranks * v),
                           peer.generate(ranks, v, m))  # fmt: skip
        out.append((f"{name} x{m}" + (f" v{v}" if v > 1 else ""), plan))
    return out


def measured_plan(name: str, plan: Plan, profile: Profile, rounds: Any) -> MeasuredPlan:
    """A plan's measured rounds (StepResults) as the fit takes them."""
    return MeasuredPlan(name=name, plan=plan, iteration_ms=statistics.median(s.iteration_ms for s in rounds),
                        samples=action_samples(name, plan, profile, rounds))  # fmt: skip


def require_this_machine(profile: Profile, command: str) -> None:
    """Refuse to fit a profile measured on another device type than the CPU the probes run on here: the
    fit would blame the runtime for the difference between the devices
    (:func:`umsearch.runtime.preflight.check_measured_on`)."""
    from umsearch.runtime.preflight import check_measured_on

    on = check_measured_on(profile, device_type="cpu", precision=None)
    if on.device_differs:
        raise PlanError(f"{command} runs its plans on this machine's CPU, but the profile was measured on "
                        f"{profile.device}: the fit would take the devices' difference for runtime costs; run "
                        f"{command} on the machine the profile was measured on, or profile here first")  # fmt: skip


def calibrate(profile: Profile, factory: Any, *, rounds: int = 7, ranks: int = 2, batch: int = 16,
              threads: int | None = 1, scales: Scales = "stage_scale") -> tuple[Profile, dict[str, Any]]:  # fmt: skip
    """Run the probes, fit every runtime term; the calibrated profile and the fit's report.

    ``factory`` builds the profiled model in every rank (picklable). The report
    (:func:`~umsearch.orchestrate.fit.fit_report`) gives every term, per probe
    the measured median iteration and its prediction bare, calibrated and held
    out, and the in-sample and held-out MAPE; the profile keeps it as
    ``runtime.calibration`` with how it was measured.
    """
    from umsearch.runtime.config import LaunchConfig, RunConfig
    from umsearch.runtime.fidelity import Contender, measure_rounds

    require_this_machine(profile, "calibrate")
    bare = CostModel(dataclasses.replace(profile, runtime=RuntimeCosts()))  # measuring needs no prediction
    probes = probe_plans(profile, ranks, batch)
    cfg = RunConfig(warmup_steps=2, launch=LaunchConfig(threads=threads, timeout_s=600))
    steps = measure_rounds([Contender(name=n, plan=p, cost=bare, factory=factory) for n, p in probes], cfg,
                           rounds=rounds)  # fmt: skip
    measured = [measured_plan(n, p, profile, st) for (n, p), st in zip(probes, steps, strict=True)]
    how = {"source": "probe plans run on umsearch's runtime (umsearch calibrate)", "ranks": ranks,
           "global_batch": batch, "rounds": rounds, "threads": threads, "warmup_steps": cfg.warmup_steps}  # fmt: skip
    return fit_report(profile, measured, scales=scales, how=how)
