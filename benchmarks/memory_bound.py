"""Memory-bound benchmark (issue 38): ``tune --memory-limit L`` against every torch schedule that fits L.

``python -m benchmarks.memory_bound`` does, for each model of :data:`MODELS`
(2 ranks, gloo, one thread per rank, B = :data:`BATCH`, SGD, so the search
plans with :data:`STATE_FACTOR` = 2 bytes of state per parameter byte):

1. profile it here (``umsearch profile``, as :mod:`benchmarks.runtime` does);
2. **the limit**: search without a memory limit, measure the best plan's peak
   per rank (one warm-up iteration under the tally,
   :func:`umsearch.runtime.worker.peak_of`) and set ``L`` to
   :data:`FRACTION` of the largest;
3. **tune** under ``L`` (:func:`umsearch.orchestrate.tune.tune_on_machine`
   with ``memory_limit = L`` in the search space and in the loop: contenders
   whose measured peak exceeds ``L`` on any rank leave the round);
4. **side by side**: the plan tune handed over, and every torch schedule
   (:data:`umsearch.core.schedules.PEER_SCHEDULES`) with and without full
   activation checkpointing (every layer of every stage under
   :func:`torch.utils.checkpoint.checkpoint`, as torchtitan's
   ``activation_checkpoint.mode = "full"``), each at the partition and
   microbatch count the search picked for it under ``L`` and without a limit,
   all in one set of rank processes on the same ``PipelineStage`` objects
   (a checkpointed variant is its plain twin's very runner with the layers
   wrapped while it steps), rounds rotated; every contender's peak per rank is
   measured on its last warm-up iteration under the tally;
5. **every count**: before the side-by-side, a screen runs every torch
   schedule at each of the space's stage counts per rank and every
   microbatch count torch accepts (:func:`every_count`: equal microbatches
   dividing ``B``, each on its fastest partition as predicted without a
   limit), plain, and the checkpointed twin of each that does not fit, with
   the tuned plan, :data:`SCREEN_ROUNDS` rotated rounds in one launch; a
   configuration that fits and took at most :data:`SCREEN_MARGIN` times the
   tuned plan's time joins the side-by-side. The search picks each torch
   schedule's configuration on a profile measured minutes before, and a
   microbatch count it predicts over ``L`` (or slower) may fit and be fast
   when run: the verdict is against every torch schedule that fits, not
   only those the search picked.

A torch contender *fits* when its measured peak is at most ``L`` on every rank.
The tally does not see the tensors that ``torch.utils.checkpoint`` saves while
it recomputes a layer inside the backward (its own saved-tensor hooks hold
them), so each checkpointed contender also records that bound: its peak plus
the largest layer's stash for one microbatch (the profile's ``stash_bytes``),
and whether it fits with it. The summary per model: the tuned plan's peaks
against ``L``, per fitting torch contender the per-round paired ratio
torch / tuned (median and 95% bootstrap interval), and whether the tuned plan
fits and beats every fitting torch contender with its interval above 1; the
load average before and after each phase, each contender's drift (second half
of the rounds against the first) and the busiest other processes of the
machine at the start and the end.

Where the search finds no plan that fits ``L`` (as predicted), the model's
section says so and the side-by-side runs the unconstrained best plan (as a
reference, over ``L``) against the torch contenders at their unconstrained
configurations: whether torch fits where umsearch does not.

It writes ``results/bench/memory_bound.json`` (``--quick``: one tiny model,
few rounds, ``memory_bound_quick.json``: it proves the pipeline runs, it
measures no target); ``--models NAME --update`` measures NAME again and keeps
the other models' sections, the replaced ones under ``earlier_runs`` with the
run that measured them. Every figure in it was measured by this script.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from benchmarks.runtime import measure_profile
from benchmarks.stats import drift, environment, ratio, summary
from umsearch.core.model_spec import ModelSpec
from umsearch.core.plan import Plan
from umsearch.core.profile import Profile
from umsearch.runtime.checkpointing import checkpointed
from umsearch.storage.jsonio import write_json

MODELS: dict[str, dict[str, Any]] = {
    "gpt": {"source": "gpt", "args": {"layers": 6, "width": 128, "heads": 4, "seq": 64}},
    "vgg16": {"source": "vgg16", "args": {"image": 32, "width": 8}},
    "hybrid": {"source": "hybrid", "args": {"stem": 4, "blocks": 4, "channels": 32, "width": 128}},
}
QUICK_MODEL: dict[str, Any] = {
    "source": "gpt",
    "args": {"layers": 2, "width": 32, "heads": 2, "seq": 16, "vocab": 64},
}
BATCH = 32
SEED = 0
FRACTION = 0.6
"""``L`` as a share of the unconstrained best plan's largest measured peak."""
STATE_FACTOR = 2.0
"""SGD's bytes of training state per parameter byte (weights and gradients): what the ranks run."""
SCHEMA = "benchmarks.memory_bound/2"
SCREEN_ROUNDS = 3
"""Measured rounds of each configuration in the screen (after the run config's warm-up iterations)."""
SCREEN_MARGIN = 1.5
"""A screened configuration that fits joins the side-by-side unless its screen median is more than this many
times the tuned plan's in the same rounds (a wide margin: the screen's medians are of few rounds on a shared
machine); every screened configuration is on record with its peaks and times either way."""
SCREENED = "every microbatch count (screened)"
"""The origin of a contender that the screen added."""

