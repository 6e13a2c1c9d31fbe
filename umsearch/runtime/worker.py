"""The body of one rank's process: build the model, check the plan, keep the rank's stages, run.

The torchrun entry point that calls it lives in :mod:`umsearch.runtime.torchrun`;
:func:`umsearch.runtime.fidelity.rounds_worker` runs several plans in one
process through :class:`RankSession`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch

from umsearch.core.errors import RuntimeExecutionError
from umsearch.core.plan import Plan, plan_from_json
from umsearch.nn.precision import Precision, apply_switches, check_autocast
from umsearch.runtime.comm import Link, RankComm, plan_links
from umsearch.runtime.config import RunConfig
from umsearch.runtime.executor import IterationStats, StageExecutor
from umsearch.runtime.factory import ModelFactory, ModelLike, stage_module
from umsearch.runtime.launch import local_rank_device
from umsearch.runtime.preflight import rank_preflight


@dataclass(frozen=True, kw_only=True)
class StageReport:
    """What one rank's process hands back to the launcher."""

    rank: int
    """The rank."""
    stats: tuple[IterationStats, ...]
    """One entry per iteration."""
    grads: dict[str, torch.Tensor] | None
    """Parameter name (global layer index first) -> gradient after the last iteration."""
    cpus: tuple[int, ...] | None = None
    """The CPU cores the process was allowed to run on (None where the OS does not say)."""


def _check_world(plan: Plan, world_size: int) -> None:
    if world_size != plan.ranks:
        raise RuntimeExecutionError(
            f"the plan has {plan.ranks} ranks but {world_size} processes were started; start exactly one "
            f"process per rank (--nproc-per-node x --nnodes = {plan.ranks})"
        )


class RankSession:
    """One rank's model, stage modules and executor for one plan.

    ``comms`` caches the rank's links across sessions of one process: process
    groups are collective to create, so plans with the same links share them.
    """

    def __init__(self, rank: int, world_size: int, plan_json: dict[str, Any], factory: ModelFactory,
                 cfg: RunConfig, comms: dict[tuple[Link, ...], RankComm] | None = None) -> None:  # fmt: skip
        plan = plan_from_json(plan_json)
        _check_world(plan, world_size)
        self.plan, self.rank, self.cfg = plan, rank, cfg
        device = local_rank_device(cfg.launch.backend)
        precision = Precision(cfg.precision or "fp32")
        check_autocast(precision, device)
        apply_switches(precision)
        self.model: ModelLike = factory()
        if cfg.check:
            rank_preflight(plan, self.model)
        self.modules = [stage_module(self.model, plan.stages[j].lo, plan.stages[j].hi).to(device)
                        for j in plan.stages_of(rank)]  # fmt: skip
        params = [p for m in self.modules for p in m.parameters()]
        optimizer = torch.optim.SGD(params, lr=cfg.lr) if params else None
        comm = None
        if plan.ranks > 1:
            links = plan_links(plan)
            cache = comms if comms is not None else {}
            if links not in cache:
                cache[links] = RankComm.create(links, device, timeout=timedelta(seconds=cfg.launch.timeout_s))
            comm = cache[links]
        self.executor = StageExecutor(plan, rank, self.modules, self.model.loss, comm, optimizer=optimizer,
                                      device=device, precision=precision)  # fmt: skip

    def step(self, step: int) -> IterationStats:
        """Run iteration ``step`` on its batch (fixed by ``cfg.batch_seed(step)``)."""
        ex = self.executor
        inputs = targets = None
        if ex.needs_inputs or ex.needs_targets:
            gen = torch.Generator().manual_seed(self.cfg.batch_seed(step))
            inputs, targets = self.model.make_batch(self.plan.global_batch, gen)
        return ex.run_iteration(inputs if ex.needs_inputs else None, targets if ex.needs_targets else None)

    def grads(self) -> dict[str, torch.Tensor]:
        """Every parameter's gradient (CPU copies), named by global layer index."""
        return {n: p.grad.detach().cpu().clone() for m in self.modules for n, p in m.named_parameters()
                if p.grad is not None}  # fmt: skip


def stage_worker(rank: int, world_size: int, plan_json: dict[str, Any], factory: ModelFactory,
                 cfg: RunConfig) -> StageReport:  # fmt: skip
    """Run ``cfg.steps`` iterations of rank ``rank``; the default process group is initialised.

    With ``cfg.check`` the plan is checked against the built model (and for
    deadlock) before any message is exchanged.
    """
    session = RankSession(rank, world_size, plan_json, factory, cfg)
    stats = tuple(session.step(step) for step in range(cfg.steps))
    grads = session.grads() if cfg.collect_grads else None
    cpus = tuple(sorted(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else None
    return StageReport(rank=rank, stats=stats, grads=grads, cpus=cpus)
