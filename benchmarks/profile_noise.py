"""How reproducible is a profile? Two back-to-back profiles of one zoo model, old method vs new.

``python -m benchmarks.profile_noise`` profiles a zoo model twice in a row
with each method and reports the drift between the two: the mean absolute
relative difference of per-layer forward+backward over every layer and size
(the figure ``benchmarks.runtime`` calls ``drift_percent``). It does so on the
machine as it is (``idle``) and with a CPU-bound process
(``python -c 'while 1: pass'``) running beside the profiler (``busy``).

- ``old``: a faithful copy of the profiler as it was before the interleaved
  rounds (kept here, since the package no longer has it): each size timed to
  completion, layer after layer, ``max(repeats, 8)`` forwards with their
  graphs kept and their backwards, medians, no pooling, no fit.
- ``new``: :func:`umsearch.measure.profiler.profile_model`.

Both run in this one process, the method order rotated between trials and
conditions; the link is stated, not measured (it is no part of the drift).
Each pair's drift comes with a bootstrap 95% interval over its cells; with
several trials, the median over trials. A fixed reference workload, timed at
the start and end of every condition, shows how much the machine itself moved.
Writes ``results/bench/profile_noise.json``.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from umsearch.core.model_spec import ModelSpec, parse_arg
from umsearch.core.profile import Link
from umsearch.measure.profiler import ProfileConfig, device_name, profile_model
from umsearch.measure.stash import saved_bytes, tensor_bytes
from umsearch.nn.models import BuiltModel, build_model
from umsearch.storage.jsonio import write_json

SCHEMA = "umsearch.bench.profile_noise/1"
LINK = Link(latency_ms=0.1, bandwidth_gb_per_s=5.0)
Curves = tuple[list[list[float]], list[list[float]]]
"""Per layer, per size: forward ms and backward ms."""


# ------------------------------------------------- the old method (a faithful copy, for comparison)
OLD_IN_FLIGHT = 8


def _old_timed(fn: Callable[[], Any], device: torch.device) -> tuple[Any, float]:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t = time.perf_counter()
    out = fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return out, (time.perf_counter() - t) * 1e3


def _old_pipelined_ms(fwd: Callable[[], torch.Tensor], device: torch.device, repeats: int, warmup: int) -> tuple[float, float]:
    for _ in range(warmup):
        o = fwd()
        if o.requires_grad:
            o.backward(torch.ones_like(o))
    outs: list[torch.Tensor] = []
    f_times: list[float] = []
    for _ in range(max(repeats, OLD_IN_FLIGHT)):
        out, ms = _old_timed(fwd, device)
        outs.append(out)
        f_times.append(ms)
    if not outs[0].requires_grad:
        return statistics.median(f_times), 0.0
    grad = torch.ones_like(outs[0])
    b_times = []
    while outs:
        o = outs.pop()
        b_times.append(_old_timed(lambda: o.backward(grad), device)[1])  # noqa: B023 - called at once
    return statistics.median(f_times), statistics.median(b_times)


def _old_measure_layer(module: torch.nn.Module, x: torch.Tensor, last: bool, built: BuiltModel, y: torch.Tensor,
                       device: torch.device, repeats: int, warmup: int, *, first: bool) -> tuple[float, float, torch.Tensor, int]:  # fmt: skip
    inp = x.detach()
    if not first and inp.is_floating_point():
        inp.requires_grad_(True)

    def fwd() -> torch.Tensor:
        out = module(inp)
        return built.loss(out, y) if last else out

    f_ms, b_ms = _old_pipelined_ms(fwd, device, repeats, warmup)
    out, stash = saved_bytes(module, inp, (lambda o: built.loss(o, y)) if last else None)
    module.zero_grad(set_to_none=True)
    return f_ms, b_ms, out.detach(), stash


def _old_calibrate(built: BuiltModel, fwd: list[list[float]], bwd: list[list[float]], sizes: Sequence[int],
                   device: torch.device, repeats: int, warmup: int) -> list[dict[str, Any]]:  # fmt: skip
    L = len(built.layers)
    size = sizes[len(sizes) // 2]
    k = sizes.index(size)
    x0, y = built.make_batch(size, torch.Generator().manual_seed(1))
    inputs = [x0]
    with torch.no_grad():
        for m in built.layers:
            inputs.append(m(inputs[-1]))
    out = []
    for lo, hi in sorted({(0, L // 2), (L // 2, L), (0, L // 4), (L // 4, L // 2)} - {(0, 0)}):
        if hi <= lo:
            continue
        f, b, _, _ = _old_measure_layer(torch.nn.Sequential(*built.layers[lo:hi]), inputs[lo], hi == L, built, y,
                                        device, repeats, warmup, first=lo == 0)  # fmt: skip
        total = sum(fwd[i][k] + bwd[i][k] for i in range(lo, hi))
        out.append({"layers": [lo, hi], "error": (f + b) / total - 1 if total > 0 else 0.0})
    return out


def old_profile(built: BuiltModel, sizes: Sequence[int], repeats: int, device: torch.device) -> Curves:
    """Per-layer forward and backward ms per size, measured the old way (with its calibration run)."""
    g = torch.Generator().manual_seed(0)
    L = len(built.layers)
    fwd: list[list[float]] = [[] for _ in range(L)]
    bwd: list[list[float]] = [[] for _ in range(L)]
    for b in sizes:
        x, y = built.make_batch(b, g)
        for i, m in enumerate(built.layers):
            f, bw, x, _ = _old_measure_layer(m, x, i == L - 1, built, y, device, repeats, 2, first=i == 0)
            fwd[i].append(f)
            bwd[i].append(bw)
    _old_calibrate(built, fwd, bwd, sizes, device, repeats, 2)
    _ = tensor_bytes  # the old method also recorded bytes; they do not drift
    return fwd, bwd


# ------------------------------------------------------------------------------------ the bench
def drift_cells(a: Curves, b: Curves) -> list[float]:
    """|(fa+ba) - (fb+bb)| / (fa+ba) for every layer and size with a positive first value."""
    return [abs((fa + ba) - (fb + bb)) / (fa + ba)
            for la_f, la_b, lb_f, lb_b in zip(a[0], a[1], b[0], b[1], strict=True)
            for fa, ba, fb, bb in zip(la_f, la_b, lb_f, lb_b, strict=True) if fa + ba > 0]  # fmt: skip


def bootstrap_ci(xs: Sequence[float], seed: int = 0, n: int = 2000) -> tuple[float, float]:
    """95% bootstrap interval of the mean of ``xs``."""
    rng = random.Random(seed)
    means = sorted(statistics.fmean(rng.choices(xs, k=len(xs))) for _ in range(n))
    return means[int(0.025 * n)], means[int(0.975 * n) - 1]


def new_profile(spec: ModelSpec, sizes: Sequence[int], repeats: int, device: torch.device) -> tuple[Curves, dict[str, Any]]:
    prof = profile_model(build_model(spec), spec, ProfileConfig(sizes=tuple(sizes), device=device, repeats=repeats),
                         link=LINK)  # fmt: skip
    curves = ([list(lay.fwd_ms) for lay in prof.layers], [list(lay.bwd_ms) for lay in prof.layers])
    pooled = prof.extra["pooled"]
    identical = all(prof.layers[i].fwd_ms == prof.layers[g[0]].fwd_ms and prof.layers[i].bwd_ms == prof.layers[g[0]].bwd_ms
                    for g in pooled for i in g)  # fmt: skip
    monotone = all(all(x <= y for x, y in zip(v, v[1:], strict=False))
                   for lay in prof.layers for q in ("fwd", "bwd", "bwd_input", "bwd_weight")
                   if (v := lay.times(q)) is not None)  # fmt: skip
    q = prof.extra["quality"]
    return curves, {"verdict": q["verdict"], "message": q["message"], "pooled": pooled, "identical_pooled": identical,
                    "monotone": monotone, "cpu_share": q["cpu_share"]}  # fmt: skip


def reference_ms(device: torch.device, n: int = 30) -> float:
    """Median time of a fixed matmul: the machine's own speed, for drift between conditions."""
    a = torch.randn(256, 256, device=device)
    times = []
    for _ in range(n):
        t = time.perf_counter()
        a @ a
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def _profile(method: str, spec: ModelSpec, a: argparse.Namespace, device: torch.device) -> tuple[Curves, float, dict[str, Any]]:
    t = time.perf_counter()
    if method == "old":
        curves, info = old_profile(build_model(spec), a.sizes, a.old_repeats, device), {}
    else:
        curves, info = new_profile(spec, a.sizes, a.repeats, device)
    return curves, time.perf_counter() - t, info


