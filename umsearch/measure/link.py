"""Measure the stage-to-stage link: a real two-process ping-pong over torch.distributed.

Half a round trip of ``n`` bytes is taken as one message; a line through (bytes, ms),
fitted on relative errors so the small messages set the latency as much as the large
ones set the bandwidth, gives latency (intercept) and bandwidth (1 / slope).

A loaded machine preempts the two processes for milliseconds at a time, which once
made 4 MiB look faster than 1 KiB. So each round sends every size once (drift hits all
sizes alike), each size keeps its fastest round (a preemption only ever adds time),
the largest message is big enough to outweigh a preemption, and a fit that still
comes out flat is measured once more, longer, before it is an error.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Sequence

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from umsearch.core.links import MAX_BANDWIDTH_GB_PER_S, MAX_LATENCY_MS, MIN_BANDWIDTH_GB_PER_S
from umsearch.errors import ProfilingError

DEFAULT_SIZES = (1 << 10, 1 << 14, 1 << 18, 1 << 20, 1 << 22, 1 << 24)
WARMUP_ROUNDS = 2


def fit_link(sizes_bytes: Sequence[float], times_ms: Sequence[float]) -> tuple[float, float]:
    """``(latency_ms, bandwidth_gb_per_s)`` of the line ``t = a + n / (bw * 1e6)`` with the least
    squared relative errors (exact when the times lie on such a line)."""
    n, t = np.asarray(sizes_bytes, dtype=float), np.asarray(times_ms, dtype=float)
    if len(n) < 2 or np.ptp(n) == 0:
        raise ProfilingError("fitting a link needs messages of at least two different sizes")
    slope, intercept = np.polyfit(n, t, 1, w=1.0 / np.maximum(t, 1e-9))
    if slope <= 0:
        raise ProfilingError(f"link times do not grow with message size (slope {slope:.3g} ms/B); state the link with --link-latency-ms/--link-bandwidth-gbps")
    latency, bandwidth = max(0.0, float(intercept)), float(1.0 / (slope * 1e6))
    if not (MIN_BANDWIDTH_GB_PER_S <= bandwidth <= MAX_BANDWIDTH_GB_PER_S and latency <= MAX_LATENCY_MS):
        raise ProfilingError(f"the measured link ({latency:.3g} ms + {bandwidth:.3g} GB/s) is outside what a profile "
                             "holds; state the link with --link-latency-ms/--link-bandwidth-gbps")  # fmt: skip
    return latency, bandwidth


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pingpong(rank: int, port: int, backend: str, sizes: Sequence[int], repeats: int, out: dict[int, float]) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group(backend, rank=rank, world_size=2)
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    try:
        bufs = {n: torch.zeros(n // 4, dtype=torch.float32, device=device) for n in sizes}
        fastest = dict.fromkeys(sizes, float("inf"))
        for round_ in range(repeats + WARMUP_ROUNDS):
            for n in sizes:
                t = _round_trip_ms(rank, bufs[n], device)
                if round_ >= WARMUP_ROUNDS:
                    fastest[n] = min(fastest[n], t / 2)
        if rank == 0:
            out.update(fastest)
    finally:
        dist.destroy_process_group()


def _round_trip_ms(rank: int, buf: torch.Tensor, device: torch.device) -> float:
    dist.barrier()
    t = time.perf_counter()
    if rank == 0:
        dist.send(buf, 1)
        dist.recv(buf, 1)
    else:
        dist.recv(buf, 0)
        dist.send(buf, 0)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - t) * 1e3


def link_times(backend: str = "gloo", sizes: Sequence[int] = DEFAULT_SIZES, repeats: int = 10) -> dict[int, float]:
    """Fastest one-way time (ms) of a message of each size in bytes between two processes, over
    ``repeats`` rounds that each send every size once."""
    if backend == "nccl" and torch.cuda.device_count() < 2:
        raise ProfilingError("measuring an NCCL link needs two GPUs here; state it with --link-latency-ms/--link-bandwidth-gbps")
    manager = mp.Manager()
    out = manager.dict()
    mp.start_processes(_pingpong, args=(_free_port(), backend, list(sizes), repeats, out), nprocs=2, start_method="spawn")
    raw = {int(k): float(v) for k, v in out.items()}
    manager.shutdown()
    return raw


def measure_link(backend: str = "gloo", sizes: Sequence[int] = DEFAULT_SIZES, repeats: int = 10) -> tuple[float, float, dict[int, float]]:
    """Latency, bandwidth and the raw one-way times of a two-process link (measured again, with
    three times the rounds, when the first times do not fit a link)."""
    raw = link_times(backend, sizes, repeats)
    try:
        lat, bw = fit_link(list(raw), list(raw.values()))
    except ProfilingError:
        raw = link_times(backend, sizes, 3 * repeats)
        lat, bw = fit_link(list(raw), list(raw.values()))
    return lat, bw, raw
