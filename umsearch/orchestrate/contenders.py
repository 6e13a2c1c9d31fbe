"""Measuring contenders on the machine: umsearch's runtime for plans, torch's own runtime for torch schedules.

One launch runs every contender in the same rank processes: after warm-up,
each round runs every contender once, in an order rotated by one every round
(:func:`umsearch.runtime.fidelity.rotation`), so that no contender always runs
first or last and a machine that drifts moves all of them alike. The time of
an iteration is the same for both runtimes: from a barrier to the end of the
optimizer step, the slowest rank's (as ``benchmarks/torch_peers.py`` times
them). A plan on umsearch's runtime also brings back every action's times,
which the refit needs; torch's runtime gives no per-action times.

The measurement is a function (:data:`MeasureFn`), so that the tune loop's
decisions can be tested with a stand-in for the machine.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from umsearch.core.plan import Plan
from umsearch.core.plan_io import plan_from_json
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


def _torch_runner(plan: Plan, rank: int, model: Any, name: str) -> tuple[Any, Any, bool, bool]:
    """(schedule, optimizer, holds stage 0, holds the last stage) of torch's runtime for ``plan``."""
    import torch
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import PipelineScheduleMulti, get_schedule_class

    from umsearch.runtime.factory import stage_module

    mine = plan.stages_of(rank)
    mods = [stage_module(model, plan.stages[j].lo, plan.stages[j].hi) for j in mine]
    stages = [PipelineStage(m, j, plan.num_stages, torch.device("cpu")) for j, m in zip(mine, mods, strict=True)]
    cls = get_schedule_class(name)
    multi = issubclass(cls, PipelineScheduleMulti)
    sched = cls(stages if multi else stages[0], len(plan.stages[0].forward), loss_fn=model.loss)
    params = [p for m in mods for p in m.parameters()]
    return sched, torch.optim.SGD(params, lr=1e-3), 0 in mine, plan.num_stages - 1 in mine


class _TorchJob:
    """torch's runtime on one peer plan in this rank."""

    def __init__(self, rank: int, plan: Plan, schedule: str, factory: ModelFactory, cfg: RunConfig) -> None:
        self.model, self.cfg, self.batch = factory(), cfg, plan.global_batch
        self.sched, self.opt, self.first, self.last = _torch_runner(plan, rank, self.model, schedule)

    def step(self, step: int) -> float:
        import torch
        import torch.distributed as dist

        x, y = self.model.make_batch(self.batch, torch.Generator().manual_seed(self.cfg.batch_seed(step)))
        self.opt.zero_grad(set_to_none=True)
        dist.barrier()
        t0 = time.perf_counter()
        self.sched.step(*((x,) if self.first else ()), target=y if self.last else None,
                        losses=[] if self.last else None)  # fmt: skip
        self.opt.step()
        return (time.perf_counter() - t0) * 1e3


def mixed_worker(rank: int, world: int, jobs: Sequence[tuple[str, dict[str, Any], str | None]], factory: ModelFactory,
                 cfg: RunConfig, rounds: int) -> list[list[Any]]:  # fmt: skip
    """Launch target: per round, per job (job order), this rank's stats (umsearch) or wall ms (torch).

    Every job runs ``cfg.warmup_steps`` unmeasured iterations first.
    """
    from umsearch.runtime.fidelity import rotation
    from umsearch.runtime.worker import RankSession

    comms: dict[Any, Any] = {}
    runners: list[Any] = []
    for kind, plan_json, schedule in jobs:
        if kind == "umsearch":
            runners.append(RankSession(rank, world, plan_json, factory, cfg, comms))
        else:
            assert schedule is not None
            runners.append(_TorchJob(rank, plan_from_json(plan_json), schedule, factory, cfg))
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


def machine(factory: ModelFactory, cfg: RunConfig) -> MeasureFn:
    """The real measurement: one launch of ``mixed_worker`` on the plans' ranks (all entries share them)."""

    def measure(entries: Sequence[Entry], rounds: int) -> list[Measured]:
        from umsearch.runtime.launch import launch

        ranks = {e.plan.ranks for e in entries}
        if len(ranks) != 1:
            raise ValueError(f"contenders on different rank counts {sorted(ranks)} cannot run in one launch")
        world = ranks.pop()
        jobs = [(e.runtime, e.plan.to_json(), e.schedule) for e in entries]
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
