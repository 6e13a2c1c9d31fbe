"""``python -m benchmarks.simulator``: candidates per second of the compiled evaluator against the reference.

The workload of issue "Model v2": R=8 ranks x 2 stages (looped), 32 layers of
the synthetic simnet0 with the I/W split, B=256, every stage its own random
partition into 8..64 microbatches, half of the backwards split into I and W,
each rank's actions a valid, deadlock-free order. In one run, rounds rotated:

- ``evaluator``: pack + evaluate of array plans (what the search does),
- ``evaluator_from_plans``: encode Plan objects first, then pack + evaluate,
- ``reference``: the event-driven simulator, plan by plan,

each on its own rounds; the evaluator also with one numba thread. Writes
``results/bench/simulator.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import time
from pathlib import Path
from typing import Any

import numba

from benchmarks.evaluator import random_plan as plan_of_shape
from benchmarks.stats import environment, summary
from umsearch.core.cost import CostModel
from umsearch.core.plan import Plan
from umsearch.core.profile import Profile
from umsearch.measure.synthetic import simnet_profile
from umsearch.sim.population import encode, evaluate, pack
from umsearch.sim.reference import simulate
from umsearch.storage.jsonio import write_json

R, V, L, B = 8, 2, 32, 256


def profile() -> Profile:
    return simnet_profile(layers=L, seed=0)


def random_plan(rng: random.Random) -> Plan:
    """:func:`benchmarks.evaluator.random_plan` at this benchmark's shape: R ranks x V looped stages, 8-64
    microbatches per stage, half the backwards split (deadlock-free)."""
    return plan_of_shape(rng, R, V, 8, 64)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--plans", type=int, default=1000, help="candidates per evaluator round")
    ap.add_argument("--reference-plans", type=int, default=20, help="plans per reference round")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out", default="results/bench/simulator.json")
    a = ap.parse_args(argv)
    rng = random.Random(0)
    plans = [random_plan(rng) for _ in range(a.plans)]
    cost = CostModel(profile())
    tables = cost.tables(B)
    arrays = [encode(p) for p in plans]
    evaluate(pack(arrays[:2]), tables)  # compile (or load the cache) outside the timing
    threads = numba.get_num_threads()

    def fast() -> float:
        t = time.perf_counter()
        evaluate(pack(arrays), tables)
        return len(arrays) / (time.perf_counter() - t)

    def fast_one_thread() -> float:
        numba.set_num_threads(1)
        try:
            return fast()
        finally:
            numba.set_num_threads(threads)

    def from_plans() -> float:
        t = time.perf_counter()
        evaluate(pack([encode(p) for p in plans]), tables)
        return len(plans) / (time.perf_counter() - t)

    def reference() -> float:
        t = time.perf_counter()
        for p in plans[: a.reference_plans]:
            simulate(p, cost)
        return a.reference_plans / (time.perf_counter() - t)

    contenders = {"evaluator": fast, "evaluator_one_thread": fast_one_thread,
                  "evaluator_from_plans": from_plans, "reference": reference}  # fmt: skip
    rates: dict[str, list[float]] = {k: [] for k in contenders}
    names = list(contenders)
    for i in range(a.rounds):
        for name in names[i % len(names):] + names[: i % len(names)]:  # rotate who goes first
            rates[name].append(contenders[name]())
    ref = rates["reference"]
    doc = {
        "schema": "umsearch.bench.simulator/2", "environment": environment(), "numba_threads": threads,
        "workload": {"ranks": R, "stages_per_rank": V, "layers": L, "global_batch": B, "microbatches_per_stage": [8, 64],
                     "split_share": 0.5, "actions_per_plan": sum(len(x) for x in plans[0].actions),
                     "profile": dataclasses.asdict(profile().link) | {"model": profile().model}},
        "candidates_per_s": {k: summary(v) for k, v in rates.items()},
        "speedup_over_reference": {k: summary([x / y for x, y in zip(v, ref, strict=True)])
                                   for k, v in rates.items() if k != "reference"},
        "note": "rates are per round; speedups pair each round with the reference's in the same round",
    }  # fmt: skip
    write_json(Path(a.out), doc)
    for k, v in doc["candidates_per_s"].items():
        print(f"{k:24s} {v['median']:10.0f} candidates/s  (95% CI {v['ci95'][0]:.0f}-{v['ci95'][1]:.0f})")
    return doc


if __name__ == "__main__":
    main()
