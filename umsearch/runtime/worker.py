"""The body of one rank's process: build the model, check the plan, keep the rank's stages, run.

A data-parallel plan runs on ``R x D`` processes: each finds its replica and pipeline rank from its
world rank (:mod:`umsearch.runtime.placement`), trains on its replica's samples of every batch and
all-reduces its stages' gradients with their copies. The optimizer is ``cfg.optimizer``'s; under a
``zero1`` plan its states are sharded over the copies (:mod:`umsearch.runtime.zero1`).

The torchrun entry point that calls it lives in :mod:`umsearch.runtime.torchrun`;
:func:`umsearch.runtime.fidelity.rounds_worker` runs several plans in one
process through :class:`RankSession`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import torch

from umsearch.core.plan import Plan
from umsearch.core.program import lower_rank
from umsearch.nn.precision import Precision, apply_switches, check_autocast
from umsearch.runtime.comm import Link, RankComm, plan_links
from umsearch.runtime.config import RunConfig
from umsearch.runtime.executor import IterationStats, StageExecutor
from umsearch.runtime.gradsync import GradSync
from umsearch.runtime.launch import local_rank_device
from umsearch.runtime.memory_tally import MemoryTally, Tally, optimizer_state_bytes, storage_bytes
from umsearch.runtime.model_source import ModelFactory, ModelLike, stage_module
from umsearch.runtime.placement import Seat, check_world, replica_worlds
from umsearch.runtime.preflight import rank_preflight
from umsearch.runtime.zero1 import make_optimizer


@dataclass(frozen=True, kw_only=True)
class StageReport:
    """What one rank's process hands back to the launcher."""

    rank: int
    """The (pipeline) rank."""
    stats: tuple[IterationStats, ...]
    """One entry per iteration."""
    grads: dict[str, torch.Tensor] | None
    """Parameter name (global layer index first) -> gradient after the last iteration."""
    cpus: tuple[int, ...] | None = None
    """The CPU cores the process was allowed to run on (None where the OS does not say)."""
    replica: int = 0
    """The data-parallel replica the rank belongs to."""
    tally: Tally | None = None
    """The memory of the first iteration in the model's own terms (:mod:`umsearch.runtime.memory_tally`)."""


T = TypeVar("T")


def peak_of(run: Callable[[], T], params: Iterable[torch.Tensor], optimizer: torch.optim.Optimizer | None,
            device: torch.device) -> tuple[T, int]:  # fmt: skip
    """``run()``'s result and this rank's peak memory in it (bytes).

    On CUDA the allocator's: ``max_memory_allocated`` after ``reset_peak_memory_stats``, less what was
    allocated when ``run`` started, plus the parameters' and optimizer states' bytes then (other contenders'
    models may share the device in one process: what they hold is not this one's). Elsewhere
    :class:`MemoryTally`'s peak (parameters, gradients, optimizer states, saved tensors). Either way the
    gradients are dropped first, so they count from when they appear (an iteration zeroes them anyway);
    a weight ``params`` lists twice counts once.
    """
    params = list({id(p): p for p in params}.values())
    for p in params:
        p.grad = None
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        own = storage_bytes(params) + optimizer_state_bytes(optimizer)
        torch.cuda.reset_peak_memory_stats(device)
        start = torch.cuda.memory_allocated(device)
        out = run()
        torch.cuda.synchronize(device)
        return out, torch.cuda.max_memory_allocated(device) - start + own
    tally = MemoryTally(params, optimizer)
    with tally:
        out = run()
    return out, tally.result().peak_bytes


GroupCache = dict[tuple[Any, ...], Any]
"""Process groups made by earlier sessions of one process, by the links or the replicas they serve."""


