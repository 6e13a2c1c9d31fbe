"""``python -m benchmarks.search``: does every seed find the plan, at what cost, and what do more cores buy.

1. **Seeds** (issue #37 item 1): every single-pipeline space of
   ``search_spaces/`` and a synthetic two-regime profile
   (``bimodal_profile(layers=16, seed=5)``, not bundled), each at R = 4,
   B = 64 with every ``[search]`` key at its default but the seed, seeds 0-9.
   Per run the plan's predicted time, its speedup over the best torch
   schedule, generations, plans scored, wall time and the load average; per
   profile the spread (worst seed over best, minus 1), the largest gap to the
   best seed and the slowest search. One search at a time. ``--time-budget-s``
   raises the safety stop where a loaded machine would otherwise cut searches
   (recorded in ``setup``); ``--seeds-only`` keeps the file's other sections.
2. **Workers** (item 2): plans scored per second by the order generator and
   the batch evaluator with 1 and 2 workers on the same population, rounds
   rotated, median with 95% interval and the paired ratio; and one whole
   search with each count (their plans must be equal).
3. The memory-bound table (``results/bench/search_memory.json``,
   ``benchmarks/search_memory.py``) and the evaluator's plans/s old vs new
   (``results/bench/evaluator.json``, ``benchmarks/evaluator.py``) are included
   by reference: their summary figures are read from those files, with the
   commit each was measured at, not measured again here.

Writes ``results/bench/search.json`` after every profile (a partial run keeps
what it measured).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks.stats import drift, environment, ratio, summary
from umsearch.core.bundled import data_dir
from umsearch.core.profile import Profile, load_profile, save_profile
from umsearch.measure.synthetic import bimodal_profile
from umsearch.search.driver import run_search
from umsearch.search.space import SearchSpace, SearchTable, build_space, load_space
from umsearch.search.workers import workers
from umsearch.storage.jsonio import write_json

RANKS, BATCH = 4, 64
TWO_REGIME = "two_regime"
"""The synthetic two-regime profile's name in the results."""


def bundled() -> list[str]:
    """The bundled spaces that plan one pipeline (the cluster one is ``benchmarks/cluster.py``'s)."""
    return [p.stem for p in sorted(data_dir().glob("*.toml")) if "[cluster]" not in p.read_text()]


def space_for(name: str, seed: int, work: Path, **search: Any) -> tuple[SearchSpace, Profile]:
    """``name`` at R = 4, B = 64, ``[search]`` at its defaults but ``seed`` and ``search``."""
    if name == TWO_REGIME:
        path = work / "two_regime.json"
        if not path.exists():
            save_profile(bimodal_profile(layers=16, seed=5), path)
        space = build_space({"profile": str(path), "ranks": RANKS, "global_batch": BATCH})
    else:
        space = load_space(data_dir() / f"{name}.toml", {"ranks": RANKS, "global_batch": BATCH})
    space = replace(space, search=SearchTable(seed=seed, **search))
    return space, load_profile(space.profile)


def one(name: str, seed: int, work: Path, n_workers: int, budget_s: float | None = None) -> dict[str, Any]:
    space, profile = space_for(name, seed, work, workers=n_workers,
                               **({} if budget_s is None else {"time_budget_s": budget_s}))  # fmt: skip
    load = os.getloadavg()[0]
    res = run_search(space, profile)
    peers = {k: b for k, b in res.baselines.items() if b is not None and k != "local greedy"}
    best_name = min(peers, key=lambda k: peers[k].iteration_ms)
    t = res.best.iteration_ms
    return {"profile": name, "seed": seed, "iteration_ms": t, "best_peer": best_name,
            "speedup_over_best_peer": peers[best_name].iteration_ms / t, "lower_bound_ms": res.lower_bound_ms,
            "stages_per_rank": res.best.plan.num_stages // res.best.plan.ranks, "generations": res.generations,
            "evaluations": res.evaluations, "wall_s": res.wall_s, "plans_per_s": res.evaluations / res.wall_s,
            "budget_hit": res.budget_hit, "loadavg_1m_before": load, "loadavg_1m_after": os.getloadavg()[0]}  # fmt: skip


