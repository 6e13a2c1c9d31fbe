"""Start one local process per stage through torchrun, and stop them all with the failing rank's error.

A local run is ``python -m torch.distributed.run --standalone --nproc-per-node S
-m umsearch.runtime.torchrun ... --result-dir DIR``: the launcher, rendezvous,
entry point and rank start-up a cluster uses (``umsearch run --print-launch``),
on one node. ``--standalone`` lets torchrun pick a free port, so concurrent
launches never race for one. Each rank writes its pid when it starts, then
``result{rank}.pkl`` when it succeeds or ``error{rank}.json`` (type, message,
traceback, time) when it fails. torchrun stops the other ranks when one fails;
this module then raises :class:`~umsearch.core.errors.RuntimeExecutionError` with
the earliest failure as one line, and makes sure no rank outlives the launch
(also on the run time limit, or when the caller is interrupted).
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from umsearch.core.errors import RuntimeExecutionError
from umsearch.runtime.config import LaunchConfig

__all__ = ["ENTRY_MODULE", "LaunchConfig", "launch", "launch_entry", "local_rank_device"]

ENTRY_MODULE = "umsearch.runtime.torchrun"
"""The module torchrun starts in every rank, locally and on clusters."""


class StageFailure(RuntimeExecutionError):
    """A rank failed; ``str()`` is one line, the rank's traceback is attached as a note."""


def launch(
    target: Callable[..., Any], world_size: int, args: Sequence[Any] = (), config: LaunchConfig | None = None
) -> list[Any]:
    """Run ``target(rank, world_size, *args)`` in ``world_size`` torchrun ranks; their results by rank.

    ``target`` and ``args`` travel pickled, so ``target`` must be a module-level
    function and the arguments picklable (a model factory: a module-level
    function or a ``functools.partial`` of one). Each rank has the default
    process group initialised before ``target`` runs.
    """
    cfg = config or LaunchConfig()
    try:
        job = pickle.dumps((target, tuple(args), cfg))
    except Exception as exc:  # noqa: BLE001 - pickling raises many types; all mean the same
        raise RuntimeExecutionError(
            f"cannot hand the job to the stage processes: {type(exc).__name__}: {exc}; the target and its "
            "arguments (e.g. the model factory) must be picklable: a module-level function or a "
            "functools.partial of one, not a lambda or a local function"
        ) from None
    with tempfile.TemporaryDirectory(prefix="umsearch-run-") as tmp:
        (Path(tmp) / "job.pkl").write_bytes(job)
        return _torchrun(world_size, ["--job", str(Path(tmp) / "job.pkl")], cfg, Path(tmp))


def launch_entry(world_size: int, entry_args: Sequence[str], config: LaunchConfig) -> list[Any]:
    """Run the entry point with ``entry_args`` (a plan file and its flags) in ``world_size`` ranks."""
    with tempfile.TemporaryDirectory(prefix="umsearch-run-") as tmp:
        return _torchrun(world_size, list(entry_args), config, Path(tmp))


