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

:func:`calibrate_replay` (``umsearch calibrate --replay``) runs the same
probes one rank at a time, alone on one device
(:func:`umsearch.runtime.replay.replay_rank`: every message to the rank made
up, every message from it dropped), so it needs no process group and no
device per rank; it fits the compute terms only (op overhead, the scales),
keeps the profile's message terms and links, and reports the busy-time error
of every probe held out.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from umsearch.core.cost import CostModel
from umsearch.core.plan import Plan, equal_split, placed_plan
from umsearch.core.profile import Profile, RuntimeCosts
from umsearch.core.schedules import PEER_SCHEDULES
from umsearch.errors import PlanError
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


def gpu_count() -> int:
    """GPUs torch sees on this machine (0 without CUDA)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def require_this_machine(profile: Profile, command: str, *, device_type: str = "cpu",
                         gpus_needed: int | None = None) -> None:  # fmt: skip
    """Refuse to measure plans for a profile measured on another device type than the one they run on here
    (``device_type``: ``cpu`` for processes on this machine's CPU, ``cuda`` for one GPU per process):
    the fit would blame the runtime for the difference between the devices
    (:func:`umsearch.runtime.preflight.check_measured_on`).

    ``gpus_needed``: on ``cuda``, the GPUs one plan needs (one per rank); fewer on this machine is refused
    with the way to measure ranks one at a time (``umsearch replay``, ``umsearch calibrate --replay``).
    A profile measured on CUDA is refused on CPU with the same pointer.
    """
    from umsearch.runtime.preflight import check_measured_on, profile_device_type

    on = check_measured_on(profile, device_type=device_type, precision=None)
    alone = ("`umsearch replay PLAN --device cuda` times one rank at a time on one GPU, and `umsearch calibrate "
             "PROFILE --replay` fits the profile's compute terms that way")  # fmt: skip
    if on.device_differs:
        where = "this machine's CPU" if device_type == "cpu" else "this machine's GPUs"
        hint = f"; {alone}" if profile_device_type(profile) == "cuda" else ""
        raise PlanError(f"{command} runs its plans on {where}, but the profile was measured on "
                        f"{profile.device}: the fit would take the devices' difference for runtime costs; run "
                        f"{command} on the machine the profile was measured on, or profile here first{hint}")  # fmt: skip
    if device_type == "cuda" and gpus_needed is not None:
        have = gpu_count()
        if have < gpus_needed:
            raise PlanError(f"{command} runs every plan with one GPU per rank: it needs {gpus_needed} GPUs, and torch "
                            f"sees {have} on this machine; run it where {gpus_needed} GPUs are visible, or with "
                            f"fewer: {alone}")  # fmt: skip


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


# ---------------------------------------------------------------------------------------------------- replayed
@dataclass(frozen=True)
class _Round:
    """One iteration of every replayed rank of a plan, as :func:`~umsearch.orchestrate.fit.action_samples`
    reads a round."""

    records: tuple[Any, ...]


def replayed_plan(name: str, plan: Plan, profile: Profile, replays: Sequence[Any]) -> MeasuredPlan:
    """A probe whose every rank was replayed alone (:class:`~umsearch.runtime.replay.RankReplay`, one per
    rank), as the fit takes it: each action's median over the kept iterations, charged no message (a
    replayed rank posts and waits for none), judged by the sum of the ranks' median busy times."""
    kept = [r.kept for r in replays]
    rounds = [_Round(records=tuple(a for steps in kept for a in steps[i].actions)) for i in range(min(map(len, kept)))]
    samples = tuple(dataclasses.replace(s, messages=0, mib=0.0) for s in action_samples(name, plan, profile, rounds))
    return MeasuredPlan(name=name, plan=plan, iteration_ms=sum(r.measured_busy_ms for r in replays), samples=samples,
                        judged="busy")  # fmt: skip


def calibrate_replay(profile: Profile, factory: Any, *, rounds: int = 7, ranks: int = 2, batch: int = 16,
                     threads: int | None = 1, scales: Scales = "stage_scale", device: Any = "cpu",
                     on_probe: Callable[[int, int, str], None] | None = None) -> tuple[Profile, dict[str, Any]]:  # fmt: skip
    """:func:`calibrate` with every probe rank replayed alone on ``device`` instead of run among its peers.

    Each rank of each probe runs ``rounds + 1`` iterations (the first, tallied, is warm-up) through
    :func:`umsearch.runtime.replay.replay_rank`, in the profile's precision. The fit
    (:func:`~umsearch.orchestrate.fit.fit_report` with ``keep_messages``) gives the compute terms (op
    overhead, stage scale or ranges); the message terms and the links stay as the profile has them.
    ``on_probe(done, total, name)`` is told before each probe. On ``cuda`` (one GPU, a CUDA profile) the
    path is the same; it has not been exercised on a GPU by the tests.
    """
    import torch

    from umsearch.runtime.config import LaunchConfig, RunConfig
    from umsearch.runtime.preflight import check_measured_on
    from umsearch.runtime.replay import replay_rank

    where = torch.device(device)
    require_this_machine(profile, "calibrate --replay", device_type=where.type)
    on = check_measured_on(profile, device_type=where.type, precision=None)
    probes = probe_plans(profile, ranks, batch)
    cfg = RunConfig(precision=on.precision, launch=LaunchConfig(threads=threads if where.type == "cpu" else None))
    measured = []
    for i, (name, plan) in enumerate(probes):
        if on_probe is not None:
            on_probe(i, len(probes), name)
        replays = [replay_rank(plan, factory, r, device=where, cfg=cfg, steps=rounds + 1) for r in range(plan.ranks)]
        measured.append(replayed_plan(name, plan, profile, replays))
    how = {"source": "probe plans, every rank replayed alone (umsearch calibrate --replay)", "ranks": ranks,
           "global_batch": batch, "rounds": rounds, "threads": cfg.launch.threads, "warmup_steps": 1,
           "device": str(where), "precision": on.precision or "fp32",
           "kept_from_profile": {"message_overhead_ms": profile.runtime.message_overhead_ms,
                                 "message_overhead_ms_per_mib": profile.runtime.message_overhead_ms_per_mib,
                                 "links": "the profile's link and links, unchanged"}}  # fmt: skip
    return fit_report(profile, measured, scales=scales, how=how, keep_messages=True)
