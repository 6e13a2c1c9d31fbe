"""Hugging Face models at a width where a layer takes tens of milliseconds: profile, calibrate, tune, against torch.

``python -m benchmarks.hf_models`` does, for each family of :data:`FAMILIES`
(``hf:NAME`` from its config, random weights; 2 ranks, gloo, one thread per
rank, global batch :data:`BATCH`):

1. ``umsearch profile hf:NAME --arg ... --sizes ...`` and ``umsearch calibrate``
   as a user types them (the link measured, as by default), each timed: their
   wall times, the profile's rounds, and the calibration's held-out error (each
   probe plan predicted by a fit of the others);
2. ``umsearch tune``'s loop (:func:`umsearch.orchestrate.tune.tune_on_machine`) on
   the calibrated profile, 2 ranks: search, measure the searched plans on
   umsearch's runtime and every torch schedule on torch's, in rotated rounds in
   one set of rank processes, on the same ``PipelineStage`` objects, refit,
   repeat; from its last round, the tuned plan against the best torch schedule
   (per-round paired ratio, median and 95% bootstrap interval:
   :func:`benchmarks.tune.summary`, which the tune report's figures are).

It records, per family, the decoder layer's forward and backward times at the
largest size from the profile (the claim "a layer takes at least 10 ms" is read
from there, not assumed) and the 1-minute load average around every step; the
environment once. It writes ``results/bench/hf_models.json`` (``--quick``:
``hf_models_quick.json``, tiny models and few rounds: it proves the steps run
together and measures nothing).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.stats import environment
from benchmarks.tune import summary
from umsearch.storage.jsonio import write_json

SCHEMA = "benchmarks.hf_models/1"
WIDTH = 256
SEQ = 128
VOCAB = 4096
LAYERS = 4
_DECODER = {"num_hidden_layers": LAYERS, "hidden_size": WIDTH, "intermediate_size": 688, "num_attention_heads": 4,
            "num_key_value_heads": 2, "vocab_size": VOCAB, "seq": SEQ}  # fmt: skip
FAMILIES: dict[str, dict[str, Any]] = {
    "llama": _DECODER,
    "qwen2": _DECODER,
    "gpt2": {"n_layer": LAYERS, "n_embd": WIDTH, "n_head": 4, "n_positions": SEQ, "vocab_size": VOCAB, "seq": SEQ},
}
"""Three families at width 256, sequence 128, 4 decoder layers (each family's own attention, MLP and norms; GPT-2
ties its embeddings across the ranks): on this project's 2-core CPU a decoder layer's forward and backward take
tens of milliseconds at 4 samples (each family's section records its times at the largest size)."""
SIZES = "1,2,4"
BATCH = 16
SEED = 0

_TINY = {"num_hidden_layers": 2, "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4,
         "num_key_value_heads": 2, "vocab_size": 97, "seq": 8}  # fmt: skip
QUICK_FAMILIES: dict[str, dict[str, Any]] = {
    "llama": _TINY,
    "gpt2": {"n_layer": 2, "n_embd": 32, "n_head": 4, "n_positions": 8, "vocab_size": 97, "seq": 8},
}
"""``--quick``: tiny models of one untied and one tied family."""


def _load() -> float:
    return os.getloadavg()[0]


def _umsearch(*args: str) -> list[str]:
    return [sys.executable, "-m", "umsearch", *args]


def _timed(cmd: list[str]) -> tuple[str, float]:
    """``cmd``'s stdout and wall time (s); its last lines of stderr in the error when it fails."""
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return done.stdout, wall


def hf_args(args: dict[str, Any]) -> list[str]:
    """``--arg key=value`` for every config override."""
    return [a for k, v in args.items() for a in ("--arg", f"{k}={v}")]


def profile_and_calibrate(name: str, args: dict[str, Any], path: Path, a: argparse.Namespace) -> dict[str, Any]:
    """Steps 1: the two commands, timed; what they measured."""
    from umsearch.core.profile import load_profile

    load = [_load()]
    cmd = _umsearch("profile", f"hf:{name}", *hf_args(args), "--sizes", a.sizes, "--threads", "1", "--repeats",
                    str(a.profile_repeats), "--progress", "none", "--out", str(path))  # fmt: skip
    _, profile_s = _timed(cmd)
    load.append(_load())
    cal_cmd = _umsearch("calibrate", str(path), "--rounds", str(a.calibrate_rounds), "--batch", str(BATCH), "--json",
                        "--progress", "none")  # fmt: skip
    out, calibrate_s = _timed(cal_cmd)
    load.append(_load())
    cal = json.loads(out)
    prof = load_profile(path)
    m = prof.extra["measurement"]
    layer = prof.layers[1]  # the first decoder layer (pooled with the others)
    return {"commands": [" ".join(cmd[2:]), " ".join(cal_cmd[2:])], "profile_wall_s": profile_s,
            "calibrate_wall_s": calibrate_s, "profile_and_calibrate_wall_s": profile_s + calibrate_s,
            "profile_rounds_s": m["rounds_s"], "profile_rounds": m["stopping"],
            "profile_quality": prof.extra["quality"]["verdict"], "profile_cpu_share": m["cpu_share"],
            "sizes": list(prof.microbatch_sizes), "decoder_layer": layer.name,
            "decoder_ms_at_largest_size": {"size": prof.microbatch_sizes[-1], "fwd": layer.fwd_ms[-1],
                                           "bwd": layer.bwd_ms[-1]},
            "head_ms_at_largest_size": {"fwd": prof.layers[-1].fwd_ms[-1], "bwd": prof.layers[-1].bwd_ms[-1]},
            "calibration_held_out_mape_percent": cal.get("held_out_mape_percent"),
            "calibration_in_sample_mape_percent": cal.get("in_sample_mape_percent"),
            "loadavg_1m": {"before_profile": load[0], "before_calibrate": load[1], "after": load[2]}}  # fmt: skip


def tuned(name: str, args: dict[str, Any], path: Path, a: argparse.Namespace) -> dict[str, Any]:
    """Step 2: tune's loop on the calibrated profile; its last round against torch's best schedule."""
    from umsearch.core.model_spec import ModelSpec
    from umsearch.core.profile import load_profile
    from umsearch.orchestrate.tune import TuneConfig, tune_meta, tune_on_machine
    from umsearch.orchestrate.tune_output import document
    from umsearch.runtime.config import LaunchConfig, RunConfig
    from umsearch.runtime.model_source import spec_factory
    from umsearch.search.space import build_space

    factory = spec_factory(ModelSpec(source=f"hf:{name}", args=dict(args)), SEED)
    space = build_space({"profile": str(path), "ranks": 2, "global_batch": BATCH, "time_budget_s": a.search_budget,
                         "seed": SEED, "stages_per_rank": [1, 2]})  # fmt: skip
    cfg = TuneConfig(k=a.k, max_rounds=a.loop_rounds, measure_rounds=a.rounds, budget_min=a.budget_min)
    run_cfg = RunConfig(warmup_steps=2, seed=SEED, launch=LaunchConfig(threads=1, timeout_s=600))
    before, start = _load(), time.perf_counter()
    result = tune_on_machine(load_profile(path), space, factory, cfg, run_cfg)
    wall = time.perf_counter() - start
    return {"global_batch": BATCH, "ranks": 2, "tune_wall_s": wall, "summary": summary(result),
            "loadavg_1m": {"before": before, "after": _load()},
            "tune": document(result, tune_meta(space, cfg, run_cfg, str(path)))}  # fmt: skip


def _print(name: str, sec: dict[str, Any]) -> None:
    p, s = sec["profile"], sec["tuned"]["summary"]
    line = (f"{name}: profile {p['profile_wall_s']:.0f} s + calibrate {p['calibrate_wall_s']:.0f} s, decoder layer "
            f"{p['decoder_ms_at_largest_size']['fwd']:.1f} + {p['decoder_ms_at_largest_size']['bwd']:.1f} ms at "
            f"size {p['decoder_ms_at_largest_size']['size']}, held-out {p['calibration_held_out_mape_percent']:.1f}%; "
            f"tuned {s['winner']}")  # fmt: skip
    if "measured_ratio" in s:
        lo, hi = s["measured_ratio_ci95"]
        line += f", best torch {s['best_torch']} / tuned = {s['measured_ratio']:.3f} [{lo:.3f}, {hi:.3f}]"
    print(line, file=sys.stderr)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.hf_models", description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="results/bench", help="output folder")
    ap.add_argument("--families", default=None, help="comma-separated names from FAMILIES (default: all)")
    ap.add_argument("--quick", action="store_true", help="tiny models, few rounds: proves the steps run; writes "
                                                         "hf_models_quick.json")  # fmt: skip
    ap.add_argument("--sizes", default=SIZES, help="the profiler's microbatch sizes")
    ap.add_argument("--profile-repeats", type=int, default=10, help="the profiler's most rounds (--repeats)")
    ap.add_argument("--calibrate-rounds", type=int, default=5, help="rounds of the calibration probes")
    ap.add_argument("--rounds", type=int, default=10, help="rotated measured rounds per tune round")
    ap.add_argument("--loop-rounds", type=int, default=2, help="most rounds of the tune loop")
    ap.add_argument("--k", type=int, default=2, help="distinct searched plans per tune round")
    ap.add_argument("--search-budget", type=float, default=8.0, help="search seconds per tune round")
    ap.add_argument("--budget-min", type=float, default=5.0, help="tune budget per family, minutes")
    a = ap.parse_args(argv)
    families = QUICK_FAMILIES if a.quick else FAMILIES
    if a.quick:
        a.sizes, a.profile_repeats, a.calibrate_rounds, a.rounds = "1,2", 2, 2, 2
        a.loop_rounds, a.k, a.search_budget = 1, 1, 2.0
    names = a.families.split(",") if a.families else list(families)
    t0 = time.time()
    doc: dict[str, Any] = {"schema": SCHEMA, "command": "python -m benchmarks.hf_models " + " ".join(argv or sys.argv[1:]),
                           "quick": a.quick, "environment": environment(), "settings": vars(a),
                           "threads_per_rank": 1, "backend": "gloo", "families": {},
                           "runtime": "every tune contender on torch's PipelineStage objects in the same rank processes: "
                                      "plans through umsearch.pipelining.PlanSchedule, torch schedules through their "
                                      "own classes (umsearch.orchestrate.contenders)"}  # fmt: skip
    out = Path(a.out) / ("hf_models_quick.json" if a.quick else "hf_models.json")
    for name in names:
        args = families[name]
        with tempfile.TemporaryDirectory(prefix="umsearch-hf-") as tmp:
            path = Path(tmp) / "profile.json"
            sec = {"model": {"source": f"hf:{name}", "args": args}, "profile": profile_and_calibrate(name, args, path, a)}
            sec["tuned"] = tuned(name, args, path, a)
        doc["families"][name] = sec
        _print(name, sec)
        doc["wall_s"] = time.time() - t0
        doc["loadavg_1m_at_end"] = _load()
        write_json(out, doc)  # after every family: an interrupted run keeps what it measured
    print(f"wrote {out} in {doc['wall_s']:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    # Run from the imported module so the rank processes unpickle the same classes.
    from benchmarks.hf_models import main as _main

    _main()
