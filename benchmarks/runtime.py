"""Runtime benchmark: the searched plan against every peer schedule, measured, and how well each was predicted.

``python -m benchmarks.runtime`` does, for each model of :data:`MODELS`:

1. profile it here (``umsearch profile``, one thread, as each rank runs), or
   take ``--profile-dir``'s profiles, and calibrate the runtime's own costs
   (:func:`umsearch.orchestrate.calibration.calibrate`);
2. search 2 ranks x :data:`BATCH` (stages per rank 1-2, I/W split allowed)
   on the calibrated profile; the search also gives every peer schedule of
   docs/model.md 6.2 at its best microbatch count and partition, and the local
   greedy plan; the calibration's probe plans join them (2 to 16 microbatches);
3. run all of them with umsearch's runtime in one set of processes,
   :data:`ROUNDS` rounds, the order rotated every round
   (:func:`umsearch.runtime.fidelity.measure_contenders`).

It writes ``results/bench/runtime.json``: per model and plan the predicted
(calibrated and bare) and measured iteration time (median, 95% bootstrap
interval, quartiles, drift), the fidelity (MAPE both ways, Kendall tau,
per-rank busy error), and per peer the paired per-round ratio
peer / searched with its 95% interval: above 1 means the searched plan won.
Every peer runs here on umsearch's runtime, with torch's own action order;
torch's ``PipelineSchedule`` classes themselves are not run.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.stats import environment, kendall_tau, ratio, summary
from umsearch.core.cost import CostModel
from umsearch.core.model_spec import ModelSpec
from umsearch.core.plan import Plan
from umsearch.core.profile import Profile, load_profile
from umsearch.errors import RuntimeExecutionError
from umsearch.storage.jsonio import write_json

MODELS: dict[str, dict[str, Any]] = {
    "gpt": {"source": "gpt", "args": {"layers": 6, "width": 128, "heads": 4, "seq": 64}},
    "mlp": {"source": "mlp", "args": {"width": 1024, "layers": 8}},
}
BATCH = 16
SIZES = (1, 2, 4, 8, 16)
ROUNDS = 30
SEED = 0
SCHEMA = "benchmarks.runtime/2"


def measure_profile(spec: dict[str, Any], path: Path, repeats: int = 15, context_layers: int | None = None) -> Profile:
    """Profile ``spec`` with ``umsearch profile`` (its flags are the stable interface); ``context_layers``:
    the profiler's ``--context-layers`` (None: its default)."""
    cmd = [sys.executable, "-m", "umsearch", "profile", spec["source"],
           *[f"--arg={k}={v}" for k, v in spec["args"].items()],
           "--sizes", ",".join(map(str, SIZES)), "--threads", "1", "--repeats", str(repeats), "--out", str(path),
           *(["--context-layers", str(context_layers)] if context_layers else [])]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeExecutionError(f"profiling failed ({' '.join(cmd)}):\n{done.stderr[-2000:]}")
    return load_profile(path)


def contenders(profile: Profile, budget_s: float) -> list[tuple[str, Plan]]:
    """The searched plan first, then every feasible baseline of the same search (peers, local greedy),
    then the calibration's probe plans (2 to 16 microbatches) for a wider fidelity set."""
    from umsearch.orchestrate.calibration import probe_plans
    from umsearch.search.driver import run_search
    from umsearch.search.space import build_space

    space = build_space({"profile": "in-memory", "ranks": 2, "global_batch": BATCH, "stages_per_rank": [1, 2],
                         "time_budget_s": budget_s, "seed": SEED})  # fmt: skip
    result = run_search(space, profile)
    out = [("umsearch", result.best.plan)]
    out += [(name, b.plan) for name, b in result.baselines.items() if b is not None]
    out += [(f"probe {name}", plan) for name, plan in probe_plans(profile, 2, BATCH)]
    return out