Job = tuple[str, Plan, str | None]
"""A contender's runner: runtime (``umsearch`` or ``torch``), its checked plan and torch's schedule."""
Variant = tuple[int, bool]
"""A side-by-side contender: the index of its runner's job and whether its layers are checkpointed."""


# ------------------------------------------------------------------------------------ in the rank processes
class _Checkpointed:
    """A torch schedule's runner with its model's layers checkpointed while it steps (the same stages)."""

    def __init__(self, runner: Any) -> None:
        self.runner, self.rank = runner, runner.rank

    def step(self, step: int) -> Any:
        with checkpointed(self.runner.model.layers):
            return self.runner.step(step)

    def peak_step(self, step: int) -> tuple[Any, int]:
        with checkpointed(self.runner.model.layers):
            return self.runner.peak_step(step)


def side_by_side_worker(rank: int, world: int, jobs: Sequence[Job], variants: Sequence[Variant], factory: Any,
                        cfg: Any, rounds: int) -> tuple[list[tuple[int, int]], list[list[float]]]:  # fmt: skip
    """Launch target: per variant, (pipeline rank, peak bytes of its last warm-up iteration), and per round, per
    variant, this rank's wall ms (barrier to the end of the optimizer step), variants in rotated order each
    round. A checkpointed variant runs on its plain twin's runner
    (:func:`umsearch.orchestrate.contenders.make_runners`): the same stages, the same processes."""
    from umsearch.orchestrate.contenders import make_runners, measure_runners

    plain = make_runners(rank, world, jobs, factory, cfg)
    got = measure_runners([_Checkpointed(plain[j]) if ac else plain[j] for j, ac in variants], cfg, rounds)
    return list(got.peaks), [[float(getattr(m, "step_ms", m)) for m in row] for row in got.rounds]


# ------------------------------------------------------------------------------------ in the benchmark
@dataclass(frozen=True, kw_only=True)
class Contender:
    """A side-by-side contender and where its configuration came from."""

    name: str
    runtime: str
    plan: Plan
    schedule: str | None
    checkpointed: bool
    origin: str


def loadavg() -> float:
    return os.getloadavg()[0]


def busiest(n: int = 8) -> list[str]:
    """The ``n`` busiest processes over the last second (CPU %, user and command): what else ran."""
    done = subprocess.run(["top", "-b", "-n", "2", "-d", "1", "-o", "%CPU", "-w", "200"], capture_output=True,
                          text=True, check=False)  # fmt: skip
    frame = done.stdout.split("PID USER")[-1].splitlines()[
        1:
    ]  # the second frame: the first is since boot
    return [
        " ".join((f[8], f[1], *f[11:])) for f in (line.split() for line in frame[:n]) if len(f) > 11
    ]


