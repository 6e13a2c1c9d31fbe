"""The one short GPU check of issue 29: one GPU proves a many-GPU plan (``scripts/gpu_check.sh`` runs it).

``python -m benchmarks.gpu_check`` runs, on one CUDA GPU (80 GB or more; under
8 minutes in all, each step under its own time limit), and prints one line per
check (pass or fail, and its figure):

1. the tests that need CUDA;
2. a bf16 profile of the 24-block GPT of width 1024 (sequence 1024), the
   profiler's sizes bounded by the GPU's memory; its wall time is the GPU cost
   of a profile (issue 31);
3. a 2 x 8 cluster plan of it (``search_spaces/gpt24_h200_2x8.toml``'s cluster
   and batch, this profile);
4. ``umsearch replay --all-ranks`` of that plan on the GPU: per rank, measured
   over predicted busy time and peak memory (the tally and the allocator's);
5. ``umsearch calibrate --replay`` on the GPU: the held-out error;
6. a 1-rank plan run with ``umsearch run --backend nccl``: predicted against
   measured peak memory.

It writes ``results/bench/gpu.json`` with the environment and every step's
command, wall time, outcome and figures. ``--cpu`` runs the same steps on this
machine's CPU with a 4-block GPT and a 2 x 2 cluster (writing
``gpu_check_cpu.json``): it proves the steps work together where no GPU is,
and measures nothing about GPUs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.stats import environment
from umsearch.storage.jsonio import write_json

GPT24 = ["--arg", "layers=24", "--arg", "width=1024", "--arg", "heads=16", "--arg", "seq=1024", "--arg", "vocab=32000"]
GPT_SMALL = ["--arg", "layers=4", "--arg", "width=64", "--arg", "heads=4", "--arg", "seq=16", "--arg", "vocab=128"]


@dataclass
class Check:
    """One step's record."""

    name: str
    command: list[str]
    ok: bool = False
    wall_s: float = 0.0
    figures: dict[str, Any] = field(default_factory=dict)
    error: str = ""


@dataclass
class Setting:
    """What differs between the GPU run and the CPU rehearsal."""

    device: str
    dtype: str
    backend: str
    model: list[str]
    sizes: str
    nodes: int
    gpus_per_node: int
    global_batch: int


GPU = Setting(device="cuda", dtype="bf16", backend="nccl", model=GPT24, sizes="1,2,4,8,16", nodes=2, gpus_per_node=8,
              global_batch=256)  # fmt: skip
CPU = Setting(device="cpu", dtype="fp32", backend="gloo", model=GPT_SMALL, sizes="1,2,4", nodes=2, gpus_per_node=2,
              global_batch=16)  # fmt: skip


def _run(check: Check, limit_s: float) -> subprocess.CompletedProcess[str] | None:
    """Run the step's command under ``limit_s``; None (and the check failed) on a timeout."""
    start = time.monotonic()
    try:
        done = subprocess.run(check.command, capture_output=True, text=True, timeout=limit_s, check=False)
    except subprocess.TimeoutExpired:
        check.error = f"over its {limit_s:.0f} s limit"
        return None
    finally:
        check.wall_s = time.monotonic() - start
    check.ok = done.returncode == 0
    if not check.ok:
        check.error = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
    return done


def umsearch(*args: str) -> list[str]:
    return [sys.executable, "-m", "umsearch", *args]


