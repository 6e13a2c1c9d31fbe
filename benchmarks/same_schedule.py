"""Same schedule, both runtimes: how much of tune's predicted-vs-measured gap is torch's runtime itself.

The cost model predicts umsearch's runtime; the tune benchmark
(:mod:`benchmarks.tune`) compares the tuned plan with the best torch schedule
on torch's own runtime. Where the predicted ratio misses the measured
interval, either the model mispredicts a plan or the two runtimes run the
same schedule at different speeds. ``python -m benchmarks.same_schedule``
separates the two: for each model of a tune benchmark's JSON, it takes the
last round's tuned plan and best torch schedule (with its partition and
microbatch count) and measures, in one set of rank processes with rounds
rotated, the tuned plan on umsearch's runtime and the torch schedule's plan
on **both** runtimes. It reports, paired by round with 95% bootstrap
intervals:

- ``on_umsearch``: the torch schedule on umsearch's runtime over the tuned
  plan, against the refitted model's predicted ratio (what the model
  predicts, on the runtime it models);
- ``on_torch``: the same schedule on torch's runtime over the tuned plan
  (tune's measured ratio, measured again);
- ``torch_over_umsearch``: the schedule on torch's runtime over itself on
  umsearch's runtime.

It writes ``results/bench/same_schedule.json`` with its environment and every
contender's drift between the halves of its rounds. Every figure in it was
measured in that run, except the predicted ratios, which are read from the
tune JSON they came from.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.stats import drift, environment, ratio, summary
from umsearch.core.jsonio import write_json

SCHEMA = "umsearch.bench.same_schedule/1"
SEED = 0


def _pick(section: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """(tuned plan, best torch schedule) of the loop's last round; None when a torch schedule won."""
    last = section["tune"]["rounds"][-1]["contenders"]
    mine = [c for c in last if c["runtime"] == "umsearch"]
    peers = [c for c in last if c["runtime"] == "torch"]
    if not mine or not peers:
        return None
    winner, peer = (
        min(mine, key=lambda c: c["measured_median_ms"]),
        min(peers, key=lambda c: c["measured_median_ms"]),
    )
    return (winner, peer) if winner["measured_median_ms"] < peer["measured_median_ms"] else None


def measure_model(section: dict[str, Any], rounds: int) -> dict[str, Any]:
    """The three contenders of one model, measured side by side; see the module doc."""
    from umsearch.core.model_spec import ModelSpec
    from umsearch.core.plan_io import plan_from_json
    from umsearch.orchestrate.measure import Entry, machine
    from umsearch.runtime.config import LaunchConfig, RunConfig
    from umsearch.runtime.factory import spec_factory

    picked = _pick(section)
    if picked is None:
        return {"skipped": "a torch schedule measured fastest in the tune run"}
    winner, peer = picked
    spec = ModelSpec.from_json(section["model"])
    cfg = RunConfig(warmup_steps=2, seed=SEED, launch=LaunchConfig(threads=1, timeout_s=600))
    peer_plan = plan_from_json(peer["plan"])
    entries = [Entry(name=winner["name"], plan=plan_from_json(winner["plan"]), runtime="umsearch"),
               Entry(name=f"{peer['schedule']} on umsearch's runtime", plan=peer_plan, runtime="umsearch"),
               Entry(name=f"{peer['schedule']} on torch's runtime", plan=peer_plan, runtime="torch",
                     schedule=peer["schedule"])]  # fmt: skip
    got = machine(spec_factory(spec, SEED), cfg)(entries, rounds)
    times = [list(m.step_ms) for m in got]
    half = rounds // 2
    predicted = peer["predicted_after_ms"] / winner["predicted_after_ms"]

    def against(r: dict[str, Any], pred: float | None) -> dict[str, Any]:
        out = {k: r[k] for k in ("median", "ci95", "n")}
        if pred is not None:
            out.update(predicted=pred, predicted_inside=r["ci95"][0] <= pred <= r["ci95"][1])
        return out

    return {
        "tuned_plan": winner["name"], "torch_schedule": peer["schedule"],
        "contenders": [{"name": e.name, "runtime": e.runtime, **summary(t), "drift": drift(t[:half], t[half:])}
                       for e, t in zip(entries, times, strict=True)],
        "on_umsearch": against(ratio(times[1], times[0]), predicted),
        "on_torch": against(ratio(times[2], times[0]), predicted),
        "torch_over_umsearch": against(ratio(times[2], times[1]), None),
    }  # fmt: skip


def _print(name: str, r: dict[str, Any]) -> None:
    if "skipped" in r:
        print(f"{name}: skipped ({r['skipped']})", file=sys.stderr)
        return

    def fmt(x: dict[str, Any]) -> str:
        lo, hi = x["ci95"]
        inside = (
            ""
            if "predicted" not in x
            else f", predicted {x['predicted']:.3f} {'inside' if x['predicted_inside'] else 'outside'}"
        )
        return f"{x['median']:.3f} [{lo:.3f}, {hi:.3f}]{inside}"

    worst = max(abs(c["drift"]) for c in r["contenders"])
    print(f"{name}: {r['torch_schedule']} / {r['tuned_plan']}: on umsearch's runtime {fmt(r['on_umsearch'])}; "
          f"on torch's runtime {fmt(r['on_torch'])}; torch's runtime / umsearch's on the same plan "
          f"{fmt(r['torch_over_umsearch'])}; drift max {worst:.1%}", file=sys.stderr)  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tune_json", nargs="+", help="tune benchmark JSONs (results/bench/tune.json); a model in "
                    "several is taken from the last one given")  # fmt: skip
    ap.add_argument(
        "--models", default=None, help="comma-separated model names (default: every one found)"
    )
    ap.add_argument("--rounds", type=int, default=40, help="rotated measured rounds")
    ap.add_argument("--out", default="results/bench/same_schedule.json", help="output file")
    a = ap.parse_args(argv)
    sections: dict[str, tuple[str, dict[str, Any]]] = {}
    for path in a.tune_json:
        for name, sec in json.loads(Path(path).read_text(encoding="utf-8"))["models"].items():
            sections[name] = (path, sec)
    names = a.models.split(",") if a.models else list(sections)
    doc: dict[str, Any] = {"schema": SCHEMA, "command": " ".join(["python -m benchmarks.same_schedule", *sys.argv[1:]]),
                           "environment": environment(), "rounds": a.rounds, "models": {}}  # fmt: skip
    start = time.perf_counter()
    for name in names:
        path, sec = sections[name]
        r = measure_model(sec, a.rounds)
        doc["models"][name] = {"tune_json": path, **r}
        _print(name, r)
        doc["wall_s"] = time.perf_counter() - start
        write_json(a.out, doc)  # after every model: an interrupted run keeps what it measured
    ratios = [
        r["torch_over_umsearch"]["median"]
        for r in doc["models"].values()
        if "torch_over_umsearch" in r
    ]
    if ratios:
        print(
            f"torch's runtime / umsearch's, median over models: {statistics.median(ratios):.3f}",
            file=sys.stderr,
        )
    print(f"wrote {a.out} in {doc['wall_s']:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