def _space(profile_path: str, limit: float | None, budget_s: float) -> Any:
    from umsearch.search.space import build_space

    values: dict[str, Any] = {"profile": profile_path, "ranks": 2, "global_batch": BATCH, "time_budget_s": budget_s,
                              "seed": SEED, "stages_per_rank": [1, 2], "state_factor": STATE_FACTOR}  # fmt: skip
    if limit is not None:
        values["memory_limit"] = limit
    return build_space(values)


def peers(result: Any) -> dict[str, Plan]:
    """The search's baseline plan of every torch schedule (by torch's name), where one exists."""
    from umsearch.core.schedules import PEER_SCHEDULES

    return {n: b.plan for n, b in result.baselines.items() if n in PEER_SCHEDULES and b is not None}


def shape(plan: Plan) -> tuple[Any, ...]:
    """What a torch schedule runs of a plan: the cuts, the placement and the microbatch sizes."""
    return tuple((st.lo, st.hi, st.rank, st.forward) for st in plan.stages)


def plain(plan: Plan) -> Plan:
    """``plan`` with no stage recomputing (a torch baseline's lists are equal, so only the flags change)."""
    if not any(st.recompute for st in plan.stages):
        return plan
    return replace(plan, stages=tuple(replace(st, recompute=False) for st in plan.stages))


def side_by_side(first: Contender, at_limit: dict[str, Plan], free: dict[str, Plan]) -> list[Contender]:
    """``first`` (the tuned plan), then every torch schedule at the configuration the search gave it under
    ``L`` and without a limit, each with and without full activation checkpointing (one contender per
    distinct schedule, shape and checkpointing)."""
    out = [first]
    seen: set[tuple[str, tuple[Any, ...], bool]] = set()
    for origin, plans in (
        ("search baseline under L", at_limit),
        ("search baseline without a limit", free),
    ):
        for name, marked in plans.items():
            # The contender's checkpointing is its variant's (``ac``): a baseline that marks full checkpointing
            # runs plain here, or make_runners would checkpoint its "plain" twin too.
            plan = plain(marked)
            for ac in (False, True):
                if (name, shape(plan), ac) in seen:
                    continue
                seen.add((name, shape(plan), ac))
                label = f"torch {name} m={len(plan.stages[0].forward)}{' +AC' if ac else ''}"
                if any(c.name == label for c in out):
                    label += f" ({origin})"
                out.append(Contender(name=label, runtime="torch", plan=plan, schedule=name, checkpointed=ac,
                                     origin=origin))  # fmt: skip
    return out


def every_count(profile: Profile, profile_path: str) -> dict[str, Plan]:
    """Every torch schedule at each of the space's stage counts per rank and every microbatch count torch
    accepts for it (:func:`umsearch.search.baselines.shapes`: equal microbatches dividing ``B``), plain, on
    its fastest partition as predicted without a memory limit (:func:`umsearch.search.baselines.best_partition`);
    keyed ``"NAME v=V m=M"``."""
    import math

    from umsearch.core.cost import CostModel
    from umsearch.core.schedules import PEER_SCHEDULES
    from umsearch.search.baselines import best_partition, shapes
    from umsearch.search.genome import Rules
    from umsearch.search.scoring import Scorer
    from umsearch.sim.population import decode

    space = _space(profile_path, None, 1.0)
    rules = Rules.of(space, profile)
    tables = CostModel(profile, state_factor=space.state_factor).tables(rules.largest)
    score = Scorer(rules, tables, math.inf)
    out: dict[str, Plan] = {}
    for name, peer in PEER_SCHEDULES.items():
        for s in shapes(peer, rules, stages=rules.stages_per_rank):
            cuts, _, _ = best_partition(s, rules, score, tables)
            out[f"{name} v={s.v} m={s.microbatches}"] = decode(s.on(cuts))
    return out