class RankSession:
    """One process's model, stage modules and executor for one plan: pipeline rank ``rank`` of a
    replica, where ``world_rank`` is the process's rank in the default group.

    ``device``: where the stages run (default: the launcher's, ``cuda:LOCAL_RANK`` under NCCL, else the CPU).
    ``comms`` caches the process's links and gradient groups across sessions of one process: process
    groups are collective to create, so plans with the same links (and replicas) share them.
    ``plan``: a :class:`Plan` checked already (by the launcher's gate,
    :func:`umsearch.core.loader.load_plan_file`, or
    :func:`umsearch.core.plan_rules.validate_plan`; it crosses to a spawned
    process pickled, never as plan JSON to re-parse): the session does not
    check it again. It lowers its rank's program once
    (:func:`umsearch.core.program.lower_rank`) and hands it to the executor.
    """

    def __init__(self, world_rank: int, world_size: int, plan: Plan, factory: ModelFactory,
                 cfg: RunConfig, comms: GroupCache | None = None, device: torch.device | None = None) -> None:  # fmt: skip
        check_world(plan, world_size)
        self.placement = Seat.of(plan, world_rank)
        rank = self.placement.rank
        self.plan, self.rank, self.cfg = plan, rank, cfg
        device = device if device is not None else local_rank_device(cfg.launch.backend)
        precision = Precision(cfg.precision or "fp32")
        check_autocast(precision, device)
        apply_switches(precision)
        self.model: ModelLike = factory()
        if cfg.check:
            rank_preflight(plan, self.model)
        self.modules = [stage_module(self.model, plan.stages[j].lo, plan.stages[j].hi).to(device)
                        for j in plan.stages_of(rank)]  # fmt: skip
        comm, grad_sync = self._groups(plan, world_rank, device, comms if comms is not None else {})
        optimizer = make_optimizer(cfg.optimizer, cfg.lr, [list(m.parameters()) for m in self.modules],
                                   zero1=plan.zero1, group=grad_sync.group if grad_sync is not None else None,
                                   copies=plan.data_parallel, shard=self.placement.replica)  # fmt: skip
        self.device = device
        self.executor = StageExecutor(plan, rank, self.modules, self.model.loss, comm, optimizer=optimizer,
                                      device=device, precision=precision, grad_sync=grad_sync,
                                      program=lower_rank(plan, rank))  # fmt: skip

    def _groups(self, plan: Plan, world_rank: int, device: torch.device,
                cache: GroupCache) -> tuple[RankComm | None, GradSync | None]:  # fmt: skip
        """The pipeline links and the gradient all-reduce groups (made in the same order on every process)."""
        timeout = timedelta(seconds=self.cfg.launch.timeout_s)
        worlds = replica_worlds(plan)
        comm = grad_sync = None
        if plan.ranks > 1:
            links: tuple[Link, ...] = plan_links(plan)
            links_key: tuple[Any, ...] = ("links", links, worlds)
            if links_key not in cache:
                cache[links_key] = RankComm.create(links, device, timeout=timeout, replicas=worlds)
            comm = cache[links_key]
        if plan.data_parallel > 1:
            copies_key: tuple[Any, ...] = ("copies", worlds)
            if copies_key not in cache:
                cache[copies_key] = GradSync.create(plan, world_rank, timeout=timeout)
            grad_sync = cache[copies_key]
        return comm, grad_sync

    def step(self, step: int) -> IterationStats:
        """Run iteration ``step`` on its batch (fixed by ``cfg.batch_seed(step)``; with replicas, on this
        replica's consecutive samples of it)."""
        ex = self.executor
        inputs = targets = None
        if ex.needs_inputs or ex.needs_targets:
            gen = torch.Generator().manual_seed(self.cfg.batch_seed(step))
            inputs, targets = self.model.make_batch(self.plan.global_batch, gen)
            if self.plan.data_parallel > 1:
                # Every replica draws the whole batch, so the samples do not depend on D: the same run as one process.
                first, count = self.placement.samples(self.plan)
                inputs, targets = inputs.narrow(0, first, count), targets.narrow(0, first, count)
        return ex.run_iteration(inputs if ex.needs_inputs else None, targets if ex.needs_targets else None)

    def tallied_step(self, step: int) -> tuple[IterationStats, Tally]:
        """:meth:`step` with its memory tallied (saved tensors, parameters, gradients, optimizer states);
        every gradient counts from when it appears, so they are dropped first (the iteration zeroes them
        anyway). The tally's hooks slow the iteration a little: tally a warm-up one."""
        # A weight two stages of this rank share (tied embedding and head on a V) is held once: counted once.
        params = list({id(p): p for m in self.modules for p in m.parameters()}.values())
        for p in params:
            p.grad = None
        tally = MemoryTally(params, self.executor.optimizer)
        with tally:
            stats = self.step(step)
        return stats, tally.result()

    def peak_step(self, step: int) -> tuple[IterationStats, int]:
        """:meth:`step` and this rank's peak memory in it (:func:`peak_of`: the tally's on CPU, the
        allocator's on CUDA)."""
        return peak_of(lambda: self.step(step), (p for m in self.modules for p in m.parameters()),
                       self.executor.optimizer, self.device)  # fmt: skip

    def grads(self) -> dict[str, torch.Tensor]:
        """Every parameter's gradient (CPU copies), named by global layer index."""
        return {n: p.grad.detach().cpu().clone() for m in self.modules for n, p in m.named_parameters()
                if p.grad is not None}  # fmt: skip


def stage_worker(rank: int, world_size: int, plan: Plan, factory: ModelFactory,
                 cfg: RunConfig) -> StageReport:  # fmt: skip
    """Run ``cfg.steps`` iterations of the process ``rank`` (its world rank); the default process group
    is initialised.

    With ``cfg.check`` the plan is checked against the built model (and for
    deadlock) before any message is exchanged.
    """
    session = RankSession(rank, world_size, plan, factory, cfg)
    first, tally = session.tallied_step(0)  # the first iteration is the warm-up one when there is any
    stats = (first, *(session.step(step) for step in range(1, cfg.steps)))
    grads = session.grads() if cfg.collect_grads else None
    cpus = tuple(sorted(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else None
    return StageReport(rank=session.rank, stats=stats, grads=grads, cpus=cpus, replica=session.placement.replica,
                       tally=tally)
