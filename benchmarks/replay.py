"""Replay benchmark: each rank replayed alone against the same rank in a real run, memory against the model.

``python -m benchmarks.replay`` does, for each model of :data:`MODELS` (2 ranks,
gloo, one thread per rank, B = :data:`BATCH`):

1. profile it in-process (:func:`umsearch.measure.profiler.profile_model`,
   ``--profile-repeats`` rounds, sizes :data:`SIZES`);
2. **busy time**: for every plan of :func:`plans` (1F1B, interleaved, ZBV
   V-shape with the split backward, recompute, unequal microbatches), in
   ``--rounds`` rounds, rotated (:func:`umsearch.runtime.fidelity.rotation`,
   and replay and the real run alternate which goes first), replay every rank
   (:func:`umsearch.runtime.replay.replay_rank`) and run the plan for real on 2
   gloo ranks (:func:`umsearch.runtime.run_plan.run_plan`); a rank's busy time
   is the sum of its action durations (replay: the median kept iteration; real:
   the median over the kept iterations). Reported per plan and rank: both
   medians with 95% bootstrap intervals, the per-round paired ratio
   replay / real, the simulator's prediction, and each side's drift (second
   half of the rounds over the first);
3. **calibration**: the profile calibrated by today's probe plans run for real
   (:func:`umsearch.orchestrate.calibration.calibrate`) and by the same probes
   replayed (:func:`~umsearch.orchestrate.calibration.calibrate_replay`, what
   ``umsearch calibrate --replay`` calls): each one's own held-out MAPE (probe:
   iteration time; replay: busy time, leave one probe out), and both judged on
   the same held-out target, the real runs' per-rank busy times of step 2's
   plans (none of them a probe);
4. **memory** (docs/model.md section 5, version 2.3, on the profile's measured
   shared boundaries, kept inputs and weight stashes): per plan and rank the
   predicted state and peak activations (the reference simulator's
   ``rank_peak_memory``) against the replay's tally (SGD: state factor 2).

It writes ``results/bench/replay.json`` (``--quick``: ``replay_quick.json``,
one small model, two plans, few rounds: it proves the benchmark runs, it
measures no target). Every figure in it was measured in that run.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from benchmarks.stats import environment, ratio, summary
from umsearch.core.cost import CostModel
from umsearch.core.model_spec import ModelSpec
from umsearch.core.plan import Plan, Stage, equal_split, placed_plan
from umsearch.core.plan_rules import validate_plan
from umsearch.core.profile import Link, Profile
from umsearch.core.schedules import PEER_SCHEDULES, warmup_rule
from umsearch.storage.jsonio import write_json

MODELS: dict[str, dict[str, Any]] = {
    "mlp": {"layers": 7, "width": 256},
    "gpt": {"layers": 4, "width": 64, "heads": 4, "seq": 32, "vocab": 256},
    "vgg16": {"image": 32, "width": 4},
    "hybrid": {"stem": 2, "blocks": 2, "image": 16, "channels": 16, "width": 64, "heads": 4},
}
"""Small zoo settings: every plan runs in well under a second per iteration on one CPU thread."""
QUICK_MODELS: dict[str, dict[str, Any]] = {"mlp": {"layers": 5, "width": 64}}
BATCH = 16
SIZES = (1, 2, 4, 8)
SCHEMA = "benchmarks.replay/1"


# ---------------------------------------------------------------------------------------------------- plans
def peer(name: str, stages_per_rank: int, microbatches: int, layers: int, ranks: int = 2) -> Plan:
    """torch's schedule ``name``: equal microbatches, layers split as evenly as possible."""
    p = PEER_SCHEDULES[name]
    S = ranks * stages_per_rank
    cuts = [round(j * layers / S) for j in range(S + 1)]
    return validate_plan(placed_plan(cuts, p.stage_ranks(ranks, stages_per_rank), BATCH,
                                     [equal_split(BATCH, microbatches)] * S, p.generate(ranks, stages_per_rank, microbatches)))  # fmt: skip


def warmup_plan(layers: int, forward: Sequence[Sequence[int]], recompute: bool, warmups: Sequence[int]) -> Plan:
    """Two stages, one per rank, cut in the middle, ordered by the warmup rule (docs/model.md 6.1)."""
    c = layers // 2
    stages = tuple(Stage(layers=lay, rank=j, forward=tuple(f), backward=tuple(f), recompute=recompute)
                   for j, (lay, f) in enumerate((((0, c), forward[0]), ((c, layers), forward[1]))))  # fmt: skip
    actions = tuple(warmup_rule(j, st.forward, st.backward, w) for j, (st, w) in enumerate(zip(stages, warmups, strict=True)))
    return validate_plan(Plan(global_batch=BATCH, ranks=2, stages=stages, actions=actions))


