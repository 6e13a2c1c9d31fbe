"""Runtime benchmarks: prediction fidelity, and our runtime against torch.distributed.pipelining.

``python -m benchmarks.runtime`` profiles a small GPT on this machine (one
thread, as each stage process runs), then

1. fidelity: runs a set of 2-stage plans (equal and unequal microbatches,
   GPipe and 1F1B, one recomputing) and compares each plan's simulated
   iteration time with the measured median; writes ``fidelity.json``;
2. peer: runs ``torch.distributed.pipelining`` (``PipelineStage`` with
   ``ScheduleGPipe`` and ``Schedule1F1B``) at every equal microbatch count on
   the searched plan's layer split, keeps its fastest, and alternates it
   iteration by iteration with our runtime on the searched plan and on the
   peer's own equal plan; writes ``runtime_vs_pipelining.json``.

All runs of one comparison happen in one set of processes, interleaved round
by round, so that background load hits every contender alike.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from umsearch.core.cost import CostModel
from umsearch.core.errors import RuntimeExecutionError
from umsearch.core.jsonio import write_json
from umsearch.core.plan import Plan, StagePlan, plan_from_json, uniform_plan
from umsearch.core.profile import Profile, load_profile
from umsearch.runtime.comm import StageComm
from umsearch.runtime.config import LaunchConfig, RunConfig
from umsearch.runtime.executor import StageExecutor
from umsearch.runtime.fidelity import mape, measure_plan
from umsearch.runtime.launch import launch
from umsearch.runtime.model import spec_factory, stage_module
from umsearch.runtime.run import merge
from umsearch.runtime.worker import StageReport
from umsearch.sim.reference import simulate

MODEL: dict[str, Any] = {"source": "gpt", "args": {"layers": 6, "width": 128, "heads": 4, "seq": 64}}
BATCH = 16
SIZES = (1, 2, 4, 8, 16)
SEED = 0


@dataclass(frozen=True, kw_only=True)
class Contender:
    """One way to run an iteration: our executor on a plan, or the peer's schedule."""

    name: str
    """Label in the report."""
    plan: dict[str, Any] | None = None
    """Our runtime on this plan (JSON), or None for the peer."""
    peer_schedule: str = ""
    """``gpipe`` or ``1f1b`` (peer only)."""
    peer_microbatches: int = 0
    """Equal microbatch count (peer only)."""
    cut: int = 0
    """Layer where stage 1 starts (peer only; ours take it from the plan)."""


# ------------------------------------------------------------------ processes
def _peer_step(sched: Any, rank: int, world: int, x: torch.Tensor, y: torch.Tensor) -> None:
    if rank == 0:
        sched.step(x)
    elif rank == world - 1:
        sched.step(target=y, losses=[])
    else:
        sched.step()


