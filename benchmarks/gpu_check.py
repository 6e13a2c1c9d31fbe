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
   then docs/model.md section 5 against the allocator's peak
   (``max_memory_allocated``, reset before each iteration) on every rank of
   four plan shapes on 2 ranks of the same profile (the CPU rehearsal: seven
   shapes, against the tally);
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


GPU_SHAPES = ("1F1B", "GPipe", "recompute", "ZBV")
"""The plan shapes :func:`allocator_rows` replays on a GPU (each replay builds the 24-block GPT anew, and the
check has minutes): equal lists, all forwards first, recompute, and split backwards on two stages per rank."""


def allocator_rows(device: str, profile_path: str, dtype: str, *model: str) -> list[dict[str, Any]]:
    """Per plan shape of :func:`benchmarks.memory_model.plans` on 2 ranks (on CUDA those of :data:`GPU_SHAPES`)
    and per rank, the peak of one
    replayed iteration (after one warm-up) against docs/model.md section 5's for the profile at
    ``profile_path`` (SGD: state factor 2, what the replay steps). On CUDA the allocator's peak
    (``max_memory_allocated``, reset at the iteration's start by the executor) less what was allocated before
    the replay began (earlier replays' leftovers); elsewhere the tally's. ``model``: the profile's
    ``--arg`` flags."""
    import gc

    import torch

    from benchmarks.memory_model import plans
    from umsearch.core.cost import CostModel
    from umsearch.core.model_spec import ModelSpec, parse_arg
    from umsearch.core.profile import load_profile
    from umsearch.runtime.config import RunConfig
    from umsearch.runtime.model_source import spec_factory
    from umsearch.runtime.replay import replay_rank
    from umsearch.sim.reference import rank_peak_memory, rank_state_bytes

    profile = load_profile(profile_path)
    cost = CostModel(profile, state_factor=2.0)
    factory = spec_factory(ModelSpec(source="gpt", args=dict(parse_arg(a) for a in model[1::2])))
    cfg = RunConfig(precision=dtype)
    cuda = device == "cuda"
    rows = []
    for shape, plan in plans(profile.num_layers, 2).items():
        if cuda and shape not in GPU_SHAPES:
            continue
        for r in range(plan.ranks):
            gc.collect()
            if cuda:
                torch.cuda.empty_cache()
            before = torch.cuda.memory_allocated() if cuda else 0
            replay = replay_rank(plan, factory, r, device=device, cfg=cfg, steps=2)
            device_peak = replay.device_peak_bytes
            measured = device_peak - before if cuda and device_peak is not None else replay.tally.peak_bytes
            predicted = rank_peak_memory(plan, cost, r)
            rows.append({"plan": shape, "rank": r, "measured_peak_bytes": measured, "predicted_peak_bytes": predicted,
                         "predicted_state_bytes": rank_state_bytes(plan, cost, r),
                         "tally_peak_bytes": replay.tally.peak_bytes, "measured_over_predicted": measured / predicted,
                         "message_pool_bytes": replay.pool_bytes})  # fmt: skip
    return rows


def allocator_check(s: Setting, profile: Path, profiled: bool) -> Check:
    """Section 5 against the measured peak (the CUDA allocator's; the tally in the CPU rehearsal), every rank of
    the plan shapes on 2 ranks of the profiled model (:func:`allocator_rows`, in its own process)."""
    code = ("import json, sys; from benchmarks.gpu_check import allocator_rows; "
            "print(json.dumps(allocator_rows(*sys.argv[1:])))")  # fmt: skip
    check = Check("section 5 vs allocator peak" if s.device == "cuda" else "section 5 vs tally peak",
                  [sys.executable, "-c", code, s.device, str(profile), s.dtype, *s.model])  # fmt: skip
    if not profiled:
        check.error = "no profile"
        return check
    done = _run(check, 150 if s.device == "cuda" else 240)
    if done is not None and check.ok:
        rows = json.loads(done.stdout.strip().splitlines()[-1])
        ratios = [row["measured_over_predicted"] for row in rows]
        check.figures = {"measured_by": "torch.cuda.max_memory_allocated" if s.device == "cuda" else "the tally",
                         "measured_over_predicted_min": min(ratios), "measured_over_predicted_max": max(ratios),
                         "ranks_within_2_percent": sum(abs(x - 1) <= 0.02 for x in ratios), "ranks": len(ratios),
                         "rows": rows}  # fmt: skip
    return check


HF_LLAMA_GPU = {"num_hidden_layers": 8, "hidden_size": 2048, "intermediate_size": 5632, "num_attention_heads": 16,
                "num_key_value_heads": 4, "vocab_size": 32000, "seq": 1024}  # fmt: skip
"""TinyLlama's width, SwiGLU width, 4 KV heads and vocabulary (16 heads of 128 where it has 32 of 64) at 8 layers
and sequence 1024: about 0.5 billion parameters."""
HF_LLAMA_CPU = {"num_hidden_layers": 2, "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4,
                "num_key_value_heads": 2, "vocab_size": 97, "seq": 8}  # fmt: skip