def screen(first: Contender, configs: dict[str, Plan], known: Sequence[Contender], factory: Any, run_cfg: Any,
           limit: float) -> tuple[list[Contender], list[dict[str, Any]]]:  # fmt: skip
    """The screen of :func:`every_count`'s configurations not among ``known`` (same schedule, shape and
    checkpointing): each plain, then the checkpointed twin of each plain one over ``limit``, beside ``first``,
    :data:`SCREEN_ROUNDS` rounds a launch. Returns the contenders that join the side-by-side (they fit and
    took at most :data:`SCREEN_MARGIN` times ``first``'s median) and every screened configuration's record."""
    import statistics

    seen = {(c.schedule, shape(c.plan), c.checkpointed) for c in known}
    records: list[dict[str, Any]] = []
    joined: list[Contender] = []
    todo = [Contender(name=f"torch {key}", runtime="torch", plan=plan, schedule=key.split()[0], checkpointed=False,
                      origin=SCREENED) for key, plan in configs.items()]  # fmt: skip
    for ac in (False, True):
        batch = [replace(c, name=c.name + " +AC" if ac else c.name, checkpointed=ac) for c in todo
                 if (c.schedule, shape(c.plan), ac) not in seen]  # fmt: skip
        if not batch:
            continue
        measured = run_side_by_side([first, *batch], factory, run_cfg, SCREEN_ROUNDS)
        first_ms = statistics.median(measured[0][1])
        over: list[Contender] = []
        for c, (peaks, ms) in zip(batch, measured[1:], strict=True):
            fits = all(p <= limit for p in peaks)
            rel = statistics.median(ms) / first_ms
            kept = fits and rel <= SCREEN_MARGIN
            records.append({"name": c.name, "schedule": c.schedule, "full_activation_checkpointing": ac,
                            "stages": c.plan.num_stages, "microbatches": len(c.plan.stages[0].forward),
                            "measured_peak_bytes": peaks, "peak_over_limit": [q / limit for q in peaks], "fits": fits,
                            "screen_ms": ms, "over_first": rel, "joins_side_by_side": kept})  # fmt: skip
            if kept:
                joined.append(c)
            if not fits:
                over.append(c)
        todo = over
    return joined, records


def run_side_by_side(contenders: Sequence[Contender], factory: Any, run_cfg: Any,
                     rounds: int) -> list[tuple[list[int], list[float]]]:  # fmt: skip
    """Launch :func:`side_by_side_worker`; per contender its peak per rank and its per-round ms (slowest rank)."""
    from umsearch.runtime.launch import launch

    jobs: list[Job] = []
    variants: list[Variant] = []
    for c in contenders:
        job = (c.runtime, c.plan, c.schedule)
        index = next(
            (i for i, j in enumerate(jobs) if j[0] == job[0] and j[2] == job[2] and j[1] is job[1]),
            None,
        )
        if index is None:
            index = len(jobs)
            jobs.append(job)
        variants.append((index, c.checkpointed))
    got = launch(side_by_side_worker, 2, (jobs, variants, factory, run_cfg, rounds), run_cfg.launch)
    out = []
    for i in range(len(contenders)):
        peaks = [0, 0]
        for rank_peaks, _ in got:
            r, b = rank_peaks[i]
            peaks[r] = max(peaks[r], b)
        out.append((peaks, [max(g[1][r][i] for g in got) for r in range(rounds)]))
    return out


def recompute_bound(profile: Profile, plan: Plan) -> int:
    """Bytes the tally may miss in a checkpointed backward: the largest layer's stash for the largest
    microbatch (``torch.utils.checkpoint`` holds a layer's recomputed tensors under its own hooks)."""
    size = max(max(st.forward) for st in plan.stages)
    return int(max(layer.stash_bytes for layer in profile.layers) * size)


