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
on **both** runtimes. Both run on torch's ``PipelineStage`` objects
(:mod:`umsearch.orchestrate.contenders`): "umsearch's runtime" is the plan
through ``PlanSchedule``, "torch's runtime" torch's own schedule class. It reports, paired by round with 95% bootstrap
intervals:

- ``on_umsearch``: the torch schedule on umsearch's runtime over the tuned
  plan, against the refitted model's predicted ratio (what the model
  predicts, on the runtime it models);
- ``on_torch``: the same schedule on torch's runtime over the tuned plan
  (tune's measured ratio, measured again);
- ``torch_over_umsearch``: the schedule on torch's runtime over itself on
  umsearch's runtime.

Each of ``--launches`` launches (fresh rank processes) measures all three
again: a launch's interval covers the noise within it, and the medians of
several launches show how far a result moves from one launch to the next.

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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.stats import drift, environment, ratio, summary
from umsearch.storage.jsonio import write_json

SCHEMA = "umsearch.bench.same_schedule/2"
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


RATIOS = {"on_umsearch": (1, 0), "on_torch": (2, 0), "torch_over_umsearch": (2, 1)}
"""Each reported ratio: (numerator, denominator) indices into the three contenders."""

PREDICTED = frozenset({"on_umsearch", "on_torch"})
"""The ratios the model predicts (torch schedule over tuned plan); the runtimes' ratio it does not."""


def _launch(
    times: list[list[float]], names: Sequence[tuple[str, str]], predicted: float
) -> dict[str, Any]:
    """One launch's contenders and paired ratios (the predicted ratio against the first two)."""
    half = len(times[0]) // 2
    out: dict[str, Any] = {"contenders": [{"name": n, "runtime": rt, **summary(t), "drift": drift(t[:half], t[half:])}
                                          for (n, rt), t in zip(names, times, strict=True)]}  # fmt: skip
    for key, (i, j) in RATIOS.items():
        r = ratio(times[i], times[j])
        out[key] = {k: r[k] for k in ("median", "ci95", "n")}
        if key in PREDICTED:
            out[key]["predicted_inside"] = r["ci95"][0] <= predicted <= r["ci95"][1]
    return out


def _between(launches: list[dict[str, Any]], predicted: float) -> dict[str, Any]:
    """Per ratio: every launch's median, their range, and whether the prediction lies in that range."""
    out = {}
    for key in RATIOS:
        meds = [x[key]["median"] for x in launches]
        out[key] = {"medians": meds, "range": [min(meds), max(meds)]}
        if key in PREDICTED:
            out[key]["predicted_inside_range"] = min(meds) <= predicted <= max(meds)
    return out


def _plan(obj: dict[str, Any]) -> Any:
    """A plan the tune document holds, read through the plan files' one gate (checked once)."""
    import tempfile

    from umsearch.core.loader import load_plan_file
    from umsearch.storage.jsonio import write_json

    with tempfile.TemporaryDirectory() as folder:
        return load_plan_file(write_json(Path(folder) / "plan.json", obj)).plan


def measure_model(section: dict[str, Any], rounds: int, launches: int = 1) -> dict[str, Any]:
    """The three contenders of one model, measured side by side in ``launches`` separate launches (fresh
    rank processes each); see the module doc."""
    from umsearch.core.model_spec import ModelSpec
    from umsearch.orchestrate.contenders import Entry, machine
    from umsearch.runtime.config import LaunchConfig, RunConfig
    from umsearch.runtime.model_source import spec_factory

    picked = _pick(section)
    if picked is None:
        return {"skipped": "a torch schedule measured fastest in the tune run"}
    winner, peer = picked
    spec = ModelSpec.from_json(section["model"])
    cfg = RunConfig(warmup_steps=2, seed=SEED, launch=LaunchConfig(threads=1, timeout_s=600))
    peer_plan = _plan(peer["plan"])
    entries = [Entry(name=winner["name"], plan=_plan(winner["plan"]), runtime="umsearch"),
               Entry(name=f"{peer['schedule']} on umsearch's runtime", plan=peer_plan, runtime="umsearch"),
               Entry(name=f"{peer['schedule']} on torch's runtime", plan=peer_plan, runtime="torch",
                     schedule=peer["schedule"])]  # fmt: skip
    predicted = peer["predicted_after_ms"] / winner["predicted_after_ms"]
    measure = machine(spec_factory(spec, SEED), cfg)
    names = [(e.name, e.runtime) for e in entries]
    runs = [
        _launch([list(m.step_ms) for m in measure(entries, rounds)], names, predicted)
        for _ in range(launches)
    ]
    return {"tuned_plan": winner["name"], "torch_schedule": peer["schedule"], "predicted": predicted,
            "launches": runs, "between_launches": _between(runs, predicted)}  # fmt: skip


def _fmt(x: dict[str, Any]) -> str:
    lo, hi = x["ci95"]
    return f"{x['median']:.3f} [{lo:.3f}, {hi:.3f}]"


def _print(name: str, r: dict[str, Any]) -> None:
    if "skipped" in r:
        print(f"{name}: skipped ({r['skipped']})", file=sys.stderr)
        return
    print(
        f"{name}: {r['torch_schedule']} / {r['tuned_plan']}, predicted {r['predicted']:.3f}",
        file=sys.stderr,
    )
    for k, x in enumerate(r["launches"]):
        worst = max(abs(c["drift"]) for c in x["contenders"])
        print(f"  launch {k + 1}: on umsearch's runtime {_fmt(x['on_umsearch'])}; on torch's runtime "
              f"{_fmt(x['on_torch'])}; torch's / umsearch's runtime, same plan {_fmt(x['torch_over_umsearch'])}; "
              f"drift max {worst:.1%}", file=sys.stderr)  # fmt: skip
    for key, b in r["between_launches"].items():
        lo, hi = b["range"]
        inside = (
            ""
            if "predicted_inside_range" not in b
            else (
                " (prediction inside)" if b["predicted_inside_range"] else " (prediction outside)"
            )
        )
        print(f"  {key}: launch medians {lo:.3f}-{hi:.3f}{inside}", file=sys.stderr)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tune_json", nargs="+", help="tune benchmark JSONs (results/bench/tune.json); a model in "
                    "several is taken from the last one given")  # fmt: skip
    ap.add_argument(
        "--models", default=None, help="comma-separated model names (default: every one found)"
    )
    ap.add_argument("--rounds", type=int, default=40, help="rotated measured rounds per launch")
    ap.add_argument(
        "--launches", type=int, default=3, help="separate launches (fresh rank processes) per model"
    )
    ap.add_argument("--out", default="results/bench/same_schedule.json", help="output file")
    a = ap.parse_args(argv)
    sections: dict[str, tuple[str, dict[str, Any]]] = {}
    for path in a.tune_json:
        for name, sec in json.loads(Path(path).read_text(encoding="utf-8"))["models"].items():
            sections[name] = (path, sec)
    names = a.models.split(",") if a.models else list(sections)
    doc: dict[str, Any] = {"schema": SCHEMA, "command": " ".join(["python -m benchmarks.same_schedule", *sys.argv[1:]]),
                           "environment": environment(), "rounds": a.rounds, "launches": a.launches, "models": {}}  # fmt: skip
    start = time.perf_counter()
    for name in names:
        path, sec = sections[name]
        r = measure_model(sec, a.rounds, a.launches)
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