def plans(layers: int, quick: bool = False) -> dict[str, Plan]:
    """Six plan shapes on 2 ranks (``quick``: the first two)."""
    out = {"1F1B": lambda: peer("1F1B", 1, 4, layers),
           "Interleaved1F1B": lambda: peer("Interleaved1F1B", 2, 4, layers),
           "ZBV": lambda: peer("ZBVZeroBubble", 2, 4, layers),
           "GPipe": lambda: peer("GPipe", 1, 4, layers),
           "recompute": lambda: warmup_plan(layers, ([4] * 4, [4] * 4), True, (2, 1)),
           "unequal": lambda: warmup_plan(layers, ([2, 6, 8], [4, 4, 8]), False, (2, 1))}  # fmt: skip
    names = list(out)[:2] if quick else list(out)
    return {n: out[n]() for n in names}


def profile_of(name: str, args: dict[str, Any], repeats: int) -> tuple[ModelSpec, Profile]:
    from umsearch.measure.profiler import ProfileConfig, profile_model
    from umsearch.nn.models import build_model

    spec = ModelSpec(source=name, args=args)
    cfg = ProfileConfig(sizes=SIZES, repeats=repeats, min_repeats=min(3, repeats), warmup_rounds=1)
    return spec, profile_model(build_model(spec), spec, cfg, link=Link(latency_ms=0.05, bandwidth_gb_per_s=5.0))