def torch_comparison(factory: Any, plans: list[tuple[str, Plan]], rounds: int) -> dict[str, Any]:
    """torch's own runtime on every peer's best plan, umsearch's runtime on the same plans and on the
    searched one (first in ``plans``), side by side (:mod:`benchmarks.torch_peers`); wall time from a
    barrier to the end of the optimizer step, slowest rank."""
    from benchmarks.torch_peers import measure
    from umsearch.core.schedules import PEER_SCHEDULES

    peers = [(n, p) for n, p in plans[1:] if n in PEER_SCHEDULES]
    jobs: list[Any] = [("umsearch", plans[0][1], None)]
    for n, p in peers:
        jobs += [("torch", p, n), ("umsearch", p, None)]
    times = measure(factory, jobs, ranks=2, rounds=rounds)
    ours = times[0]
    rows = {}
    for k, (n, _) in enumerate(peers):
        torch_ms, same_ms = times[1 + 2 * k], times[2 + 2 * k]
        rows[n] = {"torch_runtime": summary(torch_ms), "umsearch_runtime_same_plan": summary(same_ms),
                   "torch_over_searched": {k2: v for k2, v in ratio(torch_ms, ours).items() if k2 != "rounds"},
                   "torch_over_umsearch_same_plan": {k2: v for k2, v in ratio(torch_ms, same_ms).items()
                                                     if k2 != "rounds"}}  # fmt: skip
    best = min(rows, key=lambda n: rows[n]["torch_runtime"]["median"]) if rows else None
    return {"timing": "wall ms from a barrier to the end of the optimizer step, slowest rank; rounds rotated",
            "rounds": rounds, "searched_umsearch_runtime": summary(ours), "peers": rows, "best_torch_peer": best}  # fmt: skip