def contender_json(c: Contender, peaks: list[int], ms: list[float], limit: float, bound: int | None,
                   tuned_ms: list[float]) -> dict[str, Any]:  # fmt: skip
    """One contender's record: its configuration, peaks against ``L``, timing, drift and ratio to the tuned."""
    half = len(ms) // 2
    out: dict[str, Any] = {
        "name": c.name, "runtime": c.runtime, "schedule": c.schedule, "full_activation_checkpointing": c.checkpointed,
        "origin": c.origin, "stages": c.plan.num_stages, "microbatches": len(c.plan.stages[0].forward),
        "microbatch_sizes": sorted({b for st in c.plan.stages for b in st.forward}),
        "search_recompute": any(st.recompute for st in c.plan.stages),
        "measured_peak_bytes": peaks, "peak_over_limit": [p / limit for p in peaks],
        "fits": all(p <= limit for p in peaks), "measured_ms": ms, "median_ms": summary(ms),
        "drift": drift(ms[:half], ms[half:]) if half else None}  # fmt: skip
    if bound is not None:
        out["tally_may_miss_bytes"] = bound
        out["fits_with_missed_bytes"] = all(p + bound <= limit for p in peaks)
    if c.runtime == "torch":
        r = ratio(ms, tuned_ms)
        out["ratio_over_tuned"] = {k: r[k] for k in ("median", "ci95", "n")} | {
            "interval_above_1": r["ci95"][0] > 1.0
        }
    return out


def model_report(
    spec: dict[str, Any], profile: Profile, profile_path: str, a: argparse.Namespace
) -> dict[str, Any]:
    """The limit, the tune under it and the side-by-side of one model; its section of the JSON."""
    from umsearch.errors import NoFeasiblePlanError
    from umsearch.orchestrate.contenders import Entry, machine
    from umsearch.orchestrate.tune import TuneConfig, tune_meta, tune_on_machine
    from umsearch.orchestrate.tune_output import document
    from umsearch.runtime.config import LaunchConfig, RunConfig
    from umsearch.runtime.model_source import spec_factory
    from umsearch.search.driver import run_search

    # Named here, not read from a file: the spec is ours, so it is trusted (and needs no zoo list).
    factory = spec_factory(ModelSpec(source=spec["source"], args=dict(spec["args"])), SEED)
    run_cfg = RunConfig(warmup_steps=2, seed=SEED, launch=LaunchConfig(threads=1, timeout_s=900))
    load: dict[str, float] = {"start": loadavg()}
    free = run_search(_space(profile_path, None, a.search_budget), profile)
    [best] = machine(factory, run_cfg)(
        [Entry(name="unconstrained best", plan=free.best.plan, runtime="umsearch")], 2
    )
    limit = FRACTION * max(best.peak_bytes)
    load["after_limit"] = loadavg()
    space = _space(profile_path, limit, a.search_budget)
    cfg = TuneConfig(k=a.k, max_rounds=a.loop_rounds, measure_rounds=a.tune_rounds, budget_min=a.budget_min,
                     state_factor=STATE_FACTOR, memory_limit=limit)  # fmt: skip
    out: dict[str, Any] = {
        "model": spec, "global_batch": BATCH, "ranks": 2, "limit_bytes": limit,
        "unconstrained_best": {"plan": free.best.plan.to_json(), "measured_peak_bytes": list(best.peak_bytes),
                               "predicted_peak_bytes": list(free.best.peak_memory_bytes),
                               "measured_ms": list(best.step_ms)}}  # fmt: skip
    try:
        result = tune_on_machine(profile, space, factory, cfg, run_cfg)
    except NoFeasiblePlanError as exc:
        # No plan fits L as predicted: measure what torch fits there beside the unconstrained best plan.
        out.update(error=str(exc), least_rank_state_bytes=least_rank_state(profile))
        first = Contender(name="unconstrained best (no plan fits L)", runtime="umsearch", plan=free.best.plan,
                          schedule=None, checkpointed=False, origin="search without a limit")  # fmt: skip
        out.update(compare(first, {}, peers(free), every_count(profile, profile_path), profile, factory, run_cfg,
                           a.rounds, limit, load))  # fmt: skip
        return out
    load["after_tune"] = loadavg()
    w = result.winner
    assert w is not None
    last = result.rounds[-1].contenders
    plans = [c for c in last if c.candidate.runtime == "umsearch"]
    tuned = w if w.candidate.runtime == "umsearch" else min(plans, key=lambda c: c.median_ms)
    first = Contender(name="tuned", runtime="umsearch", plan=tuned.candidate.plan, schedule=None,
                      checkpointed=False, origin="tune --memory-limit L")  # fmt: skip
    at_limit = peers(run_search(space, result.profile))
    out.update(tune_winner={"name": w.candidate.name, "runtime": w.candidate.runtime,
                            "schedule": w.candidate.schedule}, tuned_plan=tuned.candidate.name)  # fmt: skip
    out.update(compare(first, at_limit, peers(free), every_count(profile, profile_path), profile, factory, run_cfg,
                       a.rounds, limit, load))  # fmt: skip
    out["tune"] = {"over_memory_limit": [[o.to_json() for o in r.over_limit] for r in result.rounds],
                   "stopped": result.stopped,
                   "document": document(result, tune_meta(space, cfg, run_cfg, profile_path))}  # fmt: skip
    return out


