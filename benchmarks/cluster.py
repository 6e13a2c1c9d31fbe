"""``python -m benchmarks.cluster``: planning data-parallel x pipeline-parallel training on a cluster.

Two clusters, both with NVLink-like links inside a node (0.005 ms, 300 GB/s)
and InfiniBand-like links between nodes (0.02 ms, 25 GB/s), 141 GB per GPU:

- ``2x8``: 2 nodes of 8 GPUs, the bundled 24-block GPT profile measured on an
  H200 (26 layers: embedding, 24 blocks, head), B = 256: the space
  ``search_spaces/gpt24_h200_2x8.toml``. Target: under 30 s.
- ``128x8``: 128 nodes of 8 GPUs (1,024), the same profile with its block
  repeated to 96 blocks (98 layers), B = 4,096. Target: under 120 s.
- ``2x8-v4``: ``2x8`` with up to 4 chunks per rank (plans and peers alike).

Besides the speedup over the best peer over every factorization, each run
gives the speedup over the best *pipelined* peer (R >= 2): on these profiles
plain data parallelism (R = 1, its all-reduces overlapping the backward) is
the peer to beat.

Both run without a time-budget cutoff (the budget is raised far above the
search's own end, and ``budget_hit`` is recorded). For each: wall time, the
plan's predicted iteration time, its speedup over the best torch schedule over
every factorization and layout (under the model), the chosen R, D, layout and
ZeRO-1, what was pruned, and the machine. Writes ``results/bench/cluster.json``.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks.stats import environment
from umsearch.core.bundled import data_dir
from umsearch.core.profile import Profile, load_profile
from umsearch.search.driver import SearchResult, run_search
from umsearch.search.space import SearchSpace, load_space
from umsearch.storage.jsonio import write_json

SPACE = "gpt24_h200_2x8.toml"
NO_CUTOFF_S = 3600.0
"""A time budget far above either search's own end: the search stops by itself."""


def repeat_blocks(profile: Profile, blocks: int) -> Profile:
    """``profile`` with its block layers (all but the first and the last) replaced by ``blocks``
    copies of its first block, renamed ``block0..``."""
    first, block, last = profile.layers[0], profile.layers[1], profile.layers[-1]
    body = tuple(replace(block, name=f"block{i}") for i in range(blocks))
    return replace(profile, layers=(first, *body, last))


def _spaces() -> dict[str, tuple[SearchSpace, Profile]]:
    base = load_space(data_dir() / SPACE, {"time_budget_s": NO_CUTOFF_S})
    profile = load_profile(base.profile)
    assert base.cluster is not None
    big = replace(base, name="gpt96_h200_128x8", global_batch=4096,
                  cluster=replace(base.cluster, nodes=128))  # fmt: skip
    # Up to 4 chunks per rank for plans and peers alike: on one rank (pure data parallelism) more
    # chunks are more all-reduces that overlap the backward, which helps the peers most.
    deep = replace(base, name="gpt24_h200_2x8_v4", schedule=replace(base.schedule, stages_per_rank=(1, 2, 3, 4)))
    return {"2x8": (base, profile), "128x8": (big, repeat_blocks(profile, 96)), "2x8-v4": (deep, profile)}


def one(label: str, space: SearchSpace, profile: Profile) -> dict[str, Any]:
    t0 = time.perf_counter()
    res: SearchResult = run_search(space, profile)
    wall = time.perf_counter() - t0
    peers = {k: b for k, b in res.baselines.items() if b is not None and k != "local greedy"}
    best = min(peers, key=lambda k: peers[k].iteration_ms)
    plan, t = res.best.plan, res.best.iteration_ms
    pipelined = [o.peer.iteration_ms for o in res.factorizations if o.factorization.ranks >= 2 and o.peer is not None]
    c = space.cluster
    assert c is not None
    return {
        "cluster": label, "nodes": c.nodes, "gpus_per_node": c.gpus_per_node, "layers": profile.num_layers,
        "global_batch": space.global_batch, "memory_limit_bytes": space.memory_limit,
        "wall_s": wall, "budget_hit": res.budget_hit, "iteration_ms": t,
        "best_peer": best, "best_peer_method": peers[best].method, "best_peer_ms": peers[best].iteration_ms,
        "speedup_over_best_peer": peers[best].iteration_ms / t,
        "speedup_over_best_pipelined_peer": min(pipelined) / t if pipelined else None,
        "stages_per_rank_allowed": list(space.schedule.stages_per_rank),
        "ranks": plan.ranks, "data_parallel": plan.data_parallel, "layout": plan.layout, "zero1": plan.zero1,
        "stages_per_rank": plan.num_stages // plan.ranks, "lower_bound_ms": res.lower_bound_ms,
        "factorizations": [{"factorization": o.factorization.label, "umsearch_ms": o.umsearch_ms,
                            "best_peer_ms": o.peer.iteration_ms if o.peer else None, "searched": o.searched}
                           for o in res.factorizations],
        "pruned": [{"factorization": p.factorization.label, "reason": p.reason} for p in res.pruned],
        "evaluations": res.evaluations,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clusters", nargs="*", default=["2x8", "128x8", "2x8-v4"])
    ap.add_argument("--out", default="results/bench/cluster.json")
    a = ap.parse_args(argv)
    runs = []
    for label, (space, profile) in _spaces().items():
        if label not in a.clusters:
            continue
        r = one(label, space, profile)
        runs.append(r)
        print(f"{label:6s} {r['wall_s']:6.1f} s  {r['iteration_ms']:9.3f} ms  {r['speedup_over_best_peer']:.3f}x "
              f"{r['best_peer']}  R={r['ranks']} x D={r['data_parallel']} {r['layout']} zero1={r['zero1']}",
              flush=True)  # fmt: skip
    out = {"runs": runs, "targets_s": {"2x8": 30, "128x8": 120}, "environment": environment(),
           "note": "wall times measured on a shared machine; iteration times are predictions of the model"}  # fmt: skip
    write_json(Path(a.out), out)
    return out


if __name__ == "__main__":
    main()
