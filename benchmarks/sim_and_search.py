"""``make bench``: measured benchmarks, written as JSON under ``results/bench/``.

- ``simulator.json``: candidates per second of the compiled batch evaluator and
  of the reference simulator, measured in the same run on the same plans
  (S=8, 32 layers, B=256, 8..64 unequal microbatches per stage, mixed warmups).
- ``search.json``: per bundled space and seed, the plan vs each baseline
  (speedup over the best equal-microbatch plan), the lower-bound gap, the
  plans scored and the search wall time (one search at a time, one thread).
"""

from __future__ import annotations

import platform
import time
from pathlib import Path

import numpy as np

from umsearch.core.cost import CostModel
from umsearch.core.jsonio import write_json
from umsearch.core.plan import Plan, StagePlan
from umsearch.measure.synthetic import simnet_profile
from umsearch.sim.batch import evaluate, pack_plans
from umsearch.sim.reference import simulate

OUT = Path("results/bench")


def random_plans(n: int, rng: np.random.Generator, L: int = 32, S: int = 8, B: int = 256) -> list[Plan]:
    plans = []
    for _ in range(n):
        cuts = [0, *sorted(rng.choice(np.arange(1, L), S - 1, replace=False).tolist()), L]
        stages = []
        for s in range(S):
            m = int(rng.integers(8, 65))
            inner = sorted(rng.choice(np.arange(1, B), m - 1, replace=False).tolist())
            fwd = tuple(int(v) for v in np.diff([0, *inner, B]))
            warm = m if rng.random() < 0.5 else S - s
            stages.append(StagePlan(layers=(cuts[s], cuts[s + 1]), forward=fwd, backward=fwd, warmup=warm))
        plans.append(Plan(global_batch=B, stages=tuple(stages)))
    return plans


def bench_simulator() -> dict[str, object]:
    rng = np.random.default_rng(0)
    cost = CostModel(simnet_profile(layers=32, seed=0), b_max=256)
    plans = random_plans(2000, rng)
    packed = pack_plans(plans)
    evaluate(pack_plans(plans[:2]), cost)  # compile / load cache outside the timing
    reps = []
    for _ in range(5):
        t = time.perf_counter()
        evaluate(packed, cost)
        reps.append(time.perf_counter() - t)
    fast = len(plans) / float(np.median(reps))
    t = time.perf_counter()
    for p in plans[:100]:
        simulate(p, cost)
    ref = 100 / (time.perf_counter() - t)
    t = time.perf_counter()
    pack_plans(plans)
    pack = len(plans) / (time.perf_counter() - t)
    return {"batch_candidates_per_s": fast, "reference_candidates_per_s": ref, "ratio": fast / ref,
            "pack_plans_per_s": pack, "candidates": len(plans), "stages": 8, "layers": 32, "global_batch": 256,
            "threads": 1}  # fmt: skip


def bench_search(seeds: tuple[int, ...] = (0, 1, 2)) -> list[dict[str, object]]:
    """Each bundled space searched with several seeds: plan vs baselines, gap, wall time."""
    from umsearch.core.profile import load_profile
    from umsearch.search.driver import run_search
    from umsearch.search.space import load_space, with_overrides

    rows = []
    for toml in sorted(Path("search_spaces").glob("*.toml")):
        for seed in seeds:
            space = with_overrides(load_space(toml), seed=seed)
            res = run_search(space, load_profile(space.profile))
            row: dict[str, object] = {
                "space": space.name, "seed": seed, "stages": space.stages, "global_batch": space.global_batch,
                "plan_ms": res.best.iteration_ms, "wall_s": res.wall_s, "generations": res.generations,
                "plans_scored": res.evaluations, "budget_hit": res.budget_hit,
                "lower_bound_ms": res.lower_bound_ms, "gap_to_lower_bound": res.best.iteration_ms / res.lower_bound_ms - 1,
            }  # fmt: skip
            for name, b in res.baselines.items():
                row[f"{name}_ms"] = b.iteration_ms if b else None
                row[f"speedup_vs_{name}"] = b.iteration_ms / res.best.iteration_ms if b else None
            equal = [b.iteration_ms for k, b in res.baselines.items() if b and k in ("gpipe", "1f1b")]
            row["speedup_vs_best_equal"] = min(equal) / res.best.iteration_ms if equal else None
            rows.append(row)
            print({k: row[k] for k in ("space", "seed", "plan_ms", "speedup_vs_best_equal", "wall_s")})
    return rows


def main() -> None:
    env = {"python": platform.python_version(), "machine": platform.machine(), "processor": platform.processor()}
    sim = bench_simulator()
    print(sim)
    write_json(OUT / "simulator.json", {"schema": "benchmarks.sim_and_search.simulator/1", "env": env, **sim})
    write_json(OUT / "search.json", {"schema": "benchmarks.sim_and_search.search/1", "env": env, "spaces": bench_search()})


if __name__ == "__main__":
    main()
