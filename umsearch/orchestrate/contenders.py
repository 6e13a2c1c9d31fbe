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

The measurement is a function (:data:`MeasureFn`), so that the tune loop's
decisions can be tested with a stand-in for the machine.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from umsearch.core.plan import Plan
from umsearch.runtime.config import RunConfig
from umsearch.runtime.factory import ModelFactory
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
class Measured:
    """What the machine measured of one contender, per round."""

    step_ms: tuple[float, ...]
    """Barrier to the end of the optimizer step, slowest rank, every measured round."""
    steps: tuple[StepResult, ...] = ()
    """umsearch's runtime only: every round's iteration with all ranks' action records."""


MeasureFn = Callable[[Sequence[Entry], int], list[Measured]]
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
        the stage objects of any contender cut and placed alike (made first, see :func:`mixed_worker`).
        """
        from torch.distributed.pipelining import PipelineStage

        from umsearch.runtime.factory import stage_module

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

        from umsearch.runtime.plan_schedule import PlanSchedule
        from umsearch.runtime.zero1 import make_optimizer

        self.plan, self.cfg = plan, shared.cfg
        self.model, mods, stages = shared.stages(plan, schedule is not None)
        mine = plan.stages_of(shared.rank)
        self.first, self.last = 0 in mine, plan.num_stages - 1 in mine
        self.records = schedule is None  # PlanSchedule brings back every action's times
        if schedule is None:
            self.sched: Any = PlanSchedule(stages, plan, self.model.loss, precision=shared.cfg.precision,
                                           comm=shared.comm(plan) if plan.ranks > 1 else None)  # fmt: skip
        else:
            cls = get_schedule_class(schedule)
            multi = issubclass(cls, PipelineScheduleMulti)
            self.sched = cls(stages if multi else stages[0], len(plan.stages[0].forward), loss_fn=self.model.loss)
        self.opt = make_optimizer(shared.cfg.optimizer, shared.cfg.lr, [list(m.parameters()) for m in mods])

    def step(self, step: int) -> Any:
        """Iteration ``step`` (its batch fixed by the run's seed): PlanSchedule's stats with the wall time as
        ``step_ms`` (umsearch), or the wall time in ms (torch)."""
        import torch
        import torch.distributed as dist

        x, y = self.model.make_batch(self.plan.global_batch,
                                     torch.Generator().manual_seed(self.cfg.batch_seed(step)))  # fmt: skip
        if self.opt is not None:
            self.opt.zero_grad(set_to_none=True)
        dist.barrier()
        t0 = time.perf_counter()
        self.sched.step(*((x,) if self.first else ()), target=y if self.last else None,
                        losses=[] if self.last else None)  # fmt: skip
        if self.opt is not None:
            self.opt.step()
        ms = (time.perf_counter() - t0) * 1e3
        if self.records:
            assert self.sched.stats is not None
            return dataclasses.replace(self.sched.stats, step_ms=ms)
        return ms


def mixed_worker(rank: int, world: int, jobs: Sequence[tuple[str, Plan, str | None]], factory: ModelFactory,
                 cfg: RunConfig, rounds: int) -> list[list[Any]]:  # fmt: skip
    """Launch target: per round, per job (job order), this rank's stats (umsearch) or wall ms (torch).

    Every job runs ``cfg.warmup_steps`` unmeasured iterations first. A data-parallel plan (which
    ``PlanSchedule`` does not run) runs on umsearch's own launcher session instead.
    """
    from umsearch.runtime.fidelity import rotation

    runners = make_runners(rank, world, jobs, factory, cfg)
    for runner in runners:
        for step in range(cfg.warmup_steps):
            runner.step(step)
    out: list[list[Any]] = []
    for r in range(rounds):
        measured: list[Any] = [None] * len(jobs)
        for j in rotation(len(jobs), r):
            measured[j] = runners[j].step(cfg.warmup_steps + r)
        out.append(measured)
    return out


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
    """The real measurement: one launch of ``mixed_worker`` on the plans' ranks (all entries share them)."""

    def measure(entries: Sequence[Entry], rounds: int) -> list[Measured]:
        from umsearch.runtime.launch import launch

        ranks = {e.plan.ranks for e in entries}
        if len(ranks) != 1:
            raise ValueError(f"contenders on different rank counts {sorted(ranks)} cannot run in one launch")
        world = ranks.pop()
        jobs = [(e.runtime, e.plan, e.schedule) for e in entries]  # checked Plans, pickled to the ranks
        per_rank = launch(mixed_worker, world, (jobs, factory, cfg, rounds), cfg.launch)
        out = []
        for i, e in enumerate(entries):
            if e.runtime == "umsearch":
                steps = tuple(merge_step([per_rank[rk][r][i] for rk in range(world)]) for r in range(rounds))
                out.append(Measured(step_ms=tuple(s.step_ms for s in steps), steps=steps))
            else:
                out.append(Measured(step_ms=tuple(max(per_rank[rk][r][i] for rk in range(world))
                                                  for r in range(rounds))))  # fmt: skip
        return out

    return measure
