"""The body of one stage process: build the model, keep the stage's layers, run the iterations.

Also runnable under ``torchrun`` on a cluster (``umsearch run --print-launch``
prints the command): ``python -m umsearch.runtime.worker PLAN.json --steps N``
reads ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` from the environment.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from umsearch.errors import RuntimeExecutionError
from umsearch.plan import Plan, load_plan, plan_from_json
from umsearch.runtime.comm import StageComm
from umsearch.runtime.config import RunConfig
from umsearch.runtime.executor import IterationStats, StageExecutor
from umsearch.runtime.launch import LaunchConfig, local_rank_device
from umsearch.runtime.model import ModelFactory, plan_model_spec, spec_factory, stage_module


@dataclass(frozen=True, kw_only=True)
class StageReport:
    """What one stage process hands back to the launcher."""

    stage: int
    """Stage index."""
    stats: tuple[IterationStats, ...]
    """One entry per iteration."""
    grads: dict[str, torch.Tensor] | None
    """Parameter name (global layer index first) -> gradient after the last iteration."""


def stage_worker(rank: int, world_size: int, plan_json: dict[str, Any], factory: ModelFactory,
                 cfg: RunConfig) -> StageReport:  # fmt: skip
    """Run ``cfg.steps`` iterations of stage ``rank``; the default process group is initialised."""
    plan = plan_from_json(plan_json)
    if world_size != plan.num_stages:
        raise RuntimeExecutionError(
            f"the plan has {plan.num_stages} stages but {world_size} processes were started; "
            f"start exactly one process per stage (--nproc-per-node x --nnodes = {plan.num_stages})"
        )
    device = local_rank_device(cfg.launch.backend)
    model = factory()
    if len(model.layers) != plan.stages[-1].hi:
        raise RuntimeExecutionError(
            f"the model has {len(model.layers)} layers but the plan covers {plan.stages[-1].hi}"
        )
    st = plan.stages[rank]
    module = stage_module(model, st.lo, st.hi).to(device)
    params = list(module.parameters())
    optimizer = torch.optim.SGD(params, lr=cfg.lr) if params else None
    comm = StageComm.create(plan.num_stages, device) if plan.num_stages > 1 else None
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
    return StageReport(stage=rank, stats=tuple(stats), grads=grads)


def _torchrun_main(argv: list[str] | None = None) -> None:
    """Entry point under torchrun: one process per stage, env:// rendezvous."""
    ap = argparse.ArgumentParser(prog="python -m umsearch.runtime.worker")
    ap.add_argument("plan")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--backend", choices=["gloo", "nccl"], default="nccl")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--timeout", type=float, default=300.0)
    a = ap.parse_args(argv)
    plan: Plan = load_plan(a.plan)
    cfg = RunConfig(steps=a.steps, seed=a.seed, lr=a.lr,
                    launch=LaunchConfig(backend=a.backend, threads=a.threads, timeout_s=a.timeout))  # fmt: skip
    if a.threads is not None:
        torch.set_num_threads(a.threads)
    if a.backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(a.backend, init_method="env://", timeout=timedelta(seconds=a.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    report = stage_worker(rank, world, plan.to_json(), spec_factory(plan_model_spec(plan, a.plan), a.seed), cfg)
    # The iteration ends with the latest stage: gather every stage's times to the last rank.
    ends: list[Any] = [None] * world
    dist.all_gather_object(ends, [(s.pipeline_ms, s.step_ms) for s in report.stats])
    if rank == world - 1:
        for i, s in enumerate(report.stats):
            print(json.dumps({"step": i, "loss": s.loss, "iteration_ms": max(e[i][0] for e in ends),
                              "step_ms": max(e[i][1] for e in ends)}))  # fmt: skip
    dist.destroy_process_group()


if __name__ == "__main__":
    _torchrun_main()