def torchrun_command(world_size: int, entry_args: Sequence[str]) -> list[str]:
    """The local torchrun command line (one node, ``world_size`` ranks)."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
            f"--nproc-per-node={world_size}", "--max-restarts=0", "-m", ENTRY_MODULE, *entry_args]  # fmt: skip


def _check_backend(cfg: LaunchConfig, world_size: int) -> None:
    if cfg.backend not in ("gloo", "nccl"):
        raise RuntimeExecutionError(f"unknown backend {cfg.backend!r}; use 'gloo' (CPU) or 'nccl' (GPUs)")
    if cfg.backend == "nccl" and torch.cuda.device_count() < world_size:
        raise RuntimeExecutionError(
            f"backend nccl needs one GPU per stage: {world_size} stages but "
            f"{torch.cuda.device_count()} GPU(s) here; use --backend gloo or fewer stages"
        )


def _torchrun(world_size: int, entry_args: list[str], cfg: LaunchConfig, out: Path) -> list[Any]:
    _check_backend(cfg, world_size)
    env = dict(os.environ)
    # The ranks import what the caller can (tests, user modules): hand them its module path.
    env["PYTHONPATH"] = os.pathsep.join(p for p in [os.getcwd(), *sys.path] if p)
    if cfg.threads is not None:
        env["OMP_NUM_THREADS"] = str(cfg.threads)
    elif "OMP_NUM_THREADS" not in env:
        env["OMP_NUM_THREADS"] = str(os.cpu_count() or 1)  # torch's default; keeps torchrun quiet
    log_path = out / "torchrun.log"
    with open(log_path, "wb") as log:
        # A session of its own: a Ctrl-C in the terminal reaches only us, and _stop ends it in order.
        proc = subprocess.Popen(torchrun_command(world_size, [*entry_args, "--result-dir", str(out)]),
                                stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)  # fmt: skip
        try:
            _supervise(proc, world_size, out, cfg.run_timeout_s, log_path)
        finally:
            _stop(proc, out)
    return [pickle.loads((out / f"result{rank}.pkl").read_bytes()) for rank in range(world_size)]


def _supervise(proc: subprocess.Popen[bytes], world_size: int, out: Path, run_timeout_s: float | None,
               log_path: Path) -> None:  # fmt: skip
    """Wait for torchrun; on a failure or the time limit, raise (the caller stops what is left)."""
    deadline = None if run_timeout_s is None else time.monotonic() + run_timeout_s
    while proc.poll() is None:
        if deadline is not None and time.monotonic() >= deadline:
            running = [r for r in range(world_size)
                       if not (out / f"result{r}.pkl").exists() and not (out / f"error{r}.json").exists()]  # fmt: skip
            raise RuntimeExecutionError(
                f"the run took longer than {run_timeout_s:g} s; stage(s) {', '.join(map(str, running))} still "
                "running were killed (raise the time limit, or look for a stage waiting on a message never sent)"
            )
        time.sleep(0.05)
    missing = [r for r in range(world_size) if not (out / f"result{r}.pkl").exists()]
    if proc.returncode != 0 or missing:
        raise _failure(out, proc.returncode, log_path)


def _failure(out: Path, returncode: int, log_path: Path) -> RuntimeExecutionError:
    """The earliest rank error as one line, else torchrun's own last words."""
    reports = []
    for path in out.glob("error*.json"):
        try:
            reports.append(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, json.JSONDecodeError):
            continue
    if not reports:
        lines = [ln for ln in log_path.read_text(encoding="utf-8", errors="replace").splitlines() if ln.strip()]
        last = lines[-1].strip() if lines else "no output"
        return RuntimeExecutionError(
            f"torchrun exited with code {returncode} and no stage reported an error (killed, out of memory?); "
            f"its last line: {last}"
        )
    rep = min(reports, key=lambda r: r["time"])
    others = len(reports) - 1
    tail = f" ({others} other stage(s) failed after it)" if others else ""
    message = rep["message"].strip().replace("\n", " ")
    if rep["domain"]:
        # Runtime errors often name their stage already ("stage 1 gave up waiting ...").
        named = message.startswith(f"stage {rep['rank']} ")
        err = StageFailure(f"{message}{tail}" if named else f"stage {rep['rank']}: {message}{tail}")
    else:
        err = StageFailure(f"stage {rep['rank']} failed: {rep['type']}: {message}{tail}")
    err.add_note(f"traceback of stage {rep['rank']}:\n{rep['traceback']}")
    return err


def _stop(proc: subprocess.Popen[bytes], out: Path) -> None:
    """End torchrun (it stops its ranks), then any rank that outlived it; leaves nothing running."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)  # torchrun's agent stops its workers on SIGTERM
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    # Ranks run in sessions of their own, so a killed agent can leave them behind: end them by pid.
    for path in out.glob("pid*"):
        try:
            pid = int(path.read_text())
        except (OSError, ValueError):
            continue
        if _is_our_rank(pid, out):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _is_our_rank(pid: int, out: Path) -> bool:
    """Whether ``pid`` is still a rank of this launch (its command line names our result folder),
    not a recycled pid of something else; False where ``/proc`` does not exist."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return ENTRY_MODULE.encode() in cmdline and str(out).encode() in cmdline


def local_rank_device(backend: str) -> torch.device:
    """``cuda:LOCAL_RANK`` for NCCL, else the CPU."""
    if backend == "nccl":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")
