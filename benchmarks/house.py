"""Issue 39's "no slower": ``umsearch run`` of one plan on two trees, before the house work and now, side by side.

``python -m benchmarks.house --base /tmp/house_base --now /tmp/house_now`` runs, per round, the same plan
with ``umsearch run --json`` (2 gloo ranks, one thread each) once from each tree, in an order rotated every
round, each run's median iteration after its warm-up being the round's value for that tree. Each tree is a
plain folder holding its ``umsearch`` package (``git archive COMMIT | tar -x -C FOLDER``; the runs import it
through ``PYTHONPATH`` and their working directory, the rank processes included). It writes
``results/bench/house.json``: per tree the rounds' medians, the paired per-round ratio now / base with its
median and 95% bootstrap interval (below 1: now is faster), the drift of each tree between the first and
second half of the rounds, and the load average before every run.

The plan: torch's Interleaved1F1B on 2 ranks x 2 stages, 32 equal microbatches of a batch of 64, on the zoo's
``mlp`` (8 blocks of width 256): small compute per action, so that what the executor itself does per action
(posting, assembling, routing) weighs as much as it can on a CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.stats import drift, environment, ratio, summary
from umsearch.core.plan import equal_split, placed_plan
from umsearch.core.plan_io import save_plan
from umsearch.core.plan_rules import validate_plan
from umsearch.core.schedules import PEER_SCHEDULES
from umsearch.storage.jsonio import write_json

SCHEMA = "benchmarks.house/1"
MODEL = ("mlp", {"layers": 8, "width": 256})
SCHEDULE, RANKS, STAGES_PER_RANK, MICROBATCHES, BATCH = "Interleaved1F1B", 2, 2, 32, 64


def write_plan(folder: Path) -> Path:
    """The benchmark's plan as a plan/2 file (no profile: the runs name the model)."""
    from umsearch.nn.zoo import ZOO

    layers = len(ZOO[MODEL[0]](**MODEL[1]).layers)
    peer = PEER_SCHEDULES[SCHEDULE]
    S = RANKS * STAGES_PER_RANK
    cuts = [round(j * layers / S) for j in range(S + 1)]
    plan = validate_plan(placed_plan(cuts, peer.stage_ranks(RANKS, STAGES_PER_RANK), BATCH,
                                     [equal_split(BATCH, MICROBATCHES)] * S,
                                     peer.generate(RANKS, STAGES_PER_RANK, MICROBATCHES)))  # fmt: skip
    return save_plan(plan, folder / "plan.json")


def run_once(tree: Path, plan: Path, steps: int, warmup: int) -> float:
    """``umsearch run`` of ``plan`` from ``tree``: its median iteration (ms) after ``warmup`` steps."""
    name, args = MODEL
    cmd = [sys.executable, "-m", "umsearch", "run", str(plan), "--model", name,
           *[f"--arg={k}={v}" for k, v in args.items()], "--steps", str(steps), "--warmup-steps", str(warmup),
           "--threads", "1", "--json"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, check=False, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"{tree}: umsearch run failed ({done.returncode}): {done.stderr[-2000:]}")
    doc = json.loads(done.stdout.strip().splitlines()[-1])
    return float(doc["median_iteration_ms"])


def which_umsearch(tree: Path) -> str:
    """The file ``import umsearch`` finds from ``tree`` (to prove each tree runs its own package)."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", "import umsearch; print(umsearch.__file__)"], cwd=tree, env=env,
                         capture_output=True, text=True, check=True)  # fmt: skip
    return out.stdout.strip()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.house", description=__doc__.split("\n")[0])
    ap.add_argument("--base", required=True, help="folder holding the umsearch package before the house work")
    ap.add_argument("--now", required=True, help="folder holding the umsearch package measured against it")
    ap.add_argument("--base-commit", default="", help="the commit --base was taken from (recorded)")
    ap.add_argument("--now-commit", default="", help="what --now holds (recorded)")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--steps", type=int, default=12, help="iterations per run (the first --warmup not timed)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--out", default="results/bench/house.json")
    a = ap.parse_args(argv)
    trees = {"base": Path(a.base).resolve(), "now": Path(a.now).resolve()}
    packages = {k: which_umsearch(t) for k, t in trees.items()}
    for k, t in trees.items():
        if not packages[k].startswith(str(t)):
            raise SystemExit(f"--{k} {t}: python imports umsearch from {packages[k]}, not from that folder")
    env = environment()
    times: dict[str, list[float]] = {k: [] for k in trees}
    loads: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        plan = write_plan(Path(tmp))
        for r in range(a.rounds):
            order = list(trees) if r % 2 == 0 else list(reversed(trees))
            for k in order:
                loads.append(os.getloadavg()[0])
                times[k].append(run_once(trees[k], plan, a.steps, a.warmup))
            print(f"round {r + 1}/{a.rounds}: " + ", ".join(f"{k} {times[k][-1]:.2f} ms" for k in trees)
                  + f" (load {loads[-1]:.1f})", flush=True)  # fmt: skip
            write_json(Path(a.out), report(a, argv, env, trees, packages, times, loads))  # every round: a stop keeps them
    rr = report(a, argv, env, trees, packages, times, loads)["now_over_base"]
    print(f"now / base: {rr['median']:.3f} (95% CI {rr['ci95'][0]:.3f}-{rr['ci95'][1]:.3f}), {a.rounds} rounds")


def report(a: argparse.Namespace, argv: list[str] | None, env: dict[str, Any], trees: dict[str, Path],
           packages: dict[str, str], times: dict[str, list[float]], loads: list[float]) -> dict[str, Any]:  # fmt: skip
    """``house.json`` of the rounds measured so far."""
    half = len(times["now"]) // 2
    return {
        "schema": SCHEMA, "environment": env,
        "command": "python -m benchmarks.house " + " ".join(argv if argv is not None else sys.argv[1:]),
        "plan": {"schedule": SCHEDULE, "ranks": RANKS, "stages_per_rank": STAGES_PER_RANK,
                 "microbatches": MICROBATCHES, "batch": BATCH, "model": {"name": MODEL[0], **MODEL[1]},
                 "backend": "gloo", "threads_per_rank": 1, "steps": a.steps, "warmup_steps": a.warmup},
        "trees": {k: {"folder": str(t), "package": packages[k],
                      "commit": a.base_commit if k == "base" else a.now_commit} for k, t in trees.items()},
        "iteration_ms": {k: {**summary(v), "rounds": v, "drift": drift(v[:half], v[half:]) if half else None} for k, v in times.items()},
        "now_over_base": ratio(times["now"], times["base"]),
        "loadavg_1m": {"min": min(loads), "median": statistics.median(loads), "max": max(loads)},
        "rounds_done": len(times["now"]),
    }  # fmt: skip


if __name__ == "__main__":
    main()
