"""Measuring contenders on the machine: one runtime, torch's ``PipelineStage``s, two kinds of schedule.

A plan runs through :class:`~umsearch.pipelining.PlanSchedule` (umsearch's
executor driving torch's stage objects), a torch schedule through its own
class; contenders that cut and place the model alike share the very same
stage objects (and model) in a rank, so "a plan against a torch schedule"
differs in the schedule only, not in the runtime or the stages.

One launch runs every contender in the same rank processes: after warm-up,
each round runs every contender once, in an order rotated by one every round
(:func:`umsearch.runtime.fidelity.rotation`), so that no contender always runs
first or last and a machine that drifts moves all of them alike. The time of
an iteration is the same for both runtimes: from a barrier to the end of the
optimizer step, the slowest rank's (as ``benchmarks/torch_peers.py`` times
them). A plan on umsearch's runtime also brings back every action's times,
which the refit needs; torch's schedules give no per-action times.

Every contender's peak memory is measured once per rank, on its last warm-up
iteration (an extra one where there is no warm-up), for both runtimes alike
(:func:`umsearch.runtime.worker.peak_of`): on CPU the tally of
:mod:`umsearch.runtime.memory_tally` (parameters, gradients, optimizer states
and the tensors autograd saves; its hooks are thread-local, so they count
inside torch's schedule classes as inside ``PlanSchedule``), on CUDA the
allocator's peak. The tune loop drops the contenders that do not fit its
memory limit on that figure.

The measurement is a function (:data:`MeasureFn`), so that the tune loop's
decisions can be tested with a stand-in for the machine.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from umsearch.core.deps import check_deadlock
from umsearch.core.plan import Plan
from umsearch.core.plan_rules import validate_plan
from umsearch.runtime.config import RunConfig
from umsearch.runtime.model_source import ModelFactory
from umsearch.runtime.run_plan import StepResult, merge_step

Runtime = Literal["umsearch", "torch"]


@dataclass(frozen=True, kw_only=True)
class Entry:
    """One contender to measure."""

    name: str
    plan: Plan
    runtime: Runtime
    """``umsearch``: umsearch's executor runs the plan; ``torch``: torch's ``PipelineSchedule`` runs
    ``schedule`` on the plan's partition and microbatch count."""
    schedule: str | None = None


@dataclass(frozen=True, kw_only=True)
class ContenderMeasurement:
    """What the machine measured of one contender, per round."""

    step_ms: tuple[float, ...]
    """Barrier to the end of the optimizer step, slowest rank, every measured round."""
    steps: tuple[StepResult, ...] = ()
    """umsearch's runtime only: every round's iteration with all ranks' action records."""
    peak_bytes: tuple[int, ...] = ()
    """Per pipeline rank, the peak memory of one warm-up iteration (the largest of the rank's replicas): on CPU
    the tally's (parameters, gradients, optimizer states, saved tensors), on CUDA the allocator's; empty where
    not measured."""


MeasureFn = Callable[[Sequence[Entry], int], list[ContenderMeasurement]]
"""``measure(entries, rounds)``: every entry measured ``rounds`` times, in entry order."""


class _Shared:
    """This rank's stage objects per partition: one model, its stage modules and torch ``PipelineStage``s for
    every contender that cuts and places the model alike (torch's schedule and ``PlanSchedule`` share them),
    and the executor's links per set of links (process groups are collective to create: made once)."""

    def __init__(self, rank: int, factory: ModelFactory, cfg: RunConfig) -> None:
        from umsearch.runtime.launch import local_rank_device

        self.rank, self.factory, self.cfg = rank, factory, cfg
        self.device = local_rank_device(cfg.launch.backend)
        self.parts: dict[tuple[Any, ...], tuple[Any, list[Any], list[Any]]] = {}
        self.comms: dict[Any, Any] = {}

    def stages(self, plan: Plan, torch_schedule: bool) -> tuple[Any, list[Any], list[Any]]:
        """(model, stage modules, PipelineStages) of this rank's stages of ``plan``.

        torch's stages keep the buffers of the microbatch shape they first ran, so torch's schedules share
        stage objects only with the same microbatches; ``PlanSchedule`` never uses those buffers and takes
        the stage objects of any contender cut and placed alike (made first, see :func:`make_runners`).
        """
        from torch.distributed.pipelining import PipelineStage

        from umsearch.runtime.model_source import stage_module

        cut = (plan.num_stages, tuple((st.lo, st.hi, st.rank) for st in plan.stages))
        key = (cut, plan.stages[0].forward if torch_schedule else None)
        if not torch_schedule:
            key = next((k for k in self.parts if k[0] == cut), key)
        if key not in self.parts:
            model = self.factory()
            mine = plan.stages_of(self.rank)
            mods = [stage_module(model, plan.stages[j].lo, plan.stages[j].hi).to(self.device) for j in mine]
            stages = [PipelineStage(m, j, plan.num_stages, self.device) for j, m in zip(mine, mods, strict=True)]
            self.parts[key] = (model, mods, stages)
        return self.parts[key]

    def comm(self, plan: Plan) -> Any:
        """The executor's links for ``plan`` (shared by plans with the same links)."""
        from umsearch.runtime.comm import plan_links
        from umsearch.runtime.plan_schedule import stage_comm

        key = plan_links(plan)
        if key not in self.comms:
            self.comms[key] = stage_comm(plan, None, self.device)
        return self.comms[key]


