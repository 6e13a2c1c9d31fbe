"""``python -m benchmarks.bucketed_sync``: gradient sync in buckets (docs/model.md section 9, version 2.3),
measured on gloo processes against the model's prediction and against per-stage sync.

1. Profile the zoo MLP (:data:`MODEL`, 10 layers: 8 hidden of 4 MiB of weights each) here with
   ``umsearch profile`` (one thread, as each rank runs).
2. Measure the copies' link: a ring all-reduce of 0.25-32 MiB between two processes, every copy group at
   once as the runs have them (two processes; four in two pairs), and fit the section 9 formula
   ``P / bandwidth + 2 latency`` (D = 2) by least squares. That link is the plans' ``inter`` (each replica
   on its own node, ``pp_inner``), the profile's link their pipeline messages' ``intra``.
3. Two shapes: R = 1, D = 2 (two processes, one stage of every layer, one microbatch of 64) and R = 2,
   D = 2 (four processes, two stages, 1F1B over four microbatches of 16). Each runs as three contenders
   that differ only in ``bucket_mib``: ``None`` (each stage whole after its last backward, version 2.2),
   25 (DDP's default: two or three buckets) and 4 (one hidden layer a bucket). All contenders of a shape
   run in one set of processes, :data:`ROUNDS` rounds, the order rotated every round
   (:func:`umsearch.runtime.fidelity.rounds_worker`).

Per contender: the predicted all-reduce end, compute end and iteration time (the reference simulator on
the bare profile, and on the profile with its layer times scaled by the measured/predicted busy time of
the whole-stage contender, fitted on that contender only), the measured medians with 95% intervals (the
all-reduce end is the latest process's end of its wait for the all-reduces, after the barrier that starts
the iteration), the errors, and the per-round ratio of its iteration time to the whole-stage contender's
(below 1: bucketed sync is faster). Also: the machine's load before and after, and drift. Writes
``results/bench/bucketed_sync.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.stats import drift, environment, ratio, summary
from umsearch.core.actions import parse_actions
from umsearch.core.cluster import Cluster
from umsearch.core.cost import CostModel
from umsearch.core.model_spec import ModelSpec
from umsearch.core.plan import Plan, Stage
from umsearch.core.plan_rules import validate_plan
from umsearch.core.profile import Link, Profile, load_profile
from umsearch.errors import RuntimeExecutionError
from umsearch.storage.jsonio import write_json

MODEL = {"source": "mlp", "args": {"width": 1024, "layers": 8}}
SIZES = (1, 4, 16, 64)
ROUNDS = 30
SEED = 0
BUCKETS: dict[str, float | None] = {"whole": None, "25MiB": 25.0, "4MiB": 4.0}
"""The contenders of each shape: the plan's ``bucket_mib``."""
PROBE_MIB = (0.25, 1.0, 4.0, 16.0, 32.0)
PROBE_REPEATS = 15
SCHEMA = "benchmarks.bucketed_sync/1"