def run_condition(name: str, spec: ModelSpec, a: argparse.Namespace, device: torch.device, offset: int) -> dict[str, Any]:
    hog = subprocess.Popen([sys.executable, "-c", "while 1: pass"]) if name == "busy" else None
    try:
        if hog:
            time.sleep(1.0)
        ref_before = reference_ms(device)
        trials = []
        for t in range(a.trials):
            methods = ["old", "new"] if (t + offset) % 2 == 0 else ["new", "old"]
            row: dict[str, Any] = {}
            for method in methods:
                (ca, wa, info), (cb, wb, _) = (_profile(method, spec, a, device) for _ in range(2))
                cells = drift_cells(ca, cb)
                lo, hi = bootstrap_ci(cells, seed=t)
                row[method] = {"drift_percent": 100 * statistics.fmean(cells), "ci95_percent": [100 * lo, 100 * hi],
                               "cells": len(cells), "wall_s": [wa, wb], **info}  # fmt: skip
                print(f"{name} trial {t} {method}: drift {row[method]['drift_percent']:.1f}% "
                      f"[{100 * lo:.1f}, {100 * hi:.1f}], {wa:.1f} s + {wb:.1f} s", flush=True)  # fmt: skip
            trials.append(row)
        ref_after = reference_ms(device)
    finally:
        if hog:
            hog.terminate()
            hog.wait()
    summary = {m: {"median_drift_percent": statistics.median(r[m]["drift_percent"] for r in trials),
                   "median_wall_s": statistics.median(w for r in trials for w in r[m]["wall_s"])} for m in ("old", "new")}  # fmt: skip
    summary["new_over_old_drift"] = summary["new"]["median_drift_percent"] / max(summary["old"]["median_drift_percent"], 1e-9)
    return {"trials": trials, "summary": summary, "reference_ms": [ref_before, ref_after],
            "machine_drift_percent": 100 * (ref_after / ref_before - 1), "loadavg_1m": os.getloadavg()[0]}  # fmt: skip