def compare(first: Contender, at_limit: dict[str, Plan], free: dict[str, Plan], configs: dict[str, Plan],
            profile: Profile, factory: Any, run_cfg: Any, rounds: int, limit: float,
            load: dict[str, float]) -> dict[str, Any]:  # fmt: skip
    """The side-by-side of ``first`` and the torch contenders (:func:`side_by_side`, and those of ``configs``
    that :func:`screen` lets join) and the verdict: whether ``first`` fits ``L`` on every rank and beats every
    fitting torch contender with its interval above 1."""
    contenders = side_by_side(first, at_limit, free)
    joined, screened = screen(first, configs, contenders, factory, run_cfg, limit)
    contenders += joined
    load["after_screen"] = loadavg()
    measured = run_side_by_side(contenders, factory, run_cfg, rounds)
    load["end"] = loadavg()
    first_ms = measured[0][1]
    rows = [contender_json(c, peaks, ms, limit, recompute_bound(profile, c.plan) if c.checkpointed else None,
                           first_ms) for c, (peaks, ms) in zip(contenders, measured, strict=True)]  # fmt: skip
    fitting = [r for r in rows[1:] if r["fits"]]
    closest = min(fitting, key=lambda r: r["ratio_over_tuned"]["median"])["name"] if fitting else None
    return {"tuned_fits": rows[0]["fits"], "tuned_peak_over_limit": rows[0]["peak_over_limit"],
            "fitting_torch": [r["name"] for r in fitting], "closest_fitting_torch": closest,
            "beats_every_fitting_torch": rows[0]["fits"] and all(r["ratio_over_tuned"]["interval_above_1"]
                                                                 for r in fitting),
            "contenders": rows, "screen": screened, "load_average": load}  # fmt: skip


def least_rank_state(profile: Profile) -> float:
    """The least, over the cuts of the layers into two ranks of one stage each, of the larger rank's training
    state (:data:`STATE_FACTOR` times its parameter bytes): no plan of one stage per rank holds less on its
    fuller rank."""
    params = [x.param_bytes for x in profile.layers]
    return min(STATE_FACTOR * max(sum(params[:c]), sum(params[c:])) for c in range(1, len(params)))


