"""Start one local process per rank through torchrun, watch them, and stop them all.

A local run is ``python -m torch.distributed.run --standalone --nproc-per-node R
-m umsearch.runtime.torchrun ... --result-dir DIR``: the launcher, rendezvous,
entry point and rank start-up a cluster uses (``umsearch run --print-launch``),
on one node. ``--standalone`` lets torchrun pick a free port, so concurrent
launches never race for one.

The launch's files live in a private folder (:mod:`umsearch.runtime.sealed`:
mode 0700, removed at the end, whatever happens). Nothing there is taken on
trust: the job (:func:`launch`'s pickled target) and every rank's result are
sealed with a key that exists only in the environment of this launch's
processes, and the entry point's hidden ``--job``/``--result-dir`` flags
accept nothing but such a folder. Each rank writes there, in order:
``pid{r}`` when it starts, ``started{r}`` once it has joined the process group,
then ``result{r}`` when it succeeds, ``error{r}.json`` (type, message,
traceback, time) when it fails, or ``stopped{r}.json`` when it is told to stop
(SIGTERM). A rank that vanishes with none of these was killed (SIGKILL, the
out-of-memory killer) or crashed.

The launcher (:func:`launch`, :func:`launch_entry`) polls those files and the
ranks' processes (:mod:`umsearch.runtime.watch`); on the first failure, on the time limit (counted from when
every rank has started, so start-up speed does not matter), on SIGTERM, SIGHUP
or SIGINT it stops torchrun and every rank (by pid; none outlives the launch),
then raises one line naming the rank that failed first
(:class:`RankFailure`, chosen by :mod:`umsearch.runtime.triage`), or :class:`LaunchInterrupted` (a
``KeyboardInterrupt``) for a signal.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from umsearch.errors import RuntimeExecutionError
from umsearch.runtime.config import LaunchConfig
from umsearch.runtime.sealed import JOB_FILE, KEY_ENV, new_key, private_dir, read_sealed, seal
from umsearch.runtime.triage import RankFailure
from umsearch.runtime.watch import LaunchInterrupted, Signals, Watch

__all__ = ["ENTRY_MODULE", "LaunchConfig", "LaunchInterrupted", "RankFailure", "launch", "launch_entry"]

ENTRY_MODULE = "umsearch.runtime.torchrun"
"""The module torchrun starts in every rank, locally and on clusters."""
LAUNCHER_PID_ENV = "UMSEARCH_LAUNCHER_PID"
"""Environment variable holding the launcher's pid: a rank whose launcher is gone stops itself."""


def launch(target: Callable[..., Any], world_size: int, args: Sequence[Any] = (),
           config: LaunchConfig | None = None) -> list[Any]:  # fmt: skip
    """Run ``target(rank, world_size, *args)`` in ``world_size`` torchrun ranks; their results by rank.

    ``target`` and ``args`` travel pickled (sealed, in the private folder), so
    ``target`` must be a module-level function and the arguments picklable (a
    model factory: a module-level function or a ``functools.partial`` of one).
    Each rank has the default process group initialised before ``target`` runs.
    """
    cfg = config or LaunchConfig()
    _check_backend(cfg, world_size)
    try:
        job = pickle.dumps((target, tuple(args), cfg))
    except Exception as exc:  # noqa: BLE001 - pickling raises many types; all mean the same
        raise RuntimeExecutionError(
            f"cannot hand the job to the rank processes: {type(exc).__name__}: {exc}; the target and its "
            "arguments (e.g. the model factory) must be picklable: a module-level function or a "
            "functools.partial of one, not a lambda or a local function"
        ) from None
    key = new_key()
    with private_dir() as out:
        from umsearch.storage.jsonio import write_bytes_atomic

        write_bytes_atomic(out / JOB_FILE, seal(job, key))
        (out / JOB_FILE).chmod(0o600)
        return _torchrun(world_size, ["--job", str(out / JOB_FILE)], cfg, out, key)


def launch_entry(world_size: int, entry_args: Sequence[str], config: LaunchConfig) -> list[Any]:
    """Run the entry point with ``entry_args`` (a plan file and its flags) in ``world_size`` ranks."""
    _check_backend(config, world_size)
    with private_dir() as out:
        return _torchrun(world_size, list(entry_args), config, out, new_key())


def torchrun_command(world_size: int, entry_args: Sequence[str]) -> list[str]:
    """The local torchrun command line (one node, ``world_size`` ranks)."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
            f"--nproc-per-node={world_size}", "--max-restarts=0", "-m", ENTRY_MODULE, *entry_args]  # fmt: skip


def _check_backend(cfg: LaunchConfig, world_size: int) -> None:
    if cfg.backend not in ("gloo", "nccl"):
        raise RuntimeExecutionError(f"unknown backend {cfg.backend!r}; use 'gloo' (CPU) or 'nccl' (GPUs)")
    if cfg.backend == "nccl":
        import torch

        if torch.cuda.device_count() < world_size:
            raise RuntimeExecutionError(
                f"backend nccl needs one GPU per rank: {world_size} ranks but {torch.cuda.device_count()} "
                "GPU(s) here; use --backend gloo or a plan with fewer ranks"
            )


def _environment(cfg: LaunchConfig, key: bytes, out: Path) -> dict[str, str]:
    env = dict(os.environ)
    # torchrun's own temporary files (its log folder) and the ranks' go into the private folder too,
    # so that removing it leaves nothing behind.
    env["TMPDIR"] = str(out)
    # The ranks import what the caller can (tests, user modules): hand them its module path.
    env["PYTHONPATH"] = os.pathsep.join(p for p in [os.getcwd(), *sys.path] if p)
    if cfg.threads is not None:
        env["OMP_NUM_THREADS"] = str(cfg.threads)
    elif "OMP_NUM_THREADS" not in env:
        env["OMP_NUM_THREADS"] = str(os.cpu_count() or 1)  # torch's default; keeps torchrun quiet
    env[KEY_ENV] = key.hex()
    env[LAUNCHER_PID_ENV] = str(os.getpid())
    return env


def _torchrun(world_size: int, entry_args: list[str], cfg: LaunchConfig, out: Path, key: bytes) -> list[Any]:
    log_path = out / "torchrun.log"
    with Signals() as signals, open(log_path, "wb") as log:
        # A session of its own: a Ctrl-C in the terminal reaches only us, and stop() ends it in order.
        proc = subprocess.Popen(torchrun_command(world_size, [*entry_args, f"--result-dir={out}"]),
                                stdout=log, stderr=subprocess.STDOUT, env=_environment(cfg, key, out),
                                start_new_session=True)  # fmt: skip
        watch = Watch(proc=proc, world_size=world_size, out=out, log_path=log_path, cfg=cfg, entry=ENTRY_MODULE)
        try:
            watch.supervise(signals)
        finally:
            watch.stop()
    return [read_sealed(out / f"result{r}", key, f"the result of rank {r}") for r in range(world_size)]


def local_rank_device(backend: str) -> Any:
    """``cuda:LOCAL_RANK`` for NCCL, else the CPU (a ``torch.device``)."""
    import torch

    if backend == "nccl":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")