# ---------------------------------------------------------------------------------------------------- memory
def _saves(module: torch.nn.Module, x: torch.Tensor, then: Any = None) -> tuple[torch.Tensor, dict[int, int]]:
    """``module(x)`` recording every storage autograd saves (bytes), parameters left out, as stash.py does."""
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            seen[s.data_ptr()] = max(seen.get(s.data_ptr(), 0), s.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = module(x)
        if then is not None:
            then(out)
    return out, seen


def sharing(spec: ModelSpec, b: int = 4) -> dict[str, Any]:
    """Per layer, bytes per sample: ``shared[i]``, saved by both layer ``i-1`` (its output) and layer ``i``
    (its input), which :func:`umsearch.measure.stash.saved_bytes`, run per layer, counts in both;
    ``input_saved[i]``, layer ``i``'s input as layer ``i`` saves it; ``target``: the loss's saved targets."""
    from umsearch.nn.models import build_model

    built = build_model(spec)
    x, y = built.make_batch(b, torch.Generator().manual_seed(0))
    L = len(built.layers)
    prev: dict[int, int] = {}
    shared: list[float] = []
    input_saved: list[float] = []
    target = 0.0
    for i, m in enumerate(built.layers):
        inp = x.detach()
        if i and inp.is_floating_point():
            inp.requires_grad_(True)
        last = i == L - 1
        out, saved = _saves(m, inp, (lambda o: built.loss(o, y)) if last else None)
        input_saved.append(saved.get(inp.untyped_storage().data_ptr(), 0) / b)
        shared.append(sum(v for k, v in saved.items() if k in prev) / b)
        if last:
            target = saved.get(y.untyped_storage().data_ptr(), 0) / b
        prev, x = saved, out.detach()
    return {"shared": shared, "input_saved": input_saved, "target": target}


def memory_rows(spec: ModelSpec, profile: Profile, plan_set: dict[str, Plan]) -> list[dict[str, Any]]:
    """Per plan and rank: predicted state and activations (SGD, factor 2; docs/model.md 5 as the reference
    simulator's ``rank_peak_memory`` predicts them, hand-offs included) against the replay's tally."""
    from umsearch.runtime.model_source import spec_factory
    from umsearch.runtime.replay import predict, replay_rank

    cost = CostModel(profile, state_factor=2.0)
    rows = []
    for name, plan in plan_set.items():
        preds = predict(plan, cost)
        for r in range(plan.ranks):
            t = replay_rank(plan, spec_factory(spec), r, steps=1, prediction=preds[r]).tally
            p = preds[r]
            rows.append({"plan": name, "rank": r, "stages": list(plan.stages_of(r)),
                         "predicted_state_bytes": p.state_bytes, "tallied_state_bytes": t.state_bytes,
                         "predicted_activation_bytes": p.activation_bytes, "tallied_activation_bytes": t.saved_peak_bytes,
                         "activation_ratio": t.saved_peak_bytes / p.activation_bytes if p.activation_bytes else None})  # fmt: skip
    return rows


# ---------------------------------------------------------------------------------------------------- busy time
def real_busy(plan: Plan, spec: ModelSpec, cost: CostModel, steps: int) -> list[float]:
    """Per rank, the median over the kept iterations of a real 2-rank run of its action durations summed."""
    from umsearch.runtime.config import LaunchConfig, RunConfig
    from umsearch.runtime.model_source import spec_factory
    from umsearch.runtime.run_plan import run_plan

    cfg = RunConfig(steps=steps, warmup_steps=1, launch=LaunchConfig(threads=1, timeout_s=300))
    res = run_plan(plan, spec_factory(spec), cfg, cost)
    per: list[list[float]] = [[] for _ in range(plan.ranks)]
    for step in res.kept(1):
        busy = [0.0] * plan.ranks
        for a in step.records:
            busy[a.rank] += a.end_ms - a.start_ms
        for r in range(plan.ranks):
            per[r].append(busy[r])
    return [statistics.median(v) for v in per]


def replay_busy(plan: Plan, spec: ModelSpec, steps: int) -> list[float]:
    """Per rank, the replay's measured busy time (median kept iteration), every rank alone on this CPU."""
    from umsearch.runtime.config import LaunchConfig, RunConfig
    from umsearch.runtime.model_source import spec_factory
    from umsearch.runtime.replay import replay_rank

    cfg = RunConfig(launch=LaunchConfig(threads=1))
    out = []
    for r in range(plan.ranks):
        out.append(replay_rank(plan, spec_factory(spec), r, cfg=cfg, steps=steps).measured_busy_ms)
        gc.collect()
    return out


def busy_section(spec: ModelSpec, profile: Profile, plan_set: dict[str, Plan], rounds: int,
                 steps: int) -> dict[str, Any]:  # fmt: skip
    """Step 2 of the module doc: rotated rounds of replay and real run, per plan and rank."""
    from umsearch.runtime.fidelity import drift, rotation
    from umsearch.runtime.replay import predict

    bare = CostModel(profile, state_factor=2.0)
    names = list(plan_set)
    rep: dict[str, list[list[float]]] = {n: [] for n in names}
    real: dict[str, list[list[float]]] = {n: [] for n in names}
    for k in range(rounds):
        for i in rotation(len(names), k):
            n = names[i]
            first_replay = (k + i) % 2 == 0
            for which in ("replay", "real") if first_replay else ("real", "replay"):
                if which == "replay":
                    rep[n].append(replay_busy(plan_set[n], spec, steps))
                else:
                    real[n].append(real_busy(plan_set[n], spec, bare, steps))
        print(f"  round {k + 1}/{rounds}", file=sys.stderr)
    out: dict[str, Any] = {}
    for n in names:
        preds = predict(plan_set[n], bare)
        ranks = []
        for r in range(plan_set[n].ranks):
            a, b = [x[r] for x in rep[n]], [x[r] for x in real[n]]
            ranks.append({"rank": r, "replay_busy_ms": summary(a), "real_busy_ms": summary(b),
                          "replay_over_real": ratio(a, b), "predicted_busy_ms_uncalibrated": preds[r].busy_ms,
                          "drift_replay": drift(a), "drift_real": drift(b)})  # fmt: skip
        out[n] = {"ranks": ranks, "real_rounds_ms": [x for x in real[n]]}
    return out


# ---------------------------------------------------------------------------------------------------- calibration
def calibration_section(spec: ModelSpec, profile: Profile, plan_set: dict[str, Plan], busy: dict[str, Any],
                        rounds: int) -> dict[str, Any]:  # fmt: skip
    """Step 3 of the module doc: probe calibration and replay calibration, each judged held out."""
    from umsearch.orchestrate.calibration import calibrate, calibrate_replay
    from umsearch.runtime.model_source import spec_factory
    from umsearch.sim.reference import simulate

    t0 = time.time()
    probe_profile, probe_report = calibrate(profile, spec_factory(spec, 0), rounds=rounds, ranks=2, batch=BATCH, threads=1)
    t1 = time.time()
    replay_profile, replay_report = calibrate_replay(profile, spec_factory(spec, 0), rounds=rounds, ranks=2,
                                                     batch=BATCH, threads=1, device="cpu")  # fmt: skip
    t2 = time.time()

    def judged(p: Profile) -> dict[str, Any]:
        errs = []
        rows = []
        for n, plan in plan_set.items():
            sim = simulate(plan, CostModel(p, state_factor=2.0))
            assert sim.busy_ms is not None
            for r in range(plan.ranks):
                measured = busy[n]["ranks"][r]["real_busy_ms"]["median"]
                pred = float(sim.busy_ms[r])
                errs.append(abs(pred - measured) / measured * 100)
                rows.append({"plan": n, "rank": r, "predicted_ms": pred, "measured_ms": measured})
        return {"mape_percent": statistics.fmean(errs), "rows": rows}

    return {"probe": {"seconds": t1 - t0, "held_out_mape_percent": probe_report["held_out_mape_percent"],
                      "judged_by": "iteration_ms of the probes", "op_overhead_ms": probe_report["op_overhead_ms"],
                      "on_real_busy_of_benchmark_plans": judged(probe_profile)},
            "replay": {"seconds": t2 - t1, "held_out_mape_percent": replay_report["held_out_mape_percent"],
                       "judged_by": "busy_ms of the replayed probes", "op_overhead_ms": replay_report["op_overhead_ms"],
                       "on_real_busy_of_benchmark_plans": judged(replay_profile)},
            "uncalibrated": {"on_real_busy_of_benchmark_plans": judged(profile)}}  # fmt: skip


# ---------------------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.replay", description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="results/bench", help="output folder")
    ap.add_argument("--models", default=None, help="comma-separated names from MODELS (default: all)")
    ap.add_argument("--quick", action="store_true", help="one small model, two plans, few rounds: proves it runs, "
                                                         "measures no target; writes replay_quick.json")  # fmt: skip
    ap.add_argument("--rounds", type=int, default=15, help="rotated rounds of replay and real run per plan")
    ap.add_argument("--steps", type=int, default=5, help="iterations per replay / real run (the first is warm-up)")
    ap.add_argument("--calibrate-rounds", type=int, default=7, help="rounds of the calibration probes")
    ap.add_argument("--profile-repeats", type=int, default=10, help="profiler rounds")
    ap.add_argument("--skip-calibration", action="store_true", help="leave step 3 out")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    if a.quick:
        a.rounds, a.steps, a.calibrate_rounds, a.profile_repeats = min(a.rounds, 3), min(a.steps, 3), 2, 3
    models = QUICK_MODELS if a.quick else {k: MODELS[k] for k in (a.models.split(",") if a.models else MODELS)}
    t0 = time.time()
    doc: dict[str, Any] = {"schema": SCHEMA, "command": "python -m benchmarks.replay " + " ".join(argv or sys.argv[1:]),
                           "quick": a.quick, "environment": environment(), "threads_per_rank": 1, "backend": "gloo",
                           "ranks": 2, "global_batch": BATCH, "profile_sizes": list(SIZES), "settings": vars(a),
                           "models": {}}  # fmt: skip
    out = Path(a.out) / ("replay_quick.json" if a.quick else "replay.json")
    for name, args in models.items():
        print(f"{name}: profiling", file=sys.stderr)
        spec, profile = profile_of(name, args, a.profile_repeats)
        plan_set = plans(profile.num_layers, a.quick)
        sec: dict[str, Any] = {"args": args, "layers": profile.num_layers,
                               "plans": {n: [[str(x) for x in acts] for acts in p.actions] for n, p in plan_set.items()}}
        sec["memory"] = memory_rows(spec, profile, plan_set)
        print(f"{name}: busy time, {a.rounds} rounds", file=sys.stderr)
        sec["busy"] = busy_section(spec, profile, plan_set, a.rounds, a.steps)
        if not a.skip_calibration:
            print(f"{name}: calibration", file=sys.stderr)
            sec["calibration"] = calibration_section(spec, profile, plan_set, sec["busy"], a.calibrate_rounds)
        doc["models"][name] = sec
        _print(name, sec)
        doc["wall_s"] = time.time() - t0
        write_json(out, doc)  # after every model: an interrupted run keeps what it measured
    print(f"wrote {out} in {doc['wall_s']:.0f} s", file=sys.stderr)


def _print(name: str, sec: dict[str, Any]) -> None:
    for row in sec["memory"]:
        print(f"{name:7s} {row['plan']:16s} r{row['rank']} state {row['tallied_state_bytes']}/{row['predicted_state_bytes']:.0f} "
              f"act tally/pred {row['activation_ratio']:.3f}")
    for plan, b in sec["busy"].items():
        for r in b["ranks"]:
            q = r["replay_over_real"]
            print(f"{name:7s} {plan:16s} r{r['rank']} busy replay {r['replay_busy_ms']['median']:.2f} ms, real "
                  f"{r['real_busy_ms']['median']:.2f} ms, ratio {q['median']:.3f} [{q['ci95'][0]:.3f}, {q['ci95'][1]:.3f}]")
    cal = sec.get("calibration")
    if cal:
        print(f"{name:7s} calibration held out: probe {cal['probe']['held_out_mape_percent']}%, replay "
              f"{cal['replay']['held_out_mape_percent']}%; on the real busy times: probe "
              f"{cal['probe']['on_real_busy_of_benchmark_plans']['mape_percent']:.1f}%, replay "
              f"{cal['replay']['on_real_busy_of_benchmark_plans']['mape_percent']:.1f}%, uncalibrated "
              f"{cal['uncalibrated']['on_real_busy_of_benchmark_plans']['mape_percent']:.1f}%")


if __name__ == "__main__":
    # Run from the imported module so the rank processes unpickle the same classes.
    from benchmarks.replay import main as _main

    _main()