def measure_profile(path: Path) -> Profile:
    cmd = [sys.executable, "-m", "umsearch", "profile", str(MODEL["source"]),
           *[f"--arg={k}={v}" for k, v in MODEL["args"].items()],  # type: ignore[attr-defined]
           "--sizes", ",".join(map(str, SIZES)), "--threads", "1", "--repeats", "9", "--out", str(path)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeExecutionError(f"profiling failed ({' '.join(cmd)}):\n{done.stderr[-2000:]}")
    return load_profile(path)


def allreduce_probe(rank: int, world: int, pairs: list[list[int]], sizes: list[int], repeats: int) -> dict[int, float]:
    """Launch target: per size in bytes, the median over ``repeats`` of one bucket's all-reduce as
    :mod:`umsearch.runtime.gradsync` does it (4 MiB gradients flattened, all-reduced, copied back) on this
    process's pair, every pair at once as in the runs."""
    import torch
    import torch.distributed as dist

    made = [dist.new_group(p) for p in pairs]
    mine = next(g for p, g in zip(pairs, made, strict=True) if rank in p)
    out = {}
    for n in sizes:
        grads = list(torch.ones(n // 4).split(2**20))
        took = []
        for _ in range(repeats + 2):
            dist.barrier()
            t0 = time.perf_counter()
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat, group=mine)
            offset = 0
            for g in grads:
                g.copy_(flat[offset : offset + g.numel()])
                offset += g.numel()
            took.append((time.perf_counter() - t0) * 1e3)
        out[n] = statistics.median(took[2:])
    return out


def fit_link(pairs: list[list[int]], launch_cfg: Any) -> tuple[Link, dict[str, Any]]:
    """The copies' link from :func:`allreduce_probe`: ``t = P * ms_per_byte + 2 * latency`` (D = 2)."""
    from benchmarks import bucketed_sync  # the target by its module name, not ``__main__``'s
    from umsearch.runtime.launch import launch

    sizes = [int(m * 2**20) for m in PROBE_MIB]
    world = sum(len(p) for p in pairs)
    per_rank = launch(bucketed_sync.allreduce_probe, world, (pairs, sizes, PROBE_REPEATS), launch_cfg)
    t = np.array([max(r[n] for r in per_rank) for n in sizes])
    a = np.stack([np.array(sizes, dtype=np.float64), np.full(len(sizes), 2.0)], axis=1)
    (per_byte, latency), *_ = np.linalg.lstsq(a, t, rcond=None)
    latency = max(float(latency), 0.0)
    link = Link(latency_ms=latency, bandwidth_gb_per_s=1.0 / (float(per_byte) * 1e6))
    return link, {"bytes": sizes, "measured_ms": t.tolist(), "fitted_ms": (a @ [per_byte, latency]).tolist(),
                  "latency_ms": latency, "bandwidth_gb_per_s": link.bandwidth_gb_per_s}  # fmt: skip


def shapes(profile: Profile) -> dict[str, Plan]:
    """The two shapes, before their cluster and buckets (one replica's lists)."""
    L = profile.num_layers
    pure = Plan(global_batch=64, ranks=1, stages=(Stage(layers=(0, L), rank=0, forward=(64,), backward=(64,)),),
                actions=(tuple(parse_actions("0F0 0B0")),))  # fmt: skip
    half = L // 2
    mbs = (16, 16, 16, 16)
    pipe = Plan(global_batch=64, ranks=2,
                stages=(Stage(layers=(0, half), rank=0, forward=mbs, backward=mbs),
                        Stage(layers=(half, L), rank=1, forward=mbs, backward=mbs)),
                actions=(tuple(parse_actions("0F0 0F1 0B0 0F2 0B1 0F3 0B2 0B3")),
                         tuple(parse_actions("1F0 1B0 1F1 1B1 1F2 1B2 1F3 1B3"))))  # fmt: skip
    return {"R1xD2": pure, "R2xD2": pipe}


def replicated(plan: Plan, profile: Profile, copies_link: Link, bucket_mib: float | None) -> Plan:
    """``plan`` on two replicas, each on its own node (``pp_inner``): pipeline messages on the profile's link,
    the copies' all-reduces on the measured one."""
    cluster = Cluster(gpus_per_node=plan.ranks, intra=profile.link, inter=copies_link)
    return validate_plan(dataclasses.replace(plan, global_batch=2 * plan.global_batch, data_parallel=2,
                                             cluster=cluster, layout="pp_inner", bucket_mib=bucket_mib))  # fmt: skip


def scaled(profile: Profile, s: float) -> Profile:
    """``profile`` with every layer time times ``s``."""
    def times(v: tuple[float, ...]) -> tuple[float, ...]:
        return tuple(x * s for x in v)

    def split(v: tuple[float, ...] | None) -> tuple[float, ...] | None:
        return None if v is None else times(v)

    layers = tuple(dataclasses.replace(lay, fwd_ms=times(lay.fwd_ms), bwd_ms=times(lay.bwd_ms),
                                       bwd_input_ms=split(lay.bwd_input_ms), bwd_weight_ms=split(lay.bwd_weight_ms))
                   for lay in profile.layers)  # fmt: skip
    return dataclasses.replace(profile, layers=layers)


def measured(per_rank: list[list[list[Any]]], job: int, plan: Plan, profile: Profile) -> dict[str, list[float]]:
    """Per round: the latest all-reduce wait end, the latest action end, their max, replica 0's summed busy
    time, and section 9's iteration given the measured compute (:func:`sync_given_compute`)."""
    out: dict[str, list[float]] = {"allreduce_end_ms": [], "compute_end_ms": [], "iteration_ms": [], "busy_ms": [],
                                   "model_given_compute_ms": []}  # fmt: skip
    for r in range(len(per_rank[0])):
        stats = [proc[r][job] for proc in per_rank]
        ar = max(st.allreduce_end_ms for st in stats)
        comp = max(a.end_ms for st in stats for a in st.actions)
        out["allreduce_end_ms"].append(ar)
        out["compute_end_ms"].append(comp)
        out["iteration_ms"].append(max(ar, comp))
        out["busy_ms"].append(sum(a.end_ms - a.start_ms for st in stats if st.replica == 0 for a in st.actions))
        out["model_given_compute_ms"].append(max(comp, sync_given_compute(plan, profile, stats)))
    return out


def sync_given_compute(plan: Plan, profile: Profile, stats: list[Any]) -> float:
    """Section 9's bucketed all-reduce end (the latest), fed the MEASURED last backward of every stage in every
    replica (its start and end) instead of simulated ones: the sync rule alone, without the compute's error."""
    from umsearch.core.cluster import (
        allreduce_ms,
        bucket_cap_bytes,
        bucket_firsts,
        bucket_ready_ms,
        chain_allreduces,
    )

    cost = CostModel(profile)
    quantity = {"B": "bwd", "W": "bwd_weight"}
    assert plan.cluster is not None
    ready, took, ranks = [], [], []
    for j, st in enumerate(plan.stages):
        lasts = [max((a for a in s.actions if a.stage == j and a.action.ends_backward), key=lambda a: a.end_ms)
                 for s in stats if j in s.stages]  # fmt: skip
        q, n = quantity[lasts[0].kind], lasts[0].size
        firsts = np.empty(st.hi - st.lo, dtype=np.int64)
        top = st.hi
        for a in firsts[: bucket_firsts(cost.param_prefix, st.lo, st.hi, bucket_cap_bytes(plan.bucket_mib), firsts)]:
            below, total = cost.time_ms(q, st.lo, int(a), n), cost.time_ms(q, st.lo, st.hi, n)
            ready.append(max(bucket_ready_ms(x.end_ms, x.end_ms - x.start_ms, below, total) for x in lasts))
            took.append(allreduce_ms(cost.param_bytes(int(a), top), plan.data_parallel, plan.cluster.inter))
            ranks.append(st.rank)
            top = int(a)
    m = len(ready)
    start = np.empty(m)
    return float(chain_allreduces(np.array(ready), np.array(took), np.array(ranks, dtype=np.int64), m,
                                  np.empty(m, dtype=np.int64), np.empty(plan.ranks), start))  # fmt: skip


def predicted(plan: Plan, profile: Profile) -> dict[str, float]:
    from umsearch.sim.reference import bucket_spans, simulate

    res = simulate(plan, CostModel(profile))
    assert res.iteration_ms is not None and res.busy_ms is not None and res.allreduce_end_ms is not None
    return {"iteration_ms": res.iteration_ms, "compute_end_ms": float(res.compute_end_ms or 0.0),
            "allreduce_end_ms": res.allreduce_end_ms, "busy_ms": sum(res.busy_ms),
            "buckets": len(bucket_spans(plan, CostModel(profile)))}  # fmt: skip


def error(measured_ms: float, predicted_ms: float) -> float:
    return measured_ms / predicted_ms - 1


def one_shape(name: str, base: Plan, profile: Profile, rounds: int) -> dict[str, Any]:
    from umsearch.runtime.config import LaunchConfig, RunConfig
    from umsearch.runtime.fidelity import rounds_worker
    from umsearch.runtime.launch import launch
    from umsearch.runtime.model_source import spec_factory
    from umsearch.runtime.placement import stage_copies

    launch_cfg = LaunchConfig(threads=1, timeout_s=600)
    probe_plan = replicated(base, profile, profile.link, None)
    link, probe = fit_link([list(c) for c in stage_copies(probe_plan)], launch_cfg)
    plans = {label: replicated(base, profile, link, mib) for label, mib in BUCKETS.items()}
    factory = spec_factory(ModelSpec.from_json(MODEL), SEED)
    cfg = RunConfig(warmup_steps=2, seed=SEED, launch=launch_cfg)
    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    per_rank = launch(rounds_worker, 2 * base.ranks, ([(p, factory) for p in plans.values()], cfg, rounds), launch_cfg)
    wall = time.perf_counter() - t0
    runs = {label: measured(per_rank, j, p, profile) for j, (label, p) in enumerate(plans.items())}
    whole = "whole"
    bare = {label: predicted(p, profile) for label, p in plans.items()}
    scale = statistics.median(runs[whole]["busy_ms"]) / bare[whole]["busy_ms"]
    fitted = scaled(profile, scale)
    rows = {}
    for label, plan in plans.items():
        got = runs[label]
        pred = {"bare": bare[label], "busy_scaled": predicted(plan, fitted)}
        med = {k: statistics.median(v) for k, v in got.items()}
        rows[label] = {
            "bucket_mib": plan.bucket_mib,
            "measured": {k: summary(v) for k, v in got.items()},
            "predicted": pred,
            "error": {kind: {k: error(med[k], p[k]) for k in ("allreduce_end_ms", "iteration_ms", "compute_end_ms")}
                      for kind, p in pred.items()},  # fmt: skip
            "error_given_measured_compute": {  # per round, then the median: the sync rule alone
                "iteration_ms": statistics.median([m / p - 1 for m, p in zip(got["iteration_ms"],
                                                                               got["model_given_compute_ms"], strict=True)])},  # fmt: skip
            "iteration_ratio_to_whole": ratio(got["iteration_ms"], runs[whole]["iteration_ms"]),
            "predicted_ratio_to_whole": {k: p["iteration_ms"] / pred_w["iteration_ms"]
                                         for (k, p), pred_w in zip(pred.items(), (bare[whole], predicted(plans[whole], fitted)), strict=True)},  # fmt: skip
            "drift": drift(got["iteration_ms"][: rounds // 2], got["iteration_ms"][rounds // 2 :]),
        }
    return {"ranks": base.ranks, "replicas": 2, "processes": 2 * base.ranks, "copies_link": probe,
            "busy_scale": scale, "rounds": rounds, "wall_s": wall, "loadavg_1m_before": load_before,
            "loadavg_1m_after": os.getloadavg()[0], "contenders": rows}  # fmt: skip


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=ROUNDS)
    ap.add_argument("--out", default="results/bench/bucketed_sync.json")
    args = ap.parse_args(argv)
    env = environment()
    with tempfile.TemporaryDirectory() as tmp:
        profile = measure_profile(Path(tmp) / "mlp.json")
    doc: dict[str, Any] = {"schema": SCHEMA, "environment": env, "model": MODEL, "backend": "gloo",
                           "threads_per_rank": 1, "profile_link": profile.link.to_json(), "shapes": {}}  # fmt: skip
    for name, base in shapes(profile).items():
        doc["shapes"][name] = one_shape(name, base, profile, args.rounds)
        write_json(args.out, doc)
    doc["loadavg_1m_at_end"] = os.getloadavg()[0]
    write_json(args.out, doc)
    return doc


if __name__ == "__main__":
    main()