def _build_contender(c: Contender, rank: int, world: int, model: Any, comm: StageComm | None) -> tuple[Any, Any]:
    """(runner, optimizer) for one contender on this rank."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    if c.plan is not None:
        plan = plan_from_json(c.plan)
        st = plan.stages[rank]
        module = stage_module(model, st.lo, st.hi)
        opt = torch.optim.SGD(module.parameters(), lr=1e-3)
        return StageExecutor(plan, rank, module, model.loss, comm, optimizer=opt), opt
    lo, hi = (0, c.cut) if rank == 0 else (c.cut, len(model.layers))
    module = stage_module(model, lo, hi)
    stage = PipelineStage(module, rank, world, torch.device("cpu"))
    cls = ScheduleGPipe if c.peer_schedule == "gpipe" else Schedule1F1B
    return cls(stage, c.peer_microbatches, loss_fn=model.loss), torch.optim.SGD(module.parameters(), lr=1e-3)


def bench_worker(rank: int, world: int, spec: dict[str, Any], contenders: list[Contender],
                 rounds: int) -> list[dict[str, Any]]:  # fmt: skip
    """Run every contender once per round, in turn; per contender: wall times and our stats."""
    model = spec_factory(spec, SEED)()
    comm = StageComm.create(world, torch.device("cpu"))
    built = [_build_contender(c, rank, world, model, comm) for c in contenders]
    out: list[dict[str, Any]] = [{"wall_ms": [], "stats": []} for _ in contenders]
    for r in range(rounds):
        x, y = model.make_batch(BATCH, torch.Generator().manual_seed(r))
        # Rotate who goes first each round: a contender always running right after the same other
        # one would inherit its cache and allocator state every time.
        turn = [(r + i) % len(contenders) for i in range(len(contenders))]
        for c, (runner, opt), rec in ((contenders[i], built[i], out[i]) for i in turn):
            if c.plan is None:
                opt.zero_grad(set_to_none=True)
            dist.barrier()
            t0 = time.perf_counter()
            if c.plan is not None:
                rec["stats"].append(runner.run_iteration(x if rank == 0 else None, y if rank == world - 1 else None))
            else:
                _peer_step(runner, rank, world, x, y)
                opt.step()
            rec["wall_ms"].append((time.perf_counter() - t0) * 1e3)
    return out


def _run(contenders: list[Contender], rounds: int) -> list[dict[str, Any]]:
    """Launch the two stage processes; per contender, wall times (max over ranks) and stats."""
    per_rank = launch(bench_worker, 2, (MODEL, contenders, rounds), LaunchConfig(threads=1, timeout_s=600))
    merged = []
    for i in range(len(contenders)):
        walls = [max(ranks[i]["wall_ms"][r] for ranks in per_rank) for r in range(rounds)]
        reports = [StageReport(stage=s, stats=tuple(per_rank[s][i]["stats"]), grads=None) for s in range(2)]
        merged.append({"wall_ms": walls, "result": merge(reports) if reports[0].stats else None})
    return merged


# ------------------------------------------------------------------- profiling
def measure_profile(path: Path) -> Profile:
    """Profile :data:`MODEL` here with ``umsearch profile`` (one thread, as each stage runs).

    Through the command line rather than the profiler's Python API: the flags
    are the stable interface, and the link gets measured the same way.
    """
    cmd = [sys.executable, "-m", "umsearch", "profile", MODEL["source"],
           *[f"--arg={k}={v}" for k, v in MODEL["args"].items()],
           "--sizes", ",".join(map(str, SIZES)), "--threads", "1", "--repeats", "11", "--out", str(path)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeExecutionError(f"profiling failed ({' '.join(cmd)}):\n{done.stderr[-2000:]}")
    return load_profile(path)


def fresh_profile() -> Profile:
    """:func:`measure_profile` into a temporary file, with the load average it started under."""
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="umsearch-bench-") as tmp:
        profile = measure_profile(Path(tmp) / "profile.json")
    return replace(profile, extra={**profile.extra, "bench_loadavg_1m_before_profiling": load})


def balanced_cut(cost: CostModel, b: int) -> int:
    """The 2-stage cut with the smallest slower stage at microbatch size ``b``."""
    L = cost.num_layers

    def work(lo: int, hi: int) -> float:
        return cost.stage_fwd_ms(lo, hi, b) + cost.stage_bwd_ms(lo, hi, b, recompute=False)

    return min(range(1, L), key=lambda c: max(work(0, c), work(c, L)))


def fidelity_plans(cut: int, L: int) -> list[tuple[str, Plan]]:
    """Equal and unequal, GPipe and 1F1B, and one recomputing 2-stage plan on ``cut``."""
    B = BATCH

    def two(f0: tuple[int, ...], w0: int, f1: tuple[int, ...], w1: int, b0: tuple[int, ...] | None = None) -> Plan:
        s0 = StagePlan(layers=(0, cut), forward=f0, backward=b0 or f0, warmup=w0, recompute=b0 is not None)
        s1 = StagePlan(layers=(cut, L), forward=f1, backward=f1, warmup=w1)
        return Plan(global_batch=B, stages=(s0, s1))

    return [
        ("equal gpipe 4x4", uniform_plan([0, cut, L], B, 4, "gpipe")),
        ("equal 1f1b 4x4", uniform_plan([0, cut, L], B, 4, "1f1b")),
        ("equal gpipe 8x2", uniform_plan([0, cut, L], B, 8, "gpipe")),
        ("equal 1f1b 8x2", uniform_plan([0, cut, L], B, 8, "1f1b")),
        ("unequal gpipe [2,6,8] | [8,8]", two((2, 6, 8), 3, (8, 8), 2)),
        ("unequal 1f1b [2,2,4,8] | [4,4,8]", two((2, 2, 4, 8), 2, (4, 4, 8), 1)),
        ("unequal 1f1b [4,4,8] | [2,6,8]", two((4, 4, 8), 2, (2, 6, 8), 1)),
        ("recompute s0 fwd [8,8] bwd [4,4,8] | [4,4,8]", two((8, 8), 2, (4, 4, 8), 1, (4, 4, 8))),
    ]


# -------------------------------------------------------------------- benches
def _environment() -> dict[str, Any]:
    return {"python": platform.python_version(), "torch": torch.__version__, "cpus": os.cpu_count(),
            "threads_per_process": 1, "ranks_pinned_to_own_core": (os.cpu_count() or 1) >= 2, "backend": "gloo",
            "loadavg_1m": os.getloadavg()[0]}  # fmt: skip


def bench_fidelity(profile: Profile, out: Path, steps: int, warmup: int,
                   reprofile: Callable[[], Profile] | None = None) -> dict[str, Any]:  # fmt: skip
    """Predicted vs measured for :func:`fidelity_plans`, each in its own run; writes ``fidelity.json``.

    Unlike the peer comparison these runs are not interleaved: an executor
    needs a few iterations to reach steady state (allocator, caches), and the
    prediction is for the steady state.
    """
    cost = CostModel(profile)
    cut = balanced_cut(cost, 4)
    cfg = RunConfig(steps=steps, warmup_steps=warmup, seed=SEED, launch=LaunchConfig(threads=1, timeout_s=600))
    factory = spec_factory(MODEL, SEED)
    rows = [measure_plan(name, plan, cost, factory, cfg)
            for name, plan in fidelity_plans(cut, profile.num_layers)]  # fmt: skip
    second = reprofile() if reprofile is not None else None
    doc = {
        "schema": "benchmarks.sim_and_search.fidelity/1", "command": "python -m benchmarks.runtime",
        "model": MODEL, "global_batch": BATCH, "cut": cut, "steps": steps, "warmup_steps": warmup,
        "timing": "iteration = latest op end after the barrier, max over stages; median of the steps after warm-up",
        "environment": _environment(), "mape_percent": mape(rows),
        "busy_mape_percent": 100 * statistics.fmean(
            abs(p - m) / m for r in rows for p, m in zip(r.predicted_busy_ms, r.measured_busy_ms, strict=True)
        ),
        "plans": [r.to_json() for r in rows], "profile": profile.to_json(),
    }  # fmt: skip
    if second is not None:
        # The same profile measured again after the runs: how much the machine itself moved.
        cost2 = CostModel(second)
        errs = [(simulate(r.plan, cost2).iteration_ms or 0.0) / r.measured_ms - 1 for r in rows]
        doc["repeat_profile"] = {
            "drift_percent": profile_drift(profile, second),
            "mape_percent_with_it": 100 * statistics.fmean(abs(e) for e in errs),
            "loadavg_1m_before": second.extra.get("bench_loadavg_1m_before_profiling"),
        }
    write_json(out / "fidelity.json", doc)
    return doc


def profile_drift(a: Profile, b: Profile) -> float:
    """Mean absolute relative difference of per-layer forward+backward times, in percent."""
    diffs = [
        abs((fa + ba) - (fb + bb)) / (fa + ba)
        for la, lb in zip(a.layers, b.layers, strict=True)
        for fa, ba, fb, bb in zip(la.fwd_ms, la.bwd_ms, lb.fwd_ms, lb.bwd_ms, strict=True)
        if fa + ba > 0
    ]
    return 100 * statistics.fmean(diffs)


def searched_plan(profile: Profile, budget_s: float) -> tuple[Plan, str]:
    """The search's plan for 2 stages and :data:`BATCH` (no recompute); its method name."""
    from umsearch.search.driver import run_search
    from umsearch.search.space import build_space

    space = build_space({"profile": "<in memory>", "stages": 2, "global_batch": BATCH, "recompute": False,
                         "time_budget_s": budget_s, "generations": 60, "population": 48, "seed": 0})  # fmt: skip
    best = run_search(space, profile).best
    return best.plan, best.name