def model_report(name: str, spec: dict[str, Any], profile: Profile, rounds: int, budget_s: float,
                 torch_rounds: int = 20) -> dict[str, Any]:  # fmt: skip
    """Calibrate, search, measure one model's contenders; its section of the JSON.

    The prediction is reported twice: with the calibrated runtime costs (what
    the search used) and without them (the bare profile).
    """
    import dataclasses

    from umsearch.core.profile import RuntimeCosts
    from umsearch.orchestrate.calibration import calibrate
    from umsearch.runtime.config import LaunchConfig, RunConfig
    from umsearch.runtime.fidelity import Contender, measure_contenders
    from umsearch.runtime.model_source import spec_factory
    from umsearch.sim.reference import simulate

    factory = spec_factory(ModelSpec.from_json(spec), SEED)
    profile, calibration = calibrate(profile, factory, rounds=7, batch=BATCH)
    cost = CostModel(profile)
    bare = CostModel(dataclasses.replace(profile, runtime=RuntimeCosts()))
    plans = contenders(profile, budget_s)
    cfg = RunConfig(warmup_steps=2, seed=SEED, launch=LaunchConfig(threads=1, timeout_s=600))
    report = measure_contenders([Contender(name=n, plan=p, cost=cost, factory=factory) for n, p in plans], cfg,
                                rounds=rounds)  # fmt: skip
    ours = report.rows[0]
    rows = []
    for r in report.rows:
        row = {**r.to_json(), "measured": summary(list(r.measured_all_ms)),
               "predicted_bare_ms": simulate(r.plan, bare).iteration_ms}  # fmt: skip
        if r is not ours:
            paired = ratio(list(r.measured_all_ms), list(ours.measured_all_ms))
            row["ratio_over_umsearch"] = {k: v for k, v in paired.items() if k != "rounds"}
            row["predicted_ratio_over_umsearch"] = r.predicted_ms / ours.predicted_ms
        rows.append(row)
    peers = [row for row in rows[1:] if not row["name"].startswith("probe") and row["name"] != "local greedy"]
    best_peer = min(peers, key=lambda row: row["measured_median_ms"]) if peers else None
    measured = [r.measured_ms for r in report.rows]
    busy = [abs(e) for r in report.rows for e in r.busy_error if e is not None]
    return {
        "model": spec, "global_batch": BATCH, "ranks": 2, "rounds": rounds, "drift": report.drift,
        "mape_percent": report.mape_percent,
        "mape_percent_bare": 100.0 * statistics.fmean(abs(row["predicted_bare_ms"] / row["measured_median_ms"] - 1)
                                                      for row in rows),
        "kendall_tau": kendall_tau([r.predicted_ms for r in report.rows], measured),
        "busy_mape_percent": 100.0 * statistics.fmean(busy) if busy else None,
        "best_peer_measured": None if best_peer is None else {
            "name": best_peer["name"], "ratio_over_umsearch": best_peer["ratio_over_umsearch"],
            "predicted_ratio_over_umsearch": best_peer["predicted_ratio_over_umsearch"]},
        "torch_runtime": torch_comparison(factory, plans, torch_rounds) if torch_rounds > 0 else None,
        "calibration": calibration, "plans": rows, "profile": profile.to_json(),
    }  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.runtime", description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="results/bench", help="output folder")
    ap.add_argument("--rounds", type=int, default=ROUNDS, help="measured rounds per plan")
    ap.add_argument("--budget", type=float, default=20.0, help="search time budget per model (s)")
    ap.add_argument("--torch-rounds", type=int, default=20, help="rounds of the torch-runtime comparison (0: skip)")
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated names from MODELS")
    ap.add_argument("--profile-dir", default=None, help="take NAME.json profiles from here instead of measuring")
    a = ap.parse_args(argv)
    t0 = time.time()
    doc: dict[str, Any] = {"schema": SCHEMA, "command": "python -m benchmarks.runtime " + " ".join(argv or sys.argv[1:]),
                           "environment": environment(), "threads_per_rank": 1, "backend": "gloo",
                           "timing": "iteration = latest action end after the common barrier, over all ranks; "
                                     "median over rotated rounds", "models": {}}  # fmt: skip
    for name in a.models.split(","):
        spec = MODELS[name]
        if a.profile_dir:
            profile = load_profile(Path(a.profile_dir) / f"{name}.json")
        else:
            with tempfile.TemporaryDirectory(prefix="umsearch-bench-") as tmp:
                profile = measure_profile(spec, Path(tmp) / "profile.json")
        sec = model_report(name, spec, profile, a.rounds, a.budget, a.torch_rounds)
        doc["models"][name] = sec
        print(f"{name}: MAPE {sec['mape_percent']:.1f}% calibrated, {sec['mape_percent_bare']:.1f}% bare; tau "
              f"{sec['kendall_tau']:.2f}; drift {sec['drift']:+.1%}", file=sys.stderr)  # fmt: skip
        for row in sec["plans"]:
            r = row.get("ratio_over_umsearch")
            vs = "" if r is None else f"  peer/umsearch {r['median']:.3f} [{r['ci95'][0]:.3f}, {r['ci95'][1]:.3f}]"
            print(f"  {row['name']:24s} predicted {row['predicted_ms']:8.2f} ms  measured "
                  f"{row['measured_median_ms']:8.2f} ms  {row['error']:+.1%}{vs}", file=sys.stderr)  # fmt: skip
        for peer, row in (sec["torch_runtime"] or {}).get("peers", {}).items():
            r = row["torch_over_searched"]
            print(f"  torch {peer:18s} {row['torch_runtime']['median']:8.2f} ms; torch/searched {r['median']:.3f} "
                  f"[{r['ci95'][0]:.3f}, {r['ci95'][1]:.3f}]", file=sys.stderr)  # fmt: skip
    doc["wall_s"] = time.time() - t0
    write_json(Path(a.out) / "runtime.json", doc)
    print(f"wrote {a.out}/runtime.json in {doc['wall_s']:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    # Run from the imported module so the rank processes unpickle the same classes.
    from benchmarks.runtime import main as _main

    _main()
