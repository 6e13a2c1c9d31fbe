"""The body of one stage process: build the model, check the plan, keep the stage's layers, run.

The torchrun entry point that calls it lives in :mod:`umsearch.runtime.torchrun`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch

from umsearch.core.errors import RuntimeExecutionError
from umsearch.core.plan import plan_from_json
from umsearch.runtime.comm import StageComm
from umsearch.runtime.config import RunConfig
from umsearch.runtime.executor import IterationStats, StageExecutor
from umsearch.runtime.launch import local_rank_device
from umsearch.runtime.model import ModelFactory, stage_module
from umsearch.runtime.preflight import rank_preflight


@dataclass(frozen=True, kw_only=True)
class StageReport:
    """What one stage process hands back to the launcher."""

    stage: int
    """Stage index."""
    stats: tuple[IterationStats, ...]
    """One entry per iteration."""
    grads: dict[str, torch.Tensor] | None
    """Parameter name (global layer index first) -> gradient after the last iteration."""
    cpus: tuple[int, ...] | None = None
    """The CPU cores the process was allowed to run on (None where the OS does not say)."""


def stage_worker(rank: int, world_size: int, plan_json: dict[str, Any], factory: ModelFactory,
                 cfg: RunConfig) -> StageReport:  # fmt: skip
    """Run ``cfg.steps`` iterations of stage ``rank``; the default process group is initialised.

    With ``cfg.check`` the plan is checked against the built model (and for
    deadlock) before any message is exchanged.
    """
    plan = plan_from_json(plan_json)
    if world_size != plan.num_stages:
        raise RuntimeExecutionError(
            f"the plan has {plan.num_stages} stages but {world_size} processes were started; "
            f"start exactly one process per stage (--nproc-per-node x --nnodes = {plan.num_stages})"
        )
    device = local_rank_device(cfg.launch.backend)
    model = factory()
    if cfg.check:
        rank_preflight(plan, model)
    st = plan.stages[rank]
    module = stage_module(model, st.lo, st.hi).to(device)
    params = list(module.parameters())
    optimizer = torch.optim.SGD(params, lr=cfg.lr) if params else None
    comm = None
    if plan.num_stages > 1:
        comm = StageComm.create(plan.num_stages, device, timeout=timedelta(seconds=cfg.launch.timeout_s))
    executor = StageExecutor(plan, rank, module, model.loss, comm, optimizer=optimizer, device=device)
    stats = []
    for step in range(cfg.steps):
        inputs = targets = None
        if executor.first or executor.last:
            inputs, targets = model.make_batch(plan.global_batch, torch.Generator().manual_seed(cfg.batch_seed(step)))
        stats.append(executor.run_iteration(inputs if executor.first else None, targets if executor.last else None))
    grads = None
    if cfg.collect_grads:
        grads = {n: p.grad.detach().cpu().clone() for n, p in module.named_parameters() if p.grad is not None}
    cpus = tuple(sorted(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else None
    return StageReport(stage=rank, stats=tuple(stats), grads=grads, cpus=cpus)
