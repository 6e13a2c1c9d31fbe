"""torch.distributed.pipelining's own runtime beside umsearch's, on the same plans, in one set of processes.

Contenders are ``("torch", plan JSON, schedule name)`` (torch's ``PipelineStage``
and schedule class running the peer plan's partition and microbatch count) or
``("umsearch", plan JSON, None)`` (umsearch's executor on the plan). Each round
runs every contender once, in an order rotated by one each round, after
``warmup`` unmeasured iterations of each at the start. The time of an iteration
is the same for both runtimes: from a barrier to the end of the optimizer
step, the slowest rank's.
"""

from __future__ import annotations

import time
from typing import Any

Job = tuple[str, dict[str, Any], str | None]


def _torch_runner(plan: Any, rank: int, model: Any, name: str) -> tuple[Any, Any, bool, bool]:
    """(schedule, optimizer, holds stage 0, holds the last stage) of torch's runtime for ``plan``."""
    import torch
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import PipelineScheduleMulti, get_schedule_class

    from umsearch.runtime.factory import stage_module

    mine = plan.stages_of(rank)
    mods = [stage_module(model, plan.stages[j].lo, plan.stages[j].hi) for j in mine]
    stages = [PipelineStage(m, j, plan.num_stages, torch.device("cpu")) for j, m in zip(mine, mods, strict=True)]
    cls = get_schedule_class(name)
    n = len(plan.stages[0].forward)
    multi = issubclass(cls, PipelineScheduleMulti)
    sched = cls(stages if multi else stages[0], n, loss_fn=model.loss)
    params = [p for m in mods for p in m.parameters()]
    return sched, torch.optim.SGD(params, lr=1e-3), 0 in mine, plan.num_stages - 1 in mine


def worker(rank: int, world: int, factory: Any, jobs: list[Job], rounds: int, warmup: int) -> list[list[float]]:
    """Launch target: per job, this rank's wall time (ms) of every measured round."""
    import torch
    import torch.distributed as dist

    from umsearch.core.plan_io import plan_from_json
    from umsearch.runtime.config import RunConfig
    from umsearch.runtime.worker import RankSession

    cfg = RunConfig(seed=0)
    comms: dict[Any, Any] = {}
    runners: list[Any] = []
    models: list[Any] = []
    for kind, plan_json, name in jobs:
        if kind == "umsearch":
            runners.append(RankSession(rank, world, plan_json, factory, cfg, comms))
            models.append(None)
        else:
            model = factory()
            assert name is not None
            runners.append(_torch_runner(plan_from_json(plan_json), rank, model, name))
            models.append(model)
    B = plan_from_json(jobs[0][1]).global_batch

    def once(i: int, step: int) -> float:
        runner = runners[i]
        if jobs[i][0] == "umsearch":
            return float(runner.step(step).step_ms)
        sched, opt, first, last = runner
        x, y = models[i].make_batch(B, torch.Generator().manual_seed(cfg.batch_seed(step)))
        opt.zero_grad(set_to_none=True)
        dist.barrier()
        t0 = time.perf_counter()
        args = (x,) if first else ()
        sched.step(*args, target=y if last else None, losses=[] if last else None)
        opt.step()
        return (time.perf_counter() - t0) * 1e3

    for i in range(len(jobs)):
        for step in range(warmup):
            once(i, step)
    out: list[list[float]] = [[] for _ in jobs]
    for r in range(rounds):
        for k in range(len(jobs)):
            i = (r + k) % len(jobs)
            out[i].append(once(i, warmup + r))
    return out


def measure(factory: Any, jobs: list[Job], ranks: int, rounds: int, warmup: int = 2) -> list[list[float]]:
    """Per job, the slowest rank's wall time of every measured round (ms)."""
    from umsearch.runtime.config import LaunchConfig
    from umsearch.runtime.launch import launch

    per_rank = launch(worker, ranks, (factory, jobs, rounds, warmup), LaunchConfig(threads=1, timeout_s=600))
    return [[max(per_rank[rk][i][r] for rk in range(ranks)) for r in range(rounds)] for i in range(len(jobs))]
