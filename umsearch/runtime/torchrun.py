"""The torchrun entry point: one process per rank, on a cluster and for every local run.

    torchrun --nnodes=N --nproc-per-node=K ... -m umsearch.runtime.torchrun PLAN.json --steps=20 ...

Each rank loads the plan with its profile and model exactly as ``umsearch run``
does (the gate :func:`umsearch.core.loader.load_plan_file`, then
:func:`umsearch.runtime.model_source.require_trusted`: a model that the plan or
profile file names runs only if it is a zoo model, named again with
``--model``, or allowed with ``--trust-model-code``), checks that torchrun
started one process per rank of every replica (``R x D``), sets its torch threads (on CPU also
pins itself to its own cores when there are enough), initialises the default
process group (``env://``) with the link timeout, and runs its rank
(:func:`umsearch.runtime.worker.stage_worker`: build the model, check the plan
against it, run its stages).

Without ``--result-dir`` (a cluster) rank 0 gathers every rank's report,
prints one JSON line per iteration and, with ``--out``, writes the run's
report there. With it (``umsearch run`` and :func:`~umsearch.runtime.launch.launch`
on one machine) each rank writes its pid, a note once started, then its
sealed result or its error into the launcher's private folder (see
:mod:`umsearch.runtime.launch`); ``--job`` (launch()'s pickled target) and
``--result-dir`` are refused unless they are such a folder with this launch's
key. A failing rank prints one line to stderr and exits with code 1; torchrun
then stops the others. SIGTERM (SIGINT, SIGHUP) stops a rank at once, even
inside a blocking collective, with a note saying so; a rank whose torchrun or
launcher is gone stops itself.

``umsearch.runtime`` does not import this module, so ``python -m`` runs it
cleanly; torch is imported only once the stop signals are routed to their waiter thread.
Flags and defaults come from the table in :mod:`umsearch.runtime.config`.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from umsearch.core.options import Setting, kind_rule
from umsearch.core.plan import Plan
from umsearch.errors import RuntimeExecutionError, UmsearchError
from umsearch.runtime.config import (
    LaunchConfig,
    RunConfig,
    configs_from_values,
    flags,
)
from umsearch.runtime.launch import LAUNCHER_PID_ENV
from umsearch.runtime.sealed import JOB_FILE, check_private_dir, env_key, read_sealed, write_sealed
from umsearch.storage.jsonio import write_json


def _arg_type(row: Setting) -> Callable[[str], Any]:
    parse = row.option.parse or str

    def convert(text: str) -> Any:
        try:
            return parse(text)
        except (UmsearchError, ValueError) as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = row.option.metavar or row.dest  # argparse names the type in its errors
    return convert


def parser() -> argparse.ArgumentParser:
    """The entry point's flags: the ``ranks`` rows of the flag table, plus the launcher's hidden two."""
    ap = argparse.ArgumentParser(prog="python -m umsearch.runtime.torchrun",
                                 description="Run one rank of a pipeline plan; start it with torchrun.")  # fmt: skip
    ap.add_argument("plan", nargs="?", metavar="PLAN.json", help="the plan (its 'model' says what to build)")
    for row in flags("ranks"):
        opt = row.option
        helptext = argparse.SUPPRESS if opt.hidden else opt.help.replace("%", "%%")
        shape = kind_rule(opt).shape
        if shape == "switch":
            ap.add_argument(row.flag, dest=row.dest, action="store_true", help=helptext)
        else:
            ap.add_argument(row.flag, dest=row.dest, type=_arg_type(row), metavar=opt.metavar, help=helptext,
                            action="append" if shape == "repeated" else "store", default=argparse.SUPPRESS)  # fmt: skip
    ap.add_argument("--result-dir", default=None, help=argparse.SUPPRESS)  # the launcher's private folder
    ap.add_argument("--job", default=None, help=argparse.SUPPRESS)  # launch(): the sealed job in that folder
    return ap


def config_from_args(ns: argparse.Namespace) -> RunConfig:
    """The :class:`RunConfig` the parsed flags describe (inverse of :func:`~umsearch.runtime.config.to_argv`)."""
    return configs_from_values(vars(ns))[0]


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
    import torch
    import torch.distributed as dist

    local_rank, local_world = _env_int("LOCAL_RANK", 0), _env_int("LOCAL_WORLD_SIZE", 1)
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    if cfg.backend == "nccl":
        torch.cuda.set_device(local_rank)
    elif cfg.pin_cores and cfg.threads is not None:
        pin_cores(local_rank, local_world, cfg.threads)
    dist.init_process_group(cfg.backend, init_method="env://", timeout=timedelta(seconds=cfg.timeout_s))


@dataclass
class _Rank:
    """This process: its rank, and the launcher's folder and key when a local launcher started it."""

    rank: int
    result_dir: Path | None = None
    key: bytes = b""

    def note(self, name: str, doc: dict[str, Any]) -> None:
        if self.result_dir is not None:
            write_json(self.result_dir / f"{name}{self.rank}.json", doc)


_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
"""What stops a rank: torchrun passes on SIGTERM (and, after a Ctrl-C, SIGINT) to its workers."""


def _route_stop_signals(me: _Rank) -> None:
    """SIGTERM, SIGINT and SIGHUP go to a waiter thread, which notes the signal and ends the process.

    The signals are blocked before any other thread exists (torch's, gloo's
    inherit the mask), so none lands in a thread blocked in C++ and none waits
    for the main thread: the waiter acts even inside a blocking collective.
    """

    def wait() -> None:
        signum = signal.sigwait(set(_STOP_SIGNALS))
        name = signal.Signals(signum).name
        me.note("stopped", {"rank": me.rank, "signal": name, "time": time.time()})
        print(f"umsearch: rank {me.rank} stopped by {name}", file=sys.stderr, flush=True)
        os._exit(128 + signum)

    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_BLOCK, set(_STOP_SIGNALS))
        threading.Thread(target=wait, name="umsearch-stop", daemon=True).start()


