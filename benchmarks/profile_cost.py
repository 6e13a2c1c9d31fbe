"""What a profile costs: wall time of ``umsearch profile`` (and its calibration) old against new.

``python -m benchmarks.profile_cost`` profiles each model with each method,
as ``umsearch profile MODEL --sizes ... --calibrate`` does (library calls, one
thread, the link stated), and records

- the wall time of the whole profile and of its timing rounds
  (``measurement.rounds_s``, new methods only), the rounds run and the bursts;
- the difference of each method's values from the first method's: the mean
  absolute relative difference of per-layer forward+backward over every layer
  and size (the ``drift_percent`` of ``benchmarks.profile_noise``; two profiles
  by one method differ by about that much too, so it is not an error);
- with ``--calibrate``, the probe plans run once per model (the probes of the
  last method's profile, 2 ranks, ``--calibration-rounds`` rounds, as
  ``umsearch calibrate``) and every method's profile fitted to those same
  runs: its held-out error on plans left out of the fit
  (``held_out_mape_percent``) and the bare error, so that the methods differ by
  their profiles only; the probes' wall time is reported once, as it is the
  same work for every method.

Methods: ``old`` is the profiler of ``--old-rev`` (default: the commit before
windowed bursts and adaptive stopping), loaded from git into a temporary
module (the rest of the package is today's: the bursts of one window time one
layer there, exactly as before); ``new`` is today's
:func:`umsearch.measure.profiler.profile_model` with adaptive stopping;
``full`` is today's with every cell running all ``--repeats`` rounds
(``stop_precision_pct`` 0), which separates the windows' saving from the
stopping rule's. A fixed reference workload timed before and after each model
shows how much the machine itself moved (``machine_drift``). Writes
``results/bench/profile_cost.json``. On a shared machine the times are the
machine's as much as the method's: read them with the load averages recorded.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from benchmarks.stats import drift, environment
from umsearch.core.model_spec import ModelSpec
from umsearch.core.profile import Link, Profile, save_profile
from umsearch.nn.models import build_model
from umsearch.storage.jsonio import write_json

SCHEMA = "umsearch.bench.profile_cost/1"
LINK = Link(latency_ms=0.1, bandwidth_gb_per_s=5.0)
OLD_REV = "97f8601"
"""The last commit whose profiler timed one layer per burst and ran every cell ``repeats`` rounds."""

MODELS = {
    "hf_gpt2": ModelSpec(source="examples.hf_gpt2:build",
                         args={"layers": 6, "width": 192, "heads": 4, "seq": 64, "vocab": 2048}),  # issue 31's
    "gpt": ModelSpec(source="gpt", args={}),
    "gpt6": ModelSpec(source="gpt", args={"layers": 6}),  # the 6-block GPT of docs/profiler.md
    "vgg16": ModelSpec(source="vgg16", args={}),
    "mlp": ModelSpec(source="mlp", args={}),
    "hybrid": ModelSpec(source="hybrid", args={}),
}  # fmt: skip


def old_profiler(rev: str) -> ModuleType:
    """``umsearch/measure/profiler.py`` as of ``rev``, imported as a module of its own."""
    src = subprocess.run(["git", "show", f"{rev}:umsearch/measure/profiler.py"], capture_output=True, text=True,
                         check=True).stdout  # fmt: skip
    path = Path(tempfile.mkdtemp(prefix="umsearch_old_")) / "umsearch_old_profiler.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("umsearch_old_profiler", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def reference_ms() -> float:
    """Median of 9 timings of a fixed single-threaded workload (matmuls), for the machine's drift."""
    a = torch.randn(256, 256, generator=torch.Generator().manual_seed(0))
    times = []
    for _ in range(9):
        t = time.perf_counter()
        for _ in range(20):
            a @ a
        times.append((time.perf_counter() - t) * 1e3)
    return float(statistics.median(times))


def profile_once(method: str, spec: ModelSpec, sizes: tuple[int, ...], repeats: int, stop_pct: float,
                 old: ModuleType | None) -> tuple[Profile, float]:  # fmt: skip
    """One profile by ``method`` and its wall time (chain pass, rounds, fit)."""
    from umsearch.measure import profiler

    built = build_model(spec)
    if method == "old":
        assert old is not None
        config: Any = old.ProfileConfig(sizes=sizes, repeats=repeats)
        run = old.profile_model
    else:
        config = profiler.ProfileConfig(sizes=sizes, repeats=repeats,
                                        stop_precision_pct=stop_pct if method == "new" else 0.0)  # fmt: skip
        run = profiler.profile_model
    t = time.perf_counter()
    prof = run(built, spec, config, link=LINK)
    return prof, time.perf_counter() - t


def difference_percent(a: Profile, b: Profile) -> float | None:
    """Mean absolute relative difference of per-layer forward+backward of ``b`` from ``a`` (common sizes)."""
    common = [s for s in a.microbatch_sizes if s in b.microbatch_sizes]
    diffs = []
    for la, lb in zip(a.layers, b.layers, strict=True):
        for s in common:
            x = la.fwd_ms[a.microbatch_sizes.index(s)] + la.bwd_ms[a.microbatch_sizes.index(s)]
            y = lb.fwd_ms[b.microbatch_sizes.index(s)] + lb.bwd_ms[b.microbatch_sizes.index(s)]
            if x > 0:
                diffs.append(abs(y / x - 1))
    return 100 * statistics.fmean(diffs) if diffs else None