def _cluster(tmp: Path, s: Setting, profile: Path) -> Path:
    space = tmp / "cluster.toml"
    space.write_text(f'name = "gpu_check"\nprofile = "{profile}"\nglobal_batch = {s.global_batch}\n\n'
                     '[search]\ntime_budget_s = 60\nseed = 0\n\n'
                     f"[cluster]\nnodes = {s.nodes}\ngpus_per_node = {s.gpus_per_node}\n"
                     "intra = {latency_ms = 0.005, bandwidth_gb_per_s = 300}\n"
                     "inter = {latency_ms = 0.02, bandwidth_gb_per_s = 25}\n")  # fmt: skip
    return space


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def steps(s: Setting, tmp: Path) -> list[Check]:
    """Every check, run in order (a step whose input is missing fails without running)."""
    checks: list[Check] = []
    tests = Check("CUDA tests", [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k",
                                 "cuda or nccl or gpu", "tests/measure", "tests/runtime"])  # fmt: skip
    if s.device == "cuda":
        done = _run(tests, 120)
        tests.figures["summary"] = done.stdout.strip().splitlines()[-1] if done and done.stdout.strip() else None
        checks.append(tests)
    profile = tmp / "profile.json"
    blocks = s.model[s.model.index("--arg") + 1]
    prof = Check(f"profile gpt {blocks} {s.dtype}", umsearch("profile", "gpt", *s.model, "--device", s.device, "--dtype",
                                                       s.dtype, "--sizes", s.sizes, "--repeats", "3", "--out",
                                                       str(profile)))  # fmt: skip
    _run(prof, 240)
    if prof.ok:
        got = json.loads(profile.read_text())
        prof.figures = {"sizes": got.get("microbatch_sizes"), "wall_s": prof.wall_s}
    checks.append(prof)
    plan_dir = tmp / "cluster"
    search = Check(f"{s.nodes} x {s.gpus_per_node} cluster plan",
                   umsearch("search", str(_cluster(tmp, s, profile)), "--out", str(plan_dir), "--json"))  # fmt: skip
    if prof.ok and (done := _run(search, 120)) is not None and search.ok:
        got = json.loads(done.stdout)
        search.figures = {k: got.get(k) for k in ("iteration_ms", "ranks", "data_parallel", "zero1")}
    checks.append(search)
    replay = Check("replay --all-ranks", umsearch("replay", str(plan_dir / "plan.json"), "--all-ranks", "--device",
                                                  s.device, "--steps", "3", "--json"))  # fmt: skip
    if search.ok and (done := _run(replay, 180)) is not None and replay.ok:
        ranks = json.loads(done.stdout)["ranks"]
        busy = [_ratio(r["measured_busy_ms"], r["predicted_busy_ms"]) for r in ranks]
        memory = [_ratio(r["measured_peak_bytes"], r["predicted_peak_bytes"]) for r in ranks]
        device = [_ratio(r.get("device_peak_bytes"), r["predicted_peak_bytes"]) for r in ranks]
        replay.figures = {"busy_measured_over_predicted": busy, "tally_over_predicted_peak": memory,
                          "device_peak_over_predicted": device,
                          "busy_error_mean_abs": statistics.fmean(abs(b - 1) for b in busy if b is not None)
                          if any(b is not None for b in busy) else None}  # fmt: skip
    checks.append(replay)
    cal = Check("calibrate --replay", umsearch("calibrate", str(profile), "--replay", "--device", s.device, "--rounds",
                                               "3", "--out", str(tmp / "calibrated.json"), "--json"))  # fmt: skip
    if prof.ok and (done := _run(cal, 150)) is not None and cal.ok:
        got = json.loads(done.stdout)
        cal.figures = {"held_out_mape_percent": got.get("held_out_mape_percent")}
    checks.append(cal)
    one = tmp / "one"
    run = Check("1-rank run, memory", umsearch("run", str(one / "plan.json"), "--backend", s.backend, "--steps", "4",
                                               "--json"))  # fmt: skip
    plan1 = Check("1-rank plan", umsearch("search", "--profile", str(profile), "--ranks", "1", "--global-batch", "16",
                                          "--time-budget-s", "10", "--out", str(one), "--quiet"))  # fmt: skip
    if prof.ok and _run(plan1, 60) is not None and plan1.ok and (done := _run(run, 120)) is not None and run.ok:
        rows = json.loads(done.stdout)["memory"]["ranks"]
        run.figures = {"measured_over_predicted_peak": [row["ratio"] for row in rows]}
    elif not plan1.ok:
        run.error = f"no plan: {plan1.error}"
    checks.append(run)
    return checks


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check", description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="results/bench", help="output folder")
    ap.add_argument("--cpu", action="store_true", help="rehearse every step on this CPU (small model, 2 x 2 cluster)")
    a = ap.parse_args(argv)
    setting = CPU if a.cpu else GPU
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="umsearch-gpu-check-") as tmp:
        checks = steps(setting, Path(tmp))
    for c in checks:
        figure = ", ".join(f"{k} {v}" for k, v in c.figures.items()) or c.error
        print(f"{'pass' if c.ok else 'FAIL'}  {c.name} ({c.wall_s:.0f} s): {figure}")
    doc = {"schema": "benchmarks.gpu_check/1", "command": "python -m benchmarks.gpu_check " + " ".join(argv or sys.argv[1:]),
           "setting": vars(setting), "environment": environment(), "wall_s": time.time() - t0,
           "checks": [vars(c) for c in checks]}  # fmt: skip
    out = Path(a.out) / ("gpu_check_cpu.json" if a.cpu else "gpu.json")
    write_json(out, doc)
    print(f"wrote {out} in {doc['wall_s']:.0f} s")
    return 0 if all(c.ok for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
