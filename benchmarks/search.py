"""``python -m benchmarks.search``: the search on every bundled space and seed, against every peer schedule.

For each space and seed: the plan's predicted iteration time, its speedup over
the best torch.distributed.pipelining schedule (each at its best microbatch
count and partition, same cost model) and over the best one-stage-per-rank
equal plan (GPipe or 1F1B, what version 1 compared with), the gap to the lower
bound, the plans scored and the wall time; per space, the worst seed's time
over the best seed's. One search at a time. Writes ``results/bench/search.json``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from benchmarks.stats import environment
from umsearch.core.data import data_dir
from umsearch.core.jsonio import write_json
from umsearch.core.profile import load_profile
from umsearch.search.driver import run_search
from umsearch.search.space import load_space

V1 = ("GPipe", "1F1B")


def one(space_path: Path, seed: int) -> dict[str, Any]:
    space = load_space(space_path, {"seed": seed})
    res = run_search(space, load_profile(space.profile))
    peers = {k: b for k, b in res.baselines.items() if b is not None and k != "local greedy"}
    best_name = min(peers, key=lambda k: peers[k].iteration_ms)
    t = res.best.iteration_ms
    v1 = [peers[k].iteration_ms for k in V1 if k in peers]
    return {
        "space": space.name, "seed": seed, "iteration_ms": t, "best_peer": best_name,
        "speedup_over_best_peer": peers[best_name].iteration_ms / t,
        "speedup_over_best_v1_equal": min(v1) / t if v1 else None,
        "peers_ms": {k: b.iteration_ms for k, b in peers.items()},
        "gap_to_lower_bound": t / res.lower_bound_ms - 1, "lower_bound_ms": res.lower_bound_ms,
        "stages_per_rank": res.best.plan.num_stages // res.best.plan.ranks,
        "split_backward": any(res.best.plan.uses_split), "equal_microbatches": res.best.plan.equal_microbatches,
        "evaluations": res.evaluations, "wall_s": res.wall_s, "budget_hit": res.budget_hit,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--spaces", nargs="*", default=None, help="space names (default: every bundled one)")
    ap.add_argument("--out", default="results/bench/search.json")
    a = ap.parse_args(argv)
    paths = sorted(data_dir().glob("*.toml"))
    if a.spaces:
        paths = [p for p in paths if p.stem in a.spaces]
    runs = []
    for p in paths:
        for seed in range(a.seeds):
            runs.append(one(p, seed))
            r = runs[-1]
            print(f"{r['space']:10s} seed {seed}: {r['iteration_ms']:9.3f} ms  {r['speedup_over_best_peer']:.3f}x "
                  f"{r['best_peer']}  gap {r['gap_to_lower_bound']:.1%}  {r['wall_s']:.1f} s", flush=True)  # fmt: skip
    spaces = {}
    for name in dict.fromkeys(r["space"] for r in runs):
        mine = [r for r in runs if r["space"] == name]
        times = [r["iteration_ms"] for r in mine]
        spaces[name] = {"worst_over_best_seed": max(times) / min(times),
                        "speedups_over_best_peer": [r["speedup_over_best_peer"] for r in mine],
                        "max_wall_s": max(r["wall_s"] for r in mine)}  # fmt: skip
    doc = {"schema": "umsearch.bench.search/2", "environment": environment(), "runs": runs, "spaces": spaces,
           "note": "predicted times, one cost model for every contender; one search at a time"}  # fmt: skip
    write_json(Path(a.out), doc)
    return doc


if __name__ == "__main__":
    main()