def calibrate_all(spec: ModelSpec, profiles: dict[str, Profile], rounds: int) -> dict[str, Any]:
    """Run the probes of the last profile once; fit every profile to those runs (held-out error each)."""
    import dataclasses

    from umsearch.core.cost import CostModel
    from umsearch.core.profile import RuntimeCosts
    from umsearch.orchestrate.calibration import measured_plan, probe_plans
    from umsearch.orchestrate.fit import fit_report
    from umsearch.runtime.config import LaunchConfig, RunConfig
    from umsearch.runtime.fidelity import Contender, measure_rounds
    from umsearch.runtime.model_source import spec_factory

    last = list(profiles.values())[-1]
    bare = CostModel(dataclasses.replace(last, runtime=RuntimeCosts()))
    probes = probe_plans(last, 2, 16)
    cfg = RunConfig(warmup_steps=2, launch=LaunchConfig(threads=1, timeout_s=600))
    t = time.perf_counter()
    steps = measure_rounds([Contender(name=n, plan=p, cost=bare, factory=spec_factory(spec, 0)) for n, p in probes],
                           cfg, rounds=rounds)  # fmt: skip
    wall = time.perf_counter() - t
    out: dict[str, Any] = {"probes_wall_s": wall, "rounds": rounds, "probes": [n for n, _ in probes]}
    for method, prof in profiles.items():
        measured = [measured_plan(n, p, prof, st) for (n, p), st in zip(probes, steps, strict=True)]
        _, report = fit_report(prof, measured, how={"source": "benchmarks.profile_cost"})
        out[method] = {k: report.get(k) for k in ("held_out_mape_percent", "mape_percent", "mape_percent_bare")}
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    ap.add_argument("--methods", default="old,new", help="comma-separated, of old, full, new (the first is the "
                                                          "reference of the differences)")  # fmt: skip
    ap.add_argument("--sizes", default="1,2,4,8,16,32")
    ap.add_argument("--repeats", type=int, default=15, help="timed rounds (the most, for new)")
    ap.add_argument("--stop-precision", type=float, default=None, help="new's stop_precision_pct (default: its)")
    ap.add_argument("--old-rev", default=OLD_REV)
    ap.add_argument("--calibrate", action="store_true", help="also run the probes and fit each profile")
    ap.add_argument("--calibration-rounds", type=int, default=7)
    ap.add_argument("--note", default="", help="free text kept in the record (e.g. what else loaded the machine)")
    ap.add_argument("--out", default="results/bench/profile_cost.json")
    ap.add_argument("--save-profiles", default=None, help="folder to write every profile to (MODEL_METHOD.json)")
    a = ap.parse_args(argv)
    from umsearch.measure.profiler import DEFAULT_STOP_PRECISION_PCT

    torch.set_num_threads(1)
    sizes = tuple(int(s) for s in a.sizes.split(","))
    methods = a.methods.split(",")
    stop_pct = DEFAULT_STOP_PRECISION_PCT if a.stop_precision is None else a.stop_precision
    old = old_profiler(a.old_rev) if "old" in methods else None
    env = {**environment(), "torch": torch.__version__, "threads": 1}
    record: dict[str, Any] = {"schema": SCHEMA, "environment": env, "note": a.note,
                              "settings": {"sizes": list(sizes), "repeats": a.repeats, "methods": methods,
                                           "stop_precision_pct": stop_pct, "old_rev": a.old_rev},
                              "models": {}}  # fmt: skip
    for name in a.models.split(","):
        spec = MODELS[name]
        ref_start = reference_ms()
        profiles: dict[str, Profile] = {}
        rows: dict[str, Any] = {}
        for method in methods:
            load = os.getloadavg()[0]
            prof, wall = profile_once(method, spec, sizes, a.repeats, stop_pct, old)
            profiles[method] = prof
            if a.save_profiles:
                save_profile(prof, Path(a.save_profiles) / f"{name}_{method}.json")
            m = prof.extra["measurement"]
            rows[method] = {"wall_s": wall, "measurement_duration_s": m.get("duration_s"),
                            "rounds_s": m.get("rounds_s"), "rounds": m.get("rounds"),
                            "stopping": m.get("stopping"), "loadavg_1m_before": load,
                            "cpu_share": m.get("cpu_share"), "verdict": prof.extra["quality"]["verdict"],
                            "sizes": list(prof.microbatch_sizes),
                            "difference_percent": difference_percent(profiles[methods[0]], prof)}  # fmt: skip
            print(f"{name} {method}: {wall:.1f} s (timing rounds {m.get('rounds_s') or float('nan'):.1f} s), "
                  f"difference from {methods[0]} {rows[method]['difference_percent'] or 0.0:.1f}%", flush=True)
        entry: dict[str, Any] = {"spec": spec.to_json(), "methods": rows}
        if a.calibrate:
            entry["calibration"] = calibrate_all(spec, profiles, a.calibration_rounds)
            print(f"{name} calibration: {entry['calibration']}", flush=True)
        ref_end = reference_ms()
        entry["machine_drift"] = {"reference_ms": [ref_start, ref_end], "drift": drift([ref_start], [ref_end])}
        record["models"][name] = entry
        write_json(a.out, record)  # after every model: an interrupted run keeps what it measured
    print(f"wrote {a.out}")
    return record


if __name__ == "__main__":
    main()