def _watch_parents() -> None:
    """Stop this rank when its torchrun agent or (locally) its launcher is gone: nothing is orphaned."""
    parent = os.getppid()
    launcher = int(os.environ.get(LAUNCHER_PID_ENV, "0") or 0)

    def gone(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False

    def watch() -> None:
        while True:
            time.sleep(0.5)
            if os.getppid() != parent or (launcher and gone(launcher)):
                print("umsearch: the launcher is gone; stopping this rank", file=sys.stderr, flush=True)
                os._exit(1)

    threading.Thread(target=watch, name="umsearch-parents", daemon=True).start()


def _enter_launch(ns: argparse.Namespace, me: _Rank) -> None:
    """Accept ``--result-dir`` / ``--job`` only as this launch's private folder; note the pid."""
    if ns.result_dir is None and ns.job is None:
        return
    if ns.result_dir is None:
        raise RuntimeExecutionError("--job needs the launcher's --result-dir; it is only for umsearch's own launcher")
    me.key = env_key()
    me.result_dir = check_private_dir(ns.result_dir)
    if ns.job is not None and Path(ns.job).parent.resolve() != me.result_dir.resolve():
        raise RuntimeExecutionError(f"--job {ns.job!r} is not in the launcher's private folder; refusing to read it")
    (me.result_dir / f"pid{me.rank}").write_text(str(os.getpid()))


def _plan_job(ns: argparse.Namespace, me: _Rank) -> tuple[Callable[..., Any], tuple[Any, ...], LaunchConfig]:
    """Target and arguments of a plan run; refuses before any peer is contacted."""
    from umsearch.core.loader import load_plan_file
    from umsearch.runtime.model_source import require_trusted, spec_factory, user_model
    from umsearch.runtime.placement import check_world

    run, choice = configs_from_values(vars(ns))
    loaded = load_plan_file(ns.plan, profile=choice.profile, model=user_model(choice),
                            trust_model_code=choice.trust_model_code)  # fmt: skip
    spec = require_trusted(loaded)
    plan = loaded.plan
    check_world(plan, _env_int("WORLD_SIZE", 1))
    factory = spec_factory(spec, run.seed)
    from umsearch.runtime.worker import stage_worker

    if me.result_dir is not None:
        return stage_worker, (plan, factory, run), run.launch
    meta = {"plan": str(ns.plan), "model": spec.to_json()}
    return _cluster_rank, (plan, factory, run, meta), run.launch


def _cluster_rank(rank: int, world: int, plan: Plan, factory: Any, run: RunConfig,
                  meta: dict[str, Any]) -> Any:  # fmt: skip
    """:func:`stage_worker`, then rank 0 gathers the reports, prints each iteration and writes ``--out``."""
    import torch.distributed as dist

    from umsearch.runtime.run_plan import check_writable, merge, run_document
    from umsearch.runtime.worker import stage_worker

    if rank == 0 and run.out is not None:
        check_writable(run.out, "--out")  # before the run, not after it
    report = stage_worker(rank, world, plan, factory, run)
    reports: list[Any] | None = [None] * world if rank == 0 else None
    dist.gather_object(report, reports, dst=0)
    if rank == 0:
        assert reports is not None
        result = merge(reports)
        for i, step in enumerate(result.steps):
            print(json.dumps({"step": i, "loss": step.loss, "iteration_ms": step.iteration_ms,
                              "step_ms": step.step_ms}), flush=True)  # fmt: skip
        if run.out is not None:
            write_json(run.out, run_document(result, run, meta=meta))
    return report


def _job(ns: argparse.Namespace, me: _Rank) -> tuple[Callable[..., Any], tuple[Any, ...], LaunchConfig]:
    """(target, args, launch config) of this run."""
    if ns.job is not None:
        assert me.result_dir is not None
        target, args, cfg = read_sealed(me.result_dir / JOB_FILE, me.key, "the job")
        return target, args, cfg
    return _plan_job(ns, me)


def _fail(exc: BaseException, me: _Rank) -> None:
    """Tell the launcher (a file) and the log (one line on stderr) why this rank failed."""
    domain = isinstance(exc, UmsearchError)
    message = " ".join(str(exc).split())
    me.note("error", {"rank": me.rank, "type": type(exc).__name__, "message": message, "domain": domain,
                      "traceback": traceback.format_exc(), "time": time.time()})  # fmt: skip
    if not domain:
        traceback.print_exc()
    head = f"umsearch: rank {me.rank}: " if domain else f"umsearch: rank {me.rank} failed: {type(exc).__name__}: "
    print(head + message, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> None:
    """Run this rank (see the module docstring)."""
    me = _Rank(rank=_env_int("RANK", 0))
    _route_stop_signals(me)
    ap = parser()
    ns = ap.parse_args(argv)
    if ns.plan is None and ns.job is None:
        ap.error("give PLAN.json")
    try:
        _enter_launch(ns, me)
        _watch_parents()
        target, args, cfg = _job(ns, me)
        _start_rank(cfg)
        import torch.distributed as dist

        if me.result_dir is not None:
            (me.result_dir / f"started{me.rank}").write_text(str(time.time()))
        result = target(me.rank, dist.get_world_size(), *args)
        if me.result_dir is not None:
            write_sealed(me.result_dir / f"result{me.rank}", result, me.key)
        dist.destroy_process_group()
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the launcher
        _fail(exc, me)
        # Skip interpreter teardown: destroying a process group whose peers are gone can block.
        os._exit(1)


if __name__ == "__main__":
    main()