def per_profile(runs: list[dict[str, Any]]) -> dict[str, Any]:
    times = [r["iteration_ms"] for r in runs]
    best = min(times)
    return {"seeds": len(runs), "best_ms": best, "spread": max(times) / best - 1,
            "within_half_percent": sum(t <= best * 1.005 for t in times),
            "speedups_over_best_peer": [r["speedup_over_best_peer"] for r in runs],
            "median_wall_s": sorted(r["wall_s"] for r in runs)[len(runs) // 2], "max_wall_s": max(r["wall_s"] for r in runs),
            "median_evaluations": sorted(r["evaluations"] for r in runs)[len(runs) // 2],
            "median_plans_per_s": sorted(r["plans_per_s"] for r in runs)[len(runs) // 2],
            "loadavg_1m": [min(r["loadavg_1m_before"] for r in runs), max(r["loadavg_1m_after"] for r in runs)],
            "budget_hits": sum(r["budget_hit"] for r in runs)}  # fmt: skip


def scoring_rate(rounds: int, work: Path) -> dict[str, Any]:
    """Plans scored per second (order generator + evaluator) with 1 and 2 workers, rounds rotated."""
    from umsearch.core.cost import CostModel
    from umsearch.search.genome import Rules
    from umsearch.search.operators import random_genome
    from umsearch.search.partition import stage_cuts
    from umsearch.search.scoring import Scorer

    space, profile = space_for("gpt_cpu", 0, work)
    rules = Rules.of(space, profile)
    tables = CostModel(profile, state_factor=space.state_factor).tables(rules.largest)
    anchors = {v: [stage_cuts(tables, b, RANKS * v) for b in (1, 8, rules.largest)] for v in rules.stages_per_rank}
    import random

    rng = random.Random(0)
    population = [random_genome(rules, anchors, rng) for _ in range(96)]
    score = Scorer(rules, tables, space.memory_limit)
    rates: dict[int, list[float]] = {1: [], 2: []}
    for r in range(rounds):
        for n in (1, 2) if r % 2 == 0 else (2, 1):
            with workers(n):
                score.genome_times(population)  # warm
                t0 = time.perf_counter()
                for _ in range(10):
                    score.genome_times(population)
                rates[n].append(10 * len(population) / (time.perf_counter() - t0))
    half = max(1, rounds // 4)
    return {"workload": "96 random gpt_cpu genomes (R=4, B=64), generated and timed, 10 calls per round",
            "plans_per_s": {f"{n}_workers": summary(v) for n, v in rates.items()},
            "two_over_one": ratio(rates[2], rates[1]), "drift_1_worker": drift(rates[1][:half], rates[1][-half:])}  # fmt: skip


def whole_search(rounds: int, work: Path) -> dict[str, Any]:
    """gpt_cpu seed 0 with 1 and 2 workers, rounds rotated: wall time, plans scored per second, the same plan."""
    runs: dict[int, list[dict[str, Any]]] = {1: [], 2: []}
    plans = []
    for r in range(rounds):
        for n in (1, 2) if r % 2 == 0 else (2, 1):
            space, profile = space_for("gpt_cpu", 0, work, workers=n)
            load = os.getloadavg()[0]
            res = run_search(space, profile)
            plans.append(res.best.plan)
            runs[n].append({"wall_s": res.wall_s, "evaluations": res.evaluations, "iteration_ms": res.best.iteration_ms,
                            "plans_per_s": res.evaluations / res.wall_s, "loadavg_1m_before": load})  # fmt: skip
            print(f"whole search, {n} worker(s): {res.wall_s:.1f} s, load {load:.1f}", flush=True)
    rate = {n: [x["plans_per_s"] for x in v] for n, v in runs.items()}
    return {"runs": {f"{n}_workers": v for n, v in runs.items()},
            "plans_per_s": {f"{n}_workers": summary(v) for n, v in rate.items()},
            "two_over_one": ratio(rate[2], rate[1]), "same_plan": all(p == plans[0] for p in plans)}


def included(path: str) -> dict[str, Any] | None:
    """A summary of another benchmark's results file (None when absent), with where and when it ran."""
    p = Path(path)
    if not p.exists():
        return None
    doc = json.loads(p.read_text())
    env = doc.get("environment", {})
    out: dict[str, Any] = {"file": path, "commit": env.get("commit"), "time": env.get("time")}
    if "rows" in doc:
        out["rows"] = [{k: r.get(k) for k in ("case", "memory_limit_bytes", "best_peer", "best_peer_ms", "plan_ms",
                                              "ratio", "lower_bound_ms", "gap_to_bound")} for r in doc["rows"]]  # fmt: skip
        out["least_ratio"] = doc.get("least_ratio")
    if "workloads" in doc:
        out["plans_per_s"] = {w: {k: v["median"] for k, v in d.get("plans_per_s", d.get("genomes_per_s", {})).items()}
                              for w, d in doc["workloads"].items()}  # fmt: skip
    return out


def kept_sections(path: Path, fresh: dict[str, Any]) -> dict[str, Any]:
    """``fresh`` (the seeds' sections, this run's environment, the other benchmarks' files read again) over the
    sections of ``path`` that this run does not measure (the workers' figures keep the environment they were
    measured in)."""
    if not path.exists():
        return fresh
    old = json.loads(path.read_text())
    if "workers" in old:
        old["workers"].setdefault("environment", old.get("environment"))
    return {**old, **fresh}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--profiles", nargs="*", default=None, help=f"space names and/or {TWO_REGIME} (default: all)")
    ap.add_argument("--rate-rounds", type=int, default=10, help="rounds of the 1 vs 2 workers scoring rate (0: skip)")
    ap.add_argument("--whole-rounds", type=int, default=3, help="rounds of one whole search with 1 and 2 workers")
    ap.add_argument("--workers", type=int, default=0, help="[search] workers of the seed runs (0: the default)")
    ap.add_argument("--time-budget-s", type=float, default=None,
                    help="[search] time_budget_s of the seed runs (default: its default); a larger one keeps a loaded "
                         "machine's slowness out of the plans (the budget is a safety stop, not a setting of the search)")
    ap.add_argument("--seeds-only", action="store_true",
                    help="measure only the seeds; keep the other sections of --out (workers, ...) as they are")
    ap.add_argument("--out", default="results/bench/search.json")
    ap.add_argument("--work", default="/tmp/umsearch-bench-search", help="where the synthetic profile is written")
    a = ap.parse_args(argv)
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    names = a.profiles or [*bundled(), TWO_REGIME]
    doc: dict[str, Any] = {"schema": "umsearch.bench.search/3", "environment": environment(),
                           "setup": {"ranks": RANKS, "global_batch": BATCH, "search": "defaults but seed",
                                     "seeds": list(range(a.seeds)), "workers": a.workers or "default",
                                     "time_budget_s": a.time_budget_s or "default"},
                           "note": "predicted times, one cost model for every contender; one search at a time on a "
                                   "machine shared with other agents (wall times are loaded; see loadavg)",
                           "memory_bound": included("results/bench/search_memory.json"),
                           "evaluator": included("results/bench/evaluator.json"), "profiles": {}, "runs": []}  # fmt: skip
    if a.seeds_only:
        doc = kept_sections(Path(a.out), doc)
    elif a.rate_rounds:
        doc["workers"] = {"scoring": scoring_rate(a.rate_rounds, work)}
        print(json.dumps(doc["workers"]["scoring"]["two_over_one"]["median"]), flush=True)
        if a.whole_rounds:
            doc["workers"]["whole_search"] = whole_search(a.whole_rounds, work)
        write_json(Path(a.out), doc)
    for name in names:
        mine = []
        for seed in range(a.seeds):
            r = one(name, seed, work, a.workers, a.time_budget_s)
            mine.append(r)
            print(f"{name:11s} seed {seed}: {r['iteration_ms']:9.3f} ms  {r['speedup_over_best_peer']:.3f}x "
                  f"{r['best_peer']}  {r['generations']} gen  {r['evaluations']} scored  {r['wall_s']:.1f} s  "
                  f"load {r['loadavg_1m_before']:.1f}", flush=True)  # fmt: skip
        doc["runs"] += mine
        doc["profiles"][name] = per_profile(mine)
        doc["not_measured"] = [n for n in [*bundled(), TWO_REGIME] if n not in doc["profiles"]]
        print(f"{name}: spread {doc['profiles'][name]['spread']:.3%}", flush=True)
        doc["environment"]["loadavg_1m_at_end"] = os.getloadavg()[0]
        write_json(Path(a.out), doc)
    return doc


if __name__ == "__main__":
    main()
