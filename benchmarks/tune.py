"""Tune benchmark: the plan ``umsearch tune`` hands over against the best torch schedule on torch's own runtime.

``python -m benchmarks.tune`` does, for each model of :data:`MODELS` (2 ranks,
gloo, one thread per rank, B = :data:`BATCH`):

1. profile it here (``umsearch profile``, as :mod:`benchmarks.runtime` does)
   and calibrate it (the probe plans; :func:`umsearch.orchestrate.calibration.calibrate`);
2. run ``umsearch tune``'s loop (:func:`umsearch.orchestrate.tune.tune_on_machine`):
   search, measure the K best plans on umsearch's runtime and every torch
   schedule on torch's runtime in rotated rounds, refit, repeat;
3. report, from the loop's last round: the tuned plan against the best torch
   schedule on torch's runtime (measured per-round paired ratio with its 95%
   bootstrap interval, and the refitted model's predicted ratio, inside the
   interval or not), the refitted model's held-out (leave one plan out) MAPE,
   Kendall tau between predicted and measured over the pairs of contenders
   whose intervals do not overlap, and every contender's drift between the
   first and second half of its rounds.

It writes ``results/bench/tune.json`` (``--name pipelining``:
``pipelining.json``; ``--quick``: ``NAME_quick.json``, one small model, few
rounds: it proves the pipeline runs, it measures no target). Every contender
runs on torch's ``PipelineStage`` objects: the plans through ``PlanSchedule``,
the torch schedules through their own classes; the summary adds the tuned plan
against every torch schedule and the model check (the best torch schedule's
own plan through ``PlanSchedule`` against the tuned plan, predicted and
measured).
Every figure in it was measured in that run; nothing is estimated.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.runtime import measure_profile
from benchmarks.stats import environment
from umsearch.core.model_spec import ModelSpec
from umsearch.core.profile import Profile, load_profile
from umsearch.storage.jsonio import write_json

MODELS: dict[str, dict[str, Any]] = {
    "gpt": {"source": "gpt", "args": {"layers": 6, "width": 128, "heads": 4, "seq": 64}},
    "vgg16": {"source": "vgg16", "args": {"image": 32, "width": 8}},
    "mlp": {"source": "mlp", "args": {"width": 1024, "layers": 8}},
    "hybrid": {"source": "hybrid", "args": {"stem": 4, "blocks": 4, "channels": 32, "width": 128}},
    "hf_gpt2": {"source": "examples.hf_gpt2:build",
                "args": {"layers": 6, "width": 192, "heads": 4, "seq": 64, "vocab": 2048}},
}
BATCH = 32
SEED = 0
SCHEMA = "benchmarks.tune/1"


def separated_tau(predicted: list[float], measured: list[float], intervals: list[tuple[float, float]]) -> float | None:
    """Kendall tau of predicted vs measured over the pairs whose measured intervals do not overlap (the pairs
    the measurement can order); None when there is no such pair."""
    conc = disc = 0
    for i in range(len(measured)):
        for j in range(i + 1, len(measured)):
            (lo_i, hi_i), (lo_j, hi_j) = intervals[i], intervals[j]
            if not (hi_i < lo_j or hi_j < lo_i):
                continue
            dp = predicted[i] - predicted[j]
            if dp == 0:
                continue
            if (dp > 0) == (measured[i] > measured[j]):
                conc += 1
            else:
                disc += 1
    return (conc - disc) / (conc + disc) if conc + disc else None


def _ratio(r: dict[str, Any]) -> dict[str, Any]:
    lo, hi = r["ci95"]
    return {"measured_ratio": r["median"], "measured_ratio_ci95": [lo, hi], "interval_above_1": lo > 1.0}


def summary(result: Any) -> dict[str, Any]:
    """The figures of the issue's 'done when', from the loop's last round."""
    from umsearch.orchestrate.tune_output import (
        best_torch,
        model_check,
        paired_ratio,
        predicted_ratio,
    )

    last = result.rounds[-1].contenders
    w = result.winner
    peer = best_torch(last)
    out: dict[str, Any] = {"winner": w.candidate.name, "winner_runtime": w.candidate.runtime,
                           "best_torch": None if peer is None else peer.candidate.schedule}  # fmt: skip
    if peer is not None and peer is not w:
        r = paired_ratio(peer, w)
        lo, hi = r["ci95"]
        pred = predicted_ratio(peer, w)
        out.update(measured_ratio=r["median"], measured_ratio_ci95=r["ci95"], predicted_ratio=pred,
                   predicted_inside_interval=None if pred is None else lo <= pred <= hi,
                   interval_half_width_points=100 * (hi - lo) / 2, interval_above_1=lo > 1.0)  # fmt: skip
    elif peer is w:
        out["note"] = "a torch schedule measured fastest: torch's schedule is as good here"
    if w.candidate.runtime == "umsearch":
        # The tuned plan against every torch schedule class, all on the same kind of PipelineStages.
        out["every_torch"] = {c.candidate.schedule: _ratio(paired_ratio(c, w)) for c in last
                              if c.candidate.runtime == "torch"}  # fmt: skip
    check = model_check(last, w)
    if check is not None:
        r, pred = check["measured_ratio_over_tuned"], check["predicted_ratio_over_tuned"]
        out["model_check"] = {"peer_plan": check["peer_plan"], "tuned_plan": check["tuned_plan"], **_ratio(r),
                              "predicted_ratio": pred, "predicted_inside_interval": None if pred is None else
                              r["ci95"][0] <= pred <= r["ci95"][1]}  # fmt: skip
    ok = [c for c in last if c.predicted_after_ms is not None]
    out["kendall_tau_separated_pairs"] = separated_tau([c.predicted_after_ms or 0.0 for c in ok],
                                                       [c.median_ms for c in ok], [c.ci95_ms for c in ok])
    drifts = [c.to_json()["drift"] for c in last]
    out["drift_mean_abs"] = statistics.fmean(abs(d) for d in drifts)
    out["drift_max_abs"] = max(abs(d) for d in drifts)
    out["held_out_mape_percent"] = (result.profile.runtime.calibration or {}).get("held_out_mape_percent")
    return out


def model_report(spec: dict[str, Any], profile: Profile, profile_path: str, a: argparse.Namespace) -> dict[str, Any]:
    """Calibrate and tune one model; its section of the JSON."""
    from umsearch.orchestrate.calibration import calibrate
    from umsearch.orchestrate.tune import TuneConfig, tune_meta, tune_on_machine
    from umsearch.orchestrate.tune_output import document
    from umsearch.runtime.config import LaunchConfig, RunConfig
    from umsearch.runtime.model_source import spec_factory
    from umsearch.search.space import build_space

    # Named here, not read from a file: the spec is ours, so it is trusted (and needs no zoo list).
    factory = spec_factory(ModelSpec(source=spec["source"], args=dict(spec["args"])), SEED)
    profile, calibration = calibrate(profile, factory, rounds=a.calibrate_rounds, batch=16)
    space = build_space({"profile": profile_path, "ranks": 2, "global_batch": BATCH, "time_budget_s": a.search_budget,
                         "seed": SEED, "stages_per_rank": [1, 2]})  # fmt: skip
    cfg = TuneConfig(k=a.k, max_rounds=a.loop_rounds, measure_rounds=a.rounds, budget_min=a.budget_min)
    run_cfg = RunConfig(warmup_steps=2, seed=SEED, launch=LaunchConfig(threads=1, timeout_s=600))
    result = tune_on_machine(profile, space, factory, cfg, run_cfg)
    return {"model": spec, "global_batch": BATCH, "ranks": 2, "summary": summary(result),
            "calibration_held_out_mape_percent": calibration["held_out_mape_percent"],
            "calibration": {k: v for k, v in calibration.items() if k != "probe_rows"},
            "tune": document(result, tune_meta(space, cfg, run_cfg, profile_path))}  # fmt: skip


def _print(name: str, s: dict[str, Any]) -> None:
    line = f"{name}: {s['winner']} ({s['winner_runtime']}) measured fastest"
    if "measured_ratio" in s:
        lo, hi = s["measured_ratio_ci95"]
        pred = "-" if s["predicted_ratio"] is None else f"{s['predicted_ratio']:.3f}"
        line += (f"; best torch {s['best_torch']} / tuned = {s['measured_ratio']:.3f} [{lo:.3f}, {hi:.3f}], "
                 f"predicted {pred}")  # fmt: skip
    held = s["held_out_mape_percent"]
    tau = s["kendall_tau_separated_pairs"]
    line += (f"; held-out MAPE {'-' if held is None else f'{held:.1f}%'}; tau "
             f"{'-' if tau is None else f'{tau:.2f}'}; drift max {s['drift_max_abs']:.1%}")  # fmt: skip
    print(line, file=sys.stderr)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.tune", description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="results/bench", help="output folder")
    ap.add_argument("--name", default="tune", help="the JSON's name in --out (pipelining: results/bench/pipelining.json)")
    ap.add_argument("--models", default=None, help="comma-separated names from MODELS (default: all; --quick: gpt)")
    ap.add_argument("--quick", action="store_true", help="one small model, few rounds: proves it runs, measures "
                                                         "no target; writes tune_quick.json")  # fmt: skip
    ap.add_argument("--rounds", type=int, default=30, help="rotated measured rounds per loop round")
    ap.add_argument("--loop-rounds", type=int, default=4, help="most rounds of the tune loop")
    ap.add_argument("--k", type=int, default=4, help="distinct searched plans per loop round")
    ap.add_argument("--search-budget", type=float, default=20.0, help="search seconds per loop round")
    ap.add_argument("--budget-min", type=float, default=60.0, help="tune budget per model, minutes")
    ap.add_argument("--calibrate-rounds", type=int, default=7, help="rounds of the calibration probes")
    ap.add_argument("--profile-repeats", type=int, default=15, help="profiler rounds")
    ap.add_argument("--context-layers", type=int, default=None, help="the profiler's --context-layers (default: its own)")
    ap.add_argument("--profile-dir", default=None, help="take NAME.json profiles from here instead of measuring")
    a = ap.parse_args(argv)
    if a.quick:
        a.rounds, a.loop_rounds, a.k, a.search_budget = min(a.rounds, 5), min(a.loop_rounds, 2), min(a.k, 2), 5.0
        a.calibrate_rounds, a.profile_repeats, a.budget_min = 3, 5, min(a.budget_min, 10.0)
    names = (a.models or ("gpt" if a.quick else ",".join(MODELS))).split(",")
    t0 = time.time()
    doc: dict[str, Any] = {"schema": SCHEMA, "command": "python -m benchmarks.tune " + " ".join(argv or sys.argv[1:]),
                           "quick": a.quick, "environment": environment(), "threads_per_rank": 1, "backend": "gloo",
                           "settings": vars(a), "models": {},
                           "runtime": "every contender on torch's PipelineStage objects in the same processes: plans "
                                      "through umsearch.pipelining.PlanSchedule, torch schedules through their own "
                                      "classes (umsearch.orchestrate.contenders)"}  # fmt: skip
    out = Path(a.out) / (f"{a.name}_quick.json" if a.quick else f"{a.name}.json")
    for name in names:
        spec = MODELS[name]
        with tempfile.TemporaryDirectory(prefix="umsearch-bench-") as tmp:
            path = Path(a.profile_dir) / f"{name}.json" if a.profile_dir else Path(tmp) / "profile.json"
            profile = load_profile(path) if a.profile_dir else measure_profile(spec, path, a.profile_repeats, a.context_layers)
            sec = model_report(spec, profile, str(path), a)
        doc["models"][name] = sec
        _print(name, sec["summary"])
        doc["wall_s"] = time.time() - t0
        write_json(out, doc)  # after every model: an interrupted run keeps what it measured
    print(f"wrote {out} in {doc['wall_s']:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    # Run from the imported module so the rank processes unpickle the same classes.
    from benchmarks.tune import main as _main

    _main()