class _ScheduleJob:
    """One contender on torch's ``PipelineStage``s in this rank: the plan through ``PlanSchedule`` (umsearch),
    or torch's schedule class on the peer plan's partition and microbatch count (torch). Both time an
    iteration alike: from a barrier to the end of the optimizer step."""

    def __init__(self, plan: Plan, schedule: str | None, shared: _Shared) -> None:
        from torch.distributed.pipelining.schedules import PipelineScheduleMulti, get_schedule_class

        from umsearch.runtime.checkpointing import stage_layers
        from umsearch.runtime.plan_schedule import PlanSchedule
        from umsearch.runtime.zero1 import make_optimizer

        self.plan, self.cfg, self.rank, self.device = plan, shared.cfg, shared.rank, shared.device
        self.model, mods, stages = shared.stages(plan, schedule is not None)
        self.params = [p for m in mods for p in m.parameters()]
        mine = plan.stages_of(shared.rank)
        self.first, self.last = 0 in mine, plan.num_stages - 1 in mine
        self.records = schedule is None  # PlanSchedule brings back every action's times
        if schedule is None:
            self.sched: Any = PlanSchedule(stages, plan, self.model.loss, precision=shared.cfg.precision,
                                           comm=shared.comm(plan) if plan.ranks > 1 else None,
                                           checked=True)  # the launcher's checked Plan, pickled  # fmt: skip
        else:
            cls = get_schedule_class(schedule)
            multi = issubclass(cls, PipelineScheduleMulti)
            self.sched = cls(stages if multi else stages[0], len(plan.stages[0].forward), loss_fn=self.model.loss)
        self.opt = make_optimizer(shared.cfg.optimizer, shared.cfg.lr, [list(m.parameters()) for m in mods])
        # torch's schedules know nothing of ``recompute``: a peer plan with full activation checkpointing runs
        # with every layer of its recomputing stages checkpointed (PlanSchedule recomputes them itself).
        self.ac_layers = stage_layers(mods, [plan.stages[j].recompute for j in mine]) if schedule else []

    def step(self, step: int) -> Any:
        """Iteration ``step`` (its batch fixed by the run's seed): PlanSchedule's stats with the wall time as
        ``step_ms`` (umsearch), or the wall time in ms (torch)."""
        import torch
        import torch.distributed as dist

        from umsearch.runtime.checkpointing import checkpointed

        x, y = self.model.make_batch(self.plan.global_batch,
                                     torch.Generator().manual_seed(self.cfg.batch_seed(step)))  # fmt: skip
        if self.opt is not None:
            self.opt.zero_grad(set_to_none=True)
        dist.barrier()
        t0 = time.perf_counter()
        with checkpointed(self.ac_layers):
            self.sched.step(*((x,) if self.first else ()), target=y if self.last else None,
                            losses=[] if self.last else None)  # fmt: skip
        if self.opt is not None:
            self.opt.step()
        ms = (time.perf_counter() - t0) * 1e3
        if self.records:
            assert self.sched.stats is not None
            return dataclasses.replace(self.sched.stats, step_ms=ms)
        return ms

    def peak_step(self, step: int) -> tuple[Any, int]:
        """:meth:`step` and this rank's peak memory in it (:func:`umsearch.runtime.worker.peak_of`)."""
        from umsearch.runtime.worker import peak_of

        return peak_of(lambda: self.step(step), self.params, self.opt, self.device)


@dataclass(frozen=True, kw_only=True)
class RankRounds:
    """What one rank's process measured: every job's peak memory and every round's results."""

    peaks: tuple[tuple[int, int], ...]
    """Per job (job order): (pipeline rank, peak bytes of one warm-up iteration)."""
    rounds: list[list[Any]]
    """Per round, per job (job order): this rank's stats (umsearch) or wall ms (torch)."""


def mixed_worker(rank: int, world: int, jobs: Sequence[tuple[str, Plan, str | None]], factory: ModelFactory,
                 cfg: RunConfig, rounds: int) -> list[list[Any]]:  # fmt: skip
    """Launch target: per round, per job (job order), this rank's stats (umsearch) or wall ms (torch)
    (:func:`measured_worker`'s rounds)."""
    return measured_worker(rank, world, jobs, factory, cfg, rounds).rounds