BUDGET_S = 480.0
"""``scripts/gpu_check.sh``'s limit on the whole check."""
HF_LLAMA_NEEDS_S = 60.0
"""Fewest seconds left of :data:`BUDGET_S` for the hf:llama case to start (it is last: an unfinished check
writes no gpu.json at all)."""
_STARTED = time.monotonic()


def hf_llama_checks(s: Setting, tmp: Path) -> list[Check]:
    """The hf:llama case (issue 40): a profile of :data:`HF_LLAMA_GPU` from its config alone in the check's
    precision (sizes 1-8, 3 rounds), a 2-rank plan of it replayed rank by rank on the one GPU (measured over
    predicted busy time per rank), and a 1-rank plan run with the check's backend (measured over predicted
    iteration time). On the GPU each step's limit is cut to what is left of :data:`BUDGET_S` (counted from the
    module's import, the check's start), and with less than :data:`HF_LLAMA_NEEDS_S` left the case fails
    without running, saying so. Not yet run on a GPU (none lent so far); the CPU rehearsal profiles a tiny
    Llama at sizes 1-2."""
    cuda = s.device == "cuda"
    args = [a for k, v in (HF_LLAMA_GPU if cuda else HF_LLAMA_CPU).items() for a in ("--arg", f"{k}={v}")]
    profile, two, one = tmp / "hf_llama.json", tmp / "hf_llama_2", tmp / "hf_llama_1"
    prof = Check(f"profile hf:llama {s.dtype}", umsearch("profile", "hf:llama", *args, "--device", s.device, "--dtype",
                                                         s.dtype, "--sizes", "1,2,4,8" if cuda else "1,2", "--repeats",
                                                         "3", "--progress", "none", "--out", str(profile)))  # fmt: skip
    plan2 = Check("hf:llama 2-rank plan", umsearch("search", "--profile", str(profile), "--ranks", "2", "--global-batch",
                                                   "16", "--time-budget-s", "5", "--out", str(two), "--json"))  # fmt: skip
    replay = Check("hf:llama replay --all-ranks", umsearch("replay", str(two / "plan.json"), "--all-ranks", "--device",
                                                           s.device, "--steps", "3", "--json"))  # fmt: skip
    plan1 = Check("hf:llama 1-rank plan", umsearch("search", "--profile", str(profile), "--ranks", "1", "--global-batch",
                                                   "16", "--time-budget-s", "5", "--out", str(one), "--quiet"))  # fmt: skip
    run = Check("hf:llama 1-rank run", umsearch("run", str(one / "plan.json"), "--backend", s.backend, "--steps", "4",
                                                "--json"))  # fmt: skip
    checks = [prof, plan2, replay, plan1, run]

    def go(check: Check, limit_s: float) -> subprocess.CompletedProcess[str] | None:
        left = BUDGET_S - (time.monotonic() - _STARTED) - 10 if cuda else limit_s  # the rehearsal has no budget
        if left < min(limit_s, 20):
            check.error = f"not run: {max(left, 0):.0f} s left of the check's {BUDGET_S:.0f} s"
            return None
        return _run(check, min(limit_s, left))

    if cuda and BUDGET_S - (time.monotonic() - _STARTED) < HF_LLAMA_NEEDS_S:
        for c in checks:
            c.error = f"not run: under {HF_LLAMA_NEEDS_S:.0f} s left of the check's {BUDGET_S:.0f} s"
        return checks
    if go(prof, 120) is None or not prof.ok:
        return checks
    got = json.loads(profile.read_text())
    decoder = got["layers"][1]
    prof.figures = {"sizes": got["microbatch_sizes"], "wall_s": prof.wall_s,
                    "decoder_fwd_bwd_ms_at_largest": decoder["fwd_ms"][-1] + decoder["bwd_ms"][-1]}  # fmt: skip
    if (done := go(plan2, 60)) is not None and plan2.ok:
        plan2.figures = {"predicted_iteration_ms": json.loads(done.stdout).get("iteration_ms")}
        if (done := go(replay, 90)) is not None and replay.ok:
            ranks = json.loads(done.stdout)["ranks"]
            replay.figures = {"busy_measured_over_predicted": [_ratio(r["measured_busy_ms"], r["predicted_busy_ms"])
                                                               for r in ranks]}  # fmt: skip
    if go(plan1, 60) is not None and plan1.ok and (done := go(run, 90)) is not None and run.ok:
        doc = json.loads(done.stdout)
        measured, predicted = doc["median_iteration_ms"], doc["predicted_iteration_ms"]
        run.figures = {"measured_iteration_ms": measured, "predicted_iteration_ms": predicted,
                       "measured_over_predicted": _ratio(measured, predicted)}  # fmt: skip
    return checks


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
    checks.append(allocator_check(s, profile, prof.ok))
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
    checks += hf_llama_checks(s, tmp)
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