def bench_peer(profile: Profile, out: Path, rounds: int, sweep_rounds: int, budget_s: float) -> dict[str, Any]:
    """Our runtime vs torch.distributed.pipelining; writes ``runtime_vs_pipelining.json``."""
    cost = CostModel(profile)
    ours, method = searched_plan(profile, budget_s)
    cut = ours.stages[0].hi
    L = profile.num_layers
    # pipelining needs at least one microbatch per stage.
    counts = [m for m in (2, 4, 8, 16) if m <= BATCH and BATCH % m == 0]
    sweep = [Contender(name=f"pipelining {k} x{m}", peer_schedule=k, peer_microbatches=m, cut=cut)
             for k in ("gpipe", "1f1b") for m in counts]  # fmt: skip
    swept = _run(sweep, sweep_rounds)
    sweep_ms = {c.name: statistics.median(r["wall_ms"][1:]) for c, r in zip(sweep, swept, strict=True)}
    best = min(sweep, key=lambda c: sweep_ms[c.name])
    equal = uniform_plan([0, cut, L], BATCH, best.peer_microbatches, best.peer_schedule)
    final = [best, Contender(name="umsearch runtime, searched plan", plan=ours.to_json()),
             Contender(name="umsearch runtime, peer's equal plan", plan=equal.to_json())]  # fmt: skip
    runs = _run(final, rounds)
    med = [statistics.median(r["wall_ms"][1:]) for r in runs]
    doc = {
        "schema": "benchmarks.sim_and_search.runtime_vs_pipelining/1", "command": "python -m benchmarks.runtime",
        "model": MODEL, "global_batch": BATCH, "cut": cut, "rounds": rounds, "warmup_rounds": 1,
        "environment": _environment(),
        "timing": "wall time per iteration, barrier to optimizer step done, max over the 2 ranks; median",
        "peer_sweep_median_ms": sweep_ms, "peer_best": best.name,
        "searched_plan": {"method": method, "stages": [s.to_json() for s in ours.stages],
                          "predicted_ms": simulate(ours, cost).iteration_ms},
        "peer_equal_plan_predicted_ms": simulate(equal, cost).iteration_ms,
        "median_ms": {c.name: m for c, m in zip(final, med, strict=True)},
        "all_ms": {c.name: r["wall_ms"] for c, r in zip(final, runs, strict=True)},
        "ratio_peer_over_ours_searched": med[0] / med[1],
        "ratio_peer_over_ours_equal": med[0] / med[2],
        "ratio_ours_equal_over_ours_searched": med[2] / med[1],
    }  # fmt: skip
    write_json(out / "runtime_vs_pipelining.json", doc)
    return doc


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.runtime", description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="results/bench", help="output directory")
    ap.add_argument("--steps", type=int, default=16, help="iterations per fidelity plan")
    ap.add_argument("--warmup", type=int, default=4, help="leading fidelity iterations left out")
    ap.add_argument("--rounds", type=int, default=16, help="interleaved iterations per peer contender")
    ap.add_argument("--only", choices=["fidelity", "peer"], default=None)
    ap.add_argument("--profile", default=None, help="use this profile of MODEL instead of measuring one")
    a = ap.parse_args(argv)
    out = Path(a.out)
    t0 = time.time()
    profile = load_profile(a.profile) if a.profile else fresh_profile()
    print(f"profiled {profile.model} in {time.time() - t0:.0f} s; link {profile.link}", file=sys.stderr)
    if a.only in (None, "fidelity"):
        fid = bench_fidelity(profile, out, a.steps, a.warmup, None if a.profile else fresh_profile)
        for row in fid["plans"]:
            print(f"{row['name']:48s} predicted {row['predicted_ms']:8.2f} ms  measured "
                  f"{row['measured_median_ms']:8.2f} ms  {row['error']:+.1%}")  # fmt: skip
        print(f"fidelity MAPE {fid['mape_percent']:.1f}% (busy-time MAPE {fid['busy_mape_percent']:.1f}%)")
        if "repeat_profile" in fid:
            rep = fid["repeat_profile"]
            print(f"profile measured again: drift {rep['drift_percent']:.1f}%, "
                  f"MAPE with it {rep['mape_percent_with_it']:.1f}%")  # fmt: skip
    if a.only in (None, "peer"):
        peer = bench_peer(profile, out, a.rounds, sweep_rounds=4, budget_s=20.0)
        for name, ms in peer["median_ms"].items():
            print(f"{name:48s} {ms:8.2f} ms")
        print(f"peer / ours (searched) = {peer['ratio_peer_over_ours_searched']:.3f}; "
              f"peer / ours (same equal plan) = {peer['ratio_peer_over_ours_equal']:.3f}")  # fmt: skip
    print(f"total {time.time() - t0:.0f} s; written to {out}/", file=sys.stderr)


if __name__ == "__main__":
    # Run from the imported module so the stage processes unpickle the same classes.
    from benchmarks.runtime import main as _main

    _main()
