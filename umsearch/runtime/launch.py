"""Start one local process per stage, and stop them all with the failing rank's error.

The parent hosts the rendezvous store itself on a port the OS picks, so
concurrent launches never race for a port; each child joins it, initialises
the default process group and runs ``target(rank, world_size, *args)``. A child
that raises writes its error (type, message, traceback, time) to a file and
exits; the parent, which watches every child, then kills the rest and raises
:class:`~umsearch.errors.RuntimeExecutionError` with the first failure's
message, so a bad rank stops the run instead of hanging it.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from umsearch.errors import RuntimeExecutionError, UmsearchError
from umsearch.jsonio import write_bytes_atomic, write_json

_HOST = "127.0.0.1"


@dataclass(frozen=True, kw_only=True)
class LaunchConfig:
    """How to start the stage processes."""

    backend: str = "gloo"
    """``gloo`` (CPU tensors) or ``nccl`` (one GPU per rank, ``cuda:local_rank``)."""
    threads: int | None = 1
    """``torch.set_num_threads`` in each child; None leaves torch's default."""
    timeout_s: float = 300.0
    """Process-group timeout: a rank waiting longer than this for a peer fails."""
    run_timeout_s: float | None = None
    """Kill everything when the whole run takes longer than this (None: no limit)."""
    start_method: str = "spawn"
    """multiprocessing start method; ``spawn`` is the safe one with torch."""


def launch(
    target: Callable[..., Any], world_size: int, args: Sequence[Any] = (), config: LaunchConfig | None = None
) -> list[Any]:
    """Run ``target(rank, world_size, *args)`` in ``world_size`` processes; their results by rank."""
    cfg = config or LaunchConfig()
    if cfg.backend not in ("gloo", "nccl"):
        raise RuntimeExecutionError(f"unknown backend {cfg.backend!r}; use 'gloo' (CPU) or 'nccl' (GPUs)")
    if cfg.backend == "nccl" and torch.cuda.device_count() < world_size:
        raise RuntimeExecutionError(
            f"backend nccl needs one GPU per stage: {world_size} stages but "
            f"{torch.cuda.device_count()} GPU(s) here; use --backend gloo or fewer stages"
        )
    store = dist.TCPStore(_HOST, 0, world_size + 1, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=cfg.timeout_s))  # fmt: skip
    ctx: Any = mp.get_context(cfg.start_method)
    with tempfile.TemporaryDirectory(prefix="umsearch-run-") as tmp:
        out = Path(tmp)
        procs = [
            ctx.Process(target=_child, args=(rank, world_size, store.port, cfg, target, tuple(args), tmp),
                        name=f"umsearch-stage{rank}")  # fmt: skip
            for rank in range(world_size)
        ]
        try:
            for p in procs:
                p.start()
            _supervise(procs, out, cfg.run_timeout_s)
        finally:
            _stop(procs)
            del store
        return [torch.load(out / f"result{rank}.pt", weights_only=False) for rank in range(world_size)]


def _supervise(procs: list[BaseProcess], out: Path, run_timeout_s: float | None) -> None:
    """Wait for every child; on the first failure or the time limit, raise (the caller kills)."""
    deadline = None if run_timeout_s is None else time.monotonic() + run_timeout_s
    alive = list(procs)
    while alive:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        wait([p.sentinel for p in alive], timeout=1.0 if left is None else min(1.0, left))
        for p in list(alive):
            if p.exitcode is None:
                continue
            alive.remove(p)
            if p.exitcode != 0:
                raise RuntimeExecutionError(_failure(procs, out, p))
        if deadline is not None and time.monotonic() >= deadline and alive:
            ranks = ", ".join(str(procs.index(p)) for p in alive)
            raise RuntimeExecutionError(
                f"the run took longer than {run_timeout_s:g} s; stage(s) {ranks} still running were "
                "killed (raise the time limit, or look for a stage waiting on a message never sent)"
            )


def _failure(procs: list[BaseProcess], out: Path, first: BaseProcess) -> str:
    """The message of the earliest recorded error, else the exit code of ``first``."""
    time.sleep(0.2)  # let a sibling that failed at the same moment finish writing its report
    reports = []
    for path in out.glob("error*.json"):
        try:
            reports.append(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, json.JSONDecodeError):
            continue
    if not reports:
        rank = procs.index(first)
        return f"stage {rank} died with exit code {first.exitcode} without reporting an error (killed, out of memory?)"
    rep = min(reports, key=lambda r: r["time"])
    others = len(reports) - 1
    tail = f" ({others} other stage(s) failed after it)" if others else ""
    if rep["domain"]:
        return f"stage {rep['rank']}: {rep['message']}{tail}"
    return f"stage {rep['rank']} failed: {rep['type']}: {rep['message']}{tail}\n{rep['traceback']}"


def _stop(procs: list[BaseProcess]) -> None:
    """Terminate, then kill, every child still running."""
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(timeout=5)
        if p.is_alive():
            p.kill()
            p.join(timeout=5)


def _child(
    rank: int, world_size: int, port: int, cfg: LaunchConfig, target: Callable[..., Any],
    args: tuple[Any, ...], out_dir: str,
) -> None:  # fmt: skip
    """Entry point of one stage process."""
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank),
                       "LOCAL_WORLD_SIZE": str(world_size), "MASTER_ADDR": _HOST, "MASTER_PORT": str(port)})  # fmt: skip
    try:
        if cfg.threads is not None:
            torch.set_num_threads(cfg.threads)
        if cfg.backend == "nccl":
            torch.cuda.set_device(rank)
        store = dist.TCPStore(_HOST, port, world_size + 1, is_master=False,
                              timeout=timedelta(seconds=cfg.timeout_s))  # fmt: skip
        dist.init_process_group(cfg.backend, store=store, rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=cfg.timeout_s))  # fmt: skip
        result = target(rank, world_size, *args)
        buf = _pickled(result)
        write_bytes_atomic(Path(out_dir) / f"result{rank}.pt", buf)
        dist.destroy_process_group()
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the parent
        write_json(Path(out_dir) / f"error{rank}.json", {
            "rank": rank, "type": type(exc).__name__, "message": str(exc),
            "domain": isinstance(exc, UmsearchError), "traceback": traceback.format_exc(),
            "time": time.time(),
        })  # fmt: skip
        # Skip interpreter teardown: destroying a process group whose peers are gone can block.
        os._exit(1)


def _pickled(obj: Any) -> bytes:
    import io

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def local_rank_device(backend: str) -> torch.device:
    """``cuda:LOCAL_RANK`` for NCCL, else the CPU."""
    if backend == "nccl":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")
