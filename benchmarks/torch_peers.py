"""torch.distributed.pipelining's own schedules beside umsearch's plans, in one set of processes, on one runtime.

Contenders are ``("torch", plan, schedule name)`` (torch's schedule class
on the peer plan's partition and microbatch count) or ``("umsearch", plan,
None)`` (the plan through ``PlanSchedule``); both run on torch's
``PipelineStage`` objects, shared where plans cut the model alike
(:mod:`umsearch.orchestrate.contenders`, which ``tune`` measures with too).
Each round runs every contender once, in an order rotated by one each round,
after ``warmup`` unmeasured iterations of each at the start. The time of an
iteration is the same for both: from a barrier to the end of the optimizer
step, the slowest rank's.
"""

from __future__ import annotations

from typing import Any

from umsearch.core.plan import Plan

Job = tuple[str, Plan, str | None]
"""A contender: its runtime, its checked plan (pickled to the ranks, never re-parsed) and torch's schedule."""


def worker(rank: int, world: int, factory: Any, jobs: list[Job], rounds: int, warmup: int) -> list[list[float]]:
    """Launch target: per job, this rank's wall time (ms) of every measured round."""
    from umsearch.orchestrate.contenders import mixed_worker
    from umsearch.runtime.config import RunConfig

    per_round = mixed_worker(rank, world, jobs, factory, RunConfig(seed=0, warmup_steps=warmup), rounds)
    return [[float(getattr(m[i], "step_ms", m[i])) for m in per_round] for i in range(len(jobs))]


def measure(factory: Any, jobs: list[Job], ranks: int, rounds: int, warmup: int = 2) -> list[list[float]]:
    """Per job, the slowest rank's wall time of every measured round (ms)."""
    from umsearch.runtime.config import LaunchConfig
    from umsearch.runtime.launch import launch

    per_rank = launch(worker, ranks, (factory, jobs, rounds, warmup), LaunchConfig(threads=1, timeout_s=600))
    return [[max(per_rank[rk][i][r] for rk in range(ranks)) for r in range(rounds)] for i in range(len(jobs))]