def measured_worker(rank: int, world: int, jobs: Sequence[tuple[str, Plan, str | None]], factory: ModelFactory,
                    cfg: RunConfig, rounds: int) -> RankRounds:  # fmt: skip
    """Launch target: every job's peak memory, then per round, per job (job order), this rank's stats
    (umsearch) or wall ms (torch).

    Every job runs ``cfg.warmup_steps`` unmeasured iterations first (at least one), the last of them with its
    peak memory measured. A data-parallel plan (which ``PlanSchedule`` does not run) runs on umsearch's own
    launcher session instead.
    """
    return measure_runners(make_runners(rank, world, jobs, factory, cfg), cfg, rounds)


def measure_runners(runners: Sequence[Any], cfg: RunConfig, rounds: int) -> RankRounds:
    """:func:`measured_worker`'s measurement of ready runners (each with ``step``, ``rank`` and
    ``peak_step``): warm-up with the last step's peak, then ``rounds`` rounds in rotated order."""
    from umsearch.runtime.fidelity import rotation

    peaks = []
    for runner in runners:
        for step in range(cfg.warmup_steps - 1):
            runner.step(step)
        peaks.append((runner.rank, runner.peak_step(max(cfg.warmup_steps - 1, 0))[1]))
    out: list[list[Any]] = []
    for r in range(rounds):
        measured: list[Any] = [None] * len(runners)
        for j in rotation(len(runners), r):
            measured[j] = runners[j].step(cfg.warmup_steps + r)
        out.append(measured)
    return RankRounds(peaks=tuple(peaks), rounds=out)


def make_runners(rank: int, world: int, jobs: Sequence[tuple[str, Plan, str | None]], factory: ModelFactory,
                 cfg: RunConfig) -> list[Any]:  # fmt: skip
    """This rank's runner of every job (job order), each with ``step(step)``; collective (every rank makes
    the same groups in the same order)."""
    from umsearch.runtime.worker import RankSession

    shared = _Shared(rank, factory, cfg)
    runners: list[Any] = [None] * len(jobs)
    # torch's jobs first, so that a plan cut like a torch schedule's runs on that schedule's very stage objects.
    for i in sorted(range(len(jobs)), key=lambda i: jobs[i][0] != "torch"):
        kind, plan, schedule = jobs[i]
        if kind == "umsearch" and plan.data_parallel > 1:
            runners[i] = RankSession(rank, world, plan, factory, cfg, shared.comms)
        else:
            assert (kind == "torch") == (schedule is not None)
            runners[i] = _ScheduleJob(plan, schedule, shared)
    return runners


def machine(factory: ModelFactory, cfg: RunConfig) -> MeasureFn:
    """The real measurement: one launch of :func:`measured_worker` on the plans' ranks (all entries share them)."""

    def measure(entries: Sequence[Entry], rounds: int) -> list[ContenderMeasurement]:
        from umsearch.runtime.launch import launch

        ranks = {e.plan.ranks for e in entries}
        if len(ranks) != 1:
            raise ValueError(f"contenders on different rank counts {sorted(ranks)} cannot run in one launch")
        world = ranks.pop()
        for e in entries:  # checked here, once (a plan passed before costs nothing); the ranks check none
            check_deadlock(validate_plan(e.plan))
        jobs = [(e.runtime, e.plan, e.schedule) for e in entries]  # checked Plans, pickled to the ranks
        got: list[RankRounds] = launch(measured_worker, world, (jobs, factory, cfg, rounds), cfg.launch)
        per_rank = [g.rounds for g in got]
        out = []
        for i, e in enumerate(entries):
            peaks = rank_peaks([g.peaks[i] for g in got])
            if e.runtime == "umsearch":
                steps = tuple(merge_step([per_rank[rk][r][i] for rk in range(world)]) for r in range(rounds))
                out.append(ContenderMeasurement(step_ms=tuple(s.step_ms for s in steps), steps=steps, peak_bytes=peaks))
            else:
                out.append(ContenderMeasurement(step_ms=tuple(max(per_rank[rk][r][i] for rk in range(world))
                                                  for r in range(rounds)), peak_bytes=peaks))  # fmt: skip
        return out

    return measure


def rank_peaks(peaks: Sequence[tuple[int, int]]) -> tuple[int, ...]:
    """Per pipeline rank, the largest peak of its processes (``(pipeline rank, bytes)`` per process)."""
    ranks = max((r for r, _ in peaks), default=-1) + 1
    return tuple(max(b for r, b in peaks if r == k) for k in range(ranks))
