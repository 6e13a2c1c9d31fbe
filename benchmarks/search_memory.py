"""``python -m benchmarks.search_memory``: the searched plan against the best torch schedule that fits, where memory binds.

Cases (all under the model, docs/model.md):

- the two real H200 profiles of ``../shared/gpu-profiles/`` on 2 nodes x 8 GPUs
  (``search_spaces/gpt24_h200_2x8.toml``, B = 256), each at three per-GPU
  limits below the peak of the unconstrained best plan;
- the bundled CPU profiles (``search_spaces/profiles/*_cpu.json``, R = 4,
  B = 64) at 60% of the unconstrained best plan's peak.

Per case: the limit, the best fitting peer (every baseline the search scores:
all stage counts, full activation checkpointing, ZeRO-1, every factorization),
the plan, the ratio ``peer / plan`` and the memory-aware lower bound.
:func:`memory_table` is what the main search benchmark calls. Writes
``results/bench/search_memory.json``.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks.stats import environment
from umsearch.core.bundled import data_dir
from umsearch.core.profile import load_profile
from umsearch.errors import NoFeasiblePlanError
from umsearch.search.baselines import GREEDY
from umsearch.search.driver import SearchResult, run_search
from umsearch.search.space import SearchSpace, load_space
from umsearch.storage.jsonio import write_json

GIB = 2**30
GPU_PROFILES = Path(__file__).resolve().parents[2] / "shared" / "gpu-profiles"
GPU_LIMITS_GIB = {"gpt24w1024_h200_tf32.json": (16.0, 10.0, 6.0), "gpt32w2048_h200_tf32.json": (40.0, 24.0, 16.0)}
"""Per GPU profile, three limits (GiB per GPU); the issue's, plus 24 GiB for the 32-block model."""
CPU_SPACES = (("gpt_cpu.toml", None), ("vgg16_cpu.toml", None), ("gpt_cpu.toml", "mlp_cpu.json"))
"""Per bundled CPU profile, its space (the mlp profile has none of its own: the gpt space's settings)."""
CPU_FRACTION = 0.6
"""CPU cases run at this fraction of the unconstrained best plan's peak."""


def _case(space: SearchSpace, label: str, free_peak: float | None) -> dict[str, Any]:
    t0 = time.perf_counter()
    profile = load_profile(space.profile)
    try:
        res: SearchResult = run_search(space, profile)
    except NoFeasiblePlanError as exc:
        return {"case": label, "memory_limit_bytes": space.memory_limit, "error": str(exc)}
    wall = time.perf_counter() - t0
    peers = {k: b for k, b in res.baselines.items() if b is not None and k != GREEDY}
    best = min(peers, key=lambda k: peers[k].iteration_ms) if peers else None
    plan = res.best
    out: dict[str, Any] = {
        "case": label, "memory_limit_bytes": space.memory_limit, "free_best_peak_bytes": free_peak,
        "plan_ms": plan.iteration_ms, "plan_peak_bytes": plan.max_memory, "plan_name": plan.name,
        "plan": {"ranks": plan.plan.ranks, "data_parallel": plan.plan.data_parallel, "zero1": plan.plan.zero1,
                 "stages": plan.plan.num_stages, "recompute": [st.recompute for st in plan.plan.stages]},
        "lower_bound_ms": res.lower_bound_ms, "gap_to_bound": plan.iteration_ms / res.lower_bound_ms - 1,
        "wall_s": wall, "budget_hit": res.budget_hit,
    }  # fmt: skip
    if best is not None:
        out |= {"best_peer": best, "best_peer_method": peers[best].method, "best_peer_ms": peers[best].iteration_ms,
                "ratio": peers[best].iteration_ms / plan.iteration_ms}  # fmt: skip
    return out


def _free_peak(space: SearchSpace) -> tuple[float, dict[str, Any]]:
    free = replace(space, memory_limit=1e15)
    row = _case(free, f"{space.name} free", None)
    return float(row["plan_peak_bytes"]), row


def gpu_cases(budget_s: float) -> list[dict[str, Any]]:
    """The two GPU profiles on 2 x 8 GPUs: unconstrained, then at each of their three limits."""
    rows = []
    for name, limits in GPU_LIMITS_GIB.items():
        path = GPU_PROFILES / name
        if not path.exists():
            rows.append({"case": name, "error": f"{path} is missing"})
            continue
        space = load_space(data_dir() / "gpt24_h200_2x8.toml", {"profile": str(path), "time_budget_s": budget_s})
        space = replace(space, name=path.stem)
        peak, row = _free_peak(space)
        rows.append(row)
        for gib in limits:
            rows.append(_case(replace(space, memory_limit=gib * GIB), f"{path.stem} {gib:g} GiB", peak))
            print(_line(rows[-1]), flush=True)
    return rows


def cpu_cases(budget_s: float) -> list[dict[str, Any]]:
    """The bundled CPU spaces at :data:`CPU_FRACTION` of their unconstrained best plan's peak."""
    rows = []
    for name, profile in CPU_SPACES:
        flags: dict[str, Any] = {"time_budget_s": budget_s}
        if profile is not None:
            flags["profile"] = str(data_dir() / "profiles" / profile)
        space = load_space(data_dir() / name, flags)
        if profile is not None:
            space = replace(space, name=Path(profile).stem)
        peak, row = _free_peak(space)
        rows.append(row)
        rows.append(_case(replace(space, memory_limit=CPU_FRACTION * peak), f"{space.name} {CPU_FRACTION:.0%}", peak))
        print(_line(rows[-1]), flush=True)
    return rows


def _line(r: dict[str, Any]) -> str:
    if "ratio" not in r:
        return f"{r['case']}: {r.get('error', 'no peer fits')}"
    return (f"{r['case']:32s} {r['plan_ms']:9.2f} ms  peer {r['best_peer_ms']:9.2f} ms  {r['ratio']:.3f}x  "
            f"bound {r['lower_bound_ms']:9.2f} ms  {r['wall_s']:5.1f} s")  # fmt: skip


def memory_table(budget_s: float = 60.0, gpu: bool = True, cpu: bool = True) -> list[dict[str, Any]]:
    """The memory-bound table (one row per case, unconstrained runs included): what the main search
    benchmark embeds."""
    return (gpu_cases(budget_s) if gpu else []) + (cpu_cases(budget_s) if cpu else [])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--budget-s", type=float, default=60.0, help="each search's time budget")
    ap.add_argument("--only", choices=["gpu", "cpu"], default=None)
    ap.add_argument("--out", default="results/bench/search_memory.json")
    a = ap.parse_args(argv)
    rows = memory_table(a.budget_s, gpu=a.only != "cpu", cpu=a.only != "gpu")
    ratios = [r["ratio"] for r in rows if "ratio" in r and not r["case"].endswith("free")]
    out = {"rows": rows, "least_ratio": min(ratios, default=None), "environment": environment(),
           "note": "iteration times are the model's predictions; wall times are on a shared machine"}  # fmt: skip
    write_json(Path(a.out), out)
    return out


if __name__ == "__main__":
    main()