def environment() -> dict[str, Any]:
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=False).stdout.strip()
    except OSError:
        commit = ""
    return {"python": platform.python_version(), "torch": torch.__version__, "cpus": os.cpu_count(),
            "device": device_name(torch.device("cpu")), "threads": torch.get_num_threads(), "platform": platform.platform(),
            "loadavg_1m_start": os.getloadavg()[0], "commit": commit,
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}  # fmt: skip


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="gpt", help="zoo model (default gpt: 16 layers)")
    ap.add_argument("--arg", action="append", default=[], help="model argument KEY=VALUE")
    ap.add_argument("--sizes", default="1,2,4,8,16,32")
    ap.add_argument("--repeats", type=int, default=15, help="rounds of the new method")
    ap.add_argument("--old-repeats", type=int, default=5, help="repeats of the old method (its CLI default)")
    ap.add_argument("--trials", type=int, default=1, help="pairs per method and condition")
    ap.add_argument("--conditions", default="idle,busy")
    ap.add_argument("--out", default="results/bench/profile_noise.json")
    a = ap.parse_args(argv)
    a.sizes = [int(s) for s in a.sizes.split(",")]
    torch.set_num_threads(1)
    spec = ModelSpec(source=a.model, args=dict(parse_arg(x) for x in a.arg))
    device = torch.device("cpu")
    doc: dict[str, Any] = {"schema": SCHEMA, "environment": environment(), "model": spec.to_json(),
                           "sizes": a.sizes, "repeats": {"new": a.repeats, "old": a.old_repeats}, "trials": a.trials,
                           "metric": "mean over layers and sizes of |(f+b)_A - (f+b)_B| / (f+b)_A, two back-to-back profiles",
                           "conditions": {}}  # fmt: skip
    for k, name in enumerate(a.conditions.split(",")):
        doc["conditions"][name] = run_condition(name, spec, a, device, k)
    doc["environment"]["loadavg_1m_end"] = os.getloadavg()[0]
    write_json(a.out, doc)
    print(f"wrote {a.out}")
    return doc


if __name__ == "__main__":
    main()