def _print(name: str, sec: dict[str, Any]) -> None:
    if "error" in sec:
        print(f"{name}: L {sec['limit_bytes'] / 2**20:.2f} MiB: {sec['error']}", file=sys.stderr)
    print(f"{name}: L {sec['limit_bytes'] / 2**20:.2f} MiB; tuned fits {sec['tuned_fits']} "
          f"({', '.join(f'{x:.2f}' for x in sec['tuned_peak_over_limit'])} of L); beats every fitting torch "
          f"{sec['beats_every_fitting_torch']}", file=sys.stderr)  # fmt: skip
    for r in sec["contenders"][1:]:
        q = r["ratio_over_tuned"]
        print(f"   {r['name']:<40} fits {str(r['fits']):<5} peak/L {max(r['peak_over_limit']):.2f}  torch/tuned "
              f"{q['median']:.3f} [{q['ci95'][0]:.3f}, {q['ci95'][1]:.3f}]", file=sys.stderr)  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.memory_bound", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--out", default="results/bench", help="output folder")
    ap.add_argument(
        "--models", default=None, help="comma-separated names from MODELS (default: all)"
    )
    ap.add_argument("--quick", action="store_true", help="one tiny model, few rounds: proves it runs, measures no "
                                                         "target; writes memory_bound_quick.json")  # fmt: skip
    ap.add_argument("--rounds", type=int, default=9, help="rotated rounds of the side-by-side")
    ap.add_argument(
        "--tune-rounds", type=int, default=5, help="rotated measured rounds per tune loop round"
    )
    ap.add_argument("--loop-rounds", type=int, default=2, help="most rounds of the tune loop")
    ap.add_argument("--k", type=int, default=3, help="distinct searched plans per tune loop round")
    ap.add_argument("--search-budget", type=float, default=10.0, help="search seconds per search")
    ap.add_argument("--budget-min", type=float, default=15.0, help="tune budget per model, minutes")
    ap.add_argument("--profile-repeats", type=int, default=7, help="profiler rounds")
    ap.add_argument("--update", action="store_true", help="keep the other models' sections of an existing "
                                                          "output file (each section says when it was measured)")  # fmt: skip
    a = ap.parse_args(argv)
    if a.quick:
        a.rounds, a.tune_rounds, a.loop_rounds, a.k = min(a.rounds, 3), 2, 1, 2
        a.search_budget, a.profile_repeats = min(a.search_budget, 3.0), 3
    specs = (
        {"gpt_tiny": QUICK_MODEL}
        if a.quick
        else {n: MODELS[n] for n in (a.models or ",".join(MODELS)).split(",")}
    )
    t0 = time.time()
    doc: dict[str, Any] = {
        "schema": SCHEMA, "command": "python -m benchmarks.memory_bound " + " ".join(argv or sys.argv[1:]),
        "quick": a.quick, "environment": environment(), "threads_per_rank": 1, "backend": "gloo", "optimizer": "sgd",
        "state_factor": STATE_FACTOR, "fraction_of_unconstrained_peak": FRACTION, "settings": vars(a),
        "peak": "per rank, the tally of one warm-up iteration (parameters, gradients, optimizer states, saved "
                "tensors; umsearch.runtime.worker.peak_of); checkpointed contenders: layers under "
                "torch.utils.checkpoint(use_reentrant=False) on the same PipelineStages",
        "busiest_processes_at_start": busiest(), "models": {}}  # fmt: skip
    out = Path(a.out) / ("memory_bound_quick.json" if a.quick else "memory_bound.json")
    if a.update and out.exists():
        old = json.loads(out.read_text())
        doc["models"] = {n: sec for n, sec in old["models"].items() if n not in specs}
        # The sections this run replaces stay on record with the run that measured them.
        replaced = {n: sec for n, sec in old["models"].items() if n in specs}
        doc["earlier_runs"] = [*old.get("earlier_runs", []), {**{k: old[k] for k in ("command", "environment", "wall_s",
                               "busiest_processes_at_start", "busiest_processes_at_end") if k in old},
                               "replaced_models": replaced}]  # fmt: skip
    for name, spec in specs.items():
        with tempfile.TemporaryDirectory(prefix="umsearch-bench-") as tmp:
            path = Path(tmp) / "profile.json"
            sec = model_report(spec, measure_profile(spec, path, a.profile_repeats), str(path), a)
        doc["models"][name] = {"command": doc["command"], "environment_at_end": environment(), **sec}
        _print(name, sec)
        met = [n for n, s in doc["models"].items() if s.get("beats_every_fitting_torch")]
        doc.update(models_meeting_target=met, target_met=len(met) >= 2, wall_s=time.time() - t0,
                   busiest_processes_at_end=busiest())  # fmt: skip
        write_json(out, doc)  # after every model: an interrupted run keeps what it measured
    print(f"wrote {out} in {doc['wall_s']:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    # Run from the imported module so the rank processes unpickle the same classes.
    from benchmarks.memory_bound import main as _main

    _main()
