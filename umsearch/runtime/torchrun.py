"""The torchrun entry point: one process per stage, on a cluster and for every local run.

    torchrun --nnodes=N --nproc-per-node=K ... -m umsearch.runtime.torchrun PLAN.json --steps=20 ...

Each rank reads ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and
``LOCAL_WORLD_SIZE`` from torchrun, sets its torch threads (on CPU also pins
itself to its own cores when there are enough), initialises the default
process group (``env://``) with the run timeout, rebuilds the plan's model,
checks the plan against it (:func:`~umsearch.runtime.preflight.rank_preflight`)
and runs stage ``RANK``. Without ``--result-dir`` (a cluster) the last rank
prints one JSON line per iteration; with it (``umsearch run`` and
:func:`~umsearch.runtime.launch.launch` on one machine) every rank writes its
report, or its error, there. A failing rank prints one line to stderr and exits
with code 1; torchrun then stops the others.

``umsearch.runtime`` does not import this module, so ``python -m`` runs it
cleanly. Flag defaults come from :class:`~umsearch.runtime.config.RunConfig`.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import sys
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from umsearch.core.errors import UmsearchError
from umsearch.core.jsonio import write_bytes_atomic, write_json
from umsearch.core.plan import load_plan
from umsearch.runtime.config import LaunchConfig, RunConfig
from umsearch.runtime.model import ModelFactory, plan_model_spec, spec_factory
from umsearch.runtime.worker import StageReport, stage_worker


def parser() -> argparse.ArgumentParser:
    """The entry point's flags; every default is :class:`RunConfig`'s."""
    run, lc = RunConfig(), LaunchConfig()
    ap = argparse.ArgumentParser(prog="python -m umsearch.runtime.torchrun",
                                 description="One pipeline stage per rank; start it with torchrun.")  # fmt: skip
    ap.add_argument("plan", nargs="?", metavar="PLAN.json", help="the plan (its 'model' says what to build)")
    ap.add_argument("--steps", type=int, default=run.steps, help="iterations to run")
    ap.add_argument("--warmup-steps", type=int, default=run.warmup_steps, help="leading iterations not summarised")
    ap.add_argument("--seed", type=int, default=run.seed, help="seed of weights and batches")
    ap.add_argument("--lr", type=float, default=run.lr, help="SGD learning rate")
    ap.add_argument("--backend", choices=["gloo", "nccl"], default=lc.backend)
    ap.add_argument("--threads", type=int, default=lc.threads or 0, help="torch threads per rank; 0: torch's default")
    ap.add_argument("--timeout", type=float, default=lc.timeout_s, help="seconds a rank waits for a peer")
    ap.add_argument("--no-pin-cores", action="store_true", help="do not pin CPU ranks to their own cores")
    ap.add_argument("--result-dir", default=None, help=argparse.SUPPRESS)  # local runs: reports go here
    ap.add_argument("--job", default=None, help=argparse.SUPPRESS)  # launch(): a pickled target and args
    return ap


def config_from_args(ns: argparse.Namespace) -> RunConfig:
    """The :class:`RunConfig` the parsed flags describe (inverse of :meth:`RunConfig.to_argv`)."""
    launch = LaunchConfig(backend=ns.backend, threads=ns.threads or None, timeout_s=ns.timeout,
                          pin_cores=not ns.no_pin_cores)  # fmt: skip
    return RunConfig(steps=ns.steps, warmup_steps=ns.warmup_steps, seed=ns.seed, lr=ns.lr, launch=launch)


def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, str(default)))


def pin_cores(local_rank: int, local_world: int, threads: int) -> tuple[int, ...] | None:
    """Pin this process to cores ``[local_rank * threads, +threads)`` of those it may use.

    Only when every local rank gets cores of its own; returns the cores, or None
    when it did not pin (too few cores, or no ``sched_setaffinity`` here).
    """
    if not hasattr(os, "sched_setaffinity"):
        return None
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < local_world * threads:
        return None
    mine = cores[local_rank * threads : (local_rank + 1) * threads]
    os.sched_setaffinity(0, mine)
    return tuple(mine)


def _start_rank(cfg: LaunchConfig) -> None:
    """Threads, cores, device and the default process group of this rank."""
    local_rank, local_world = _env_int("LOCAL_RANK", 0), _env_int("LOCAL_WORLD_SIZE", 1)
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    if cfg.backend == "nccl":
        torch.cuda.set_device(local_rank)
    elif cfg.pin_cores and cfg.threads is not None:
        pin_cores(local_rank, local_world, cfg.threads)
    dist.init_process_group(cfg.backend, init_method="env://", timeout=timedelta(seconds=cfg.timeout_s))


def _cluster_stage(rank: int, world: int, plan_json: dict[str, Any], factory: ModelFactory,
                   cfg: RunConfig) -> StageReport:  # fmt: skip
    """:func:`stage_worker`, then the last rank prints each iteration (the latest stage ends it)."""
    report = stage_worker(rank, world, plan_json, factory, cfg)
    ends: list[Any] = [None] * world
    dist.all_gather_object(ends, [(s.pipeline_ms, s.step_ms) for s in report.stats])
    if rank == world - 1:
        for i, s in enumerate(report.stats):
            print(json.dumps({"step": i, "loss": s.loss, "iteration_ms": max(e[i][0] for e in ends),
                              "step_ms": max(e[i][1] for e in ends)}), flush=True)  # fmt: skip
    return report


def _job(ns: argparse.Namespace, ap: argparse.ArgumentParser) -> tuple[Callable[..., Any], tuple[Any, ...], LaunchConfig]:
    """(target, args, launch config) of this run."""
    if ns.job is not None:
        target, args, cfg = pickle.loads(Path(ns.job).read_bytes())
        return target, args, cfg
    if ns.plan is None:
        ap.error("give PLAN.json")
    run = config_from_args(ns)
    plan = load_plan(ns.plan)
    factory = spec_factory(plan_model_spec(plan, ns.plan), run.seed)
    target = stage_worker if ns.result_dir else _cluster_stage
    return target, (plan.to_json(), factory, run), run.launch


def _fail(exc: BaseException, rank: int, result_dir: Path | None) -> None:
    """Tell the launcher (a file) and the log (one line on stderr) why this rank failed."""
    domain = isinstance(exc, UmsearchError)
    if result_dir is not None:
        write_json(result_dir / f"error{rank}.json", {
            "rank": rank, "type": type(exc).__name__, "message": str(exc), "domain": domain,
            "traceback": traceback.format_exc(), "time": time.time(),
        })  # fmt: skip
    head = f"umsearch: stage {rank}: " if domain else f"umsearch: stage {rank} failed: {type(exc).__name__}: "
    if not domain:
        traceback.print_exc()
    print(head + str(exc).replace("\n", " "), file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> None:
    """Run this rank's stage (see the module docstring)."""
    ap = parser()
    ns = ap.parse_args(argv)
    rank = _env_int("RANK", 0)
    result_dir = Path(ns.result_dir) if ns.result_dir else None
    if result_dir is not None:
        (result_dir / f"pid{rank}").write_text(str(os.getpid()))
    try:
        target, args, cfg = _job(ns, ap)
        _start_rank(cfg)
        result = target(rank, dist.get_world_size(), *args)
        if result_dir is not None:
            write_bytes_atomic(result_dir / f"result{rank}.pkl", pickle.dumps(result))
        dist.destroy_process_group()
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the launcher
        _fail(exc, rank, result_dir)
        # Skip interpreter teardown: destroying a process group whose peers are gone can block.
        os._exit(1)


if __name__ == "__main__":
    main()
