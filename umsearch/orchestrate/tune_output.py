"""What ``umsearch tune`` writes: ``tune.json`` (``umsearch.tune/1``), ``report.md``, the refitted profile,
``plan.json`` (the contender that measured fastest) and, when a torch schedule won, its export.

Everything goes through :class:`umsearch.storage.output_folder.OutputFolder`: into a
staging folder first, then into place, ``plan.json`` last, leaving files the
user put in the folder alone.
"""

from __future__ import annotations

import hashlib
import json
import statistics
from pathlib import Path
from typing import Any

from umsearch.core.plan_io import PlanDocument, save_document
from umsearch.core.profile import Profile
from umsearch.orchestrate.tune import ContenderResult, TuneResult
from umsearch.storage.outputs import write_output_file

SCHEMA = "umsearch.tune/1"
FILES = ("tune.json", "report.md", "profile.json", "plan.json")
"""Always written; a torch winner adds ``torchtitan.toml`` and ``schedule.csv``."""
EXPORT_FILES = ("torchtitan.toml", "schedule.csv")


def paired_ratio(a: ContenderResult, b: ContenderResult) -> dict[str, Any]:
    """``a / b`` per measured round (the same round ran both), its median and bootstrap 95% interval."""
    from umsearch.runtime.fidelity import bootstrap_median_ci

    ratios = [x / y for x, y in zip(a.measured.step_ms, b.measured.step_ms, strict=True)]
    return {"median": statistics.median(ratios), "ci95": list(bootstrap_median_ci(ratios))}


def predicted_ratio(a: ContenderResult, b: ContenderResult) -> float | None:
    """``a``'s predicted time over ``b``'s after the refit (None where either has no prediction)."""
    return a.predicted_after_ms / b.predicted_after_ms if a.predicted_after_ms and b.predicted_after_ms else None


def best_torch(contenders: tuple[ContenderResult, ...]) -> ContenderResult | None:
    """The torch schedule (its own class) that measured fastest (None: no peer ran)."""
    peers = [c for c in contenders if c.candidate.runtime == "torch"]
    return min(peers, key=lambda c: c.median_ms) if peers else None


def model_check(contenders: tuple[ContenderResult, ...], winner: ContenderResult) -> dict[str, Any] | None:
    """The model judged on the runtime it describes: the best torch schedule's own plan through PlanSchedule
    against the tuned plan (the winner, or where a torch schedule won, the fastest other plan through
    PlanSchedule), measured (paired ratio) and predicted; None where either did not run."""
    peer = best_torch(contenders)
    if peer is None:
        return None
    own = next((c for c in contenders if c.candidate.runtime == "umsearch"
                and c.candidate.plan == peer.candidate.plan), None)  # fmt: skip
    plans = [c for c in contenders if c.candidate.runtime == "umsearch" and c is not own]
    tuned = winner if winner.candidate.runtime == "umsearch" else min(plans, key=lambda c: c.median_ms, default=None)
    if own is None or tuned is None or tuned is own:
        return None
    return {"peer_plan": own.candidate.name, "tuned_plan": tuned.candidate.name,
            "measured_ratio_over_tuned": paired_ratio(own, tuned),
            "predicted_ratio_over_tuned": predicted_ratio(own, tuned)}


def verdict(result: TuneResult) -> str:
    """One plain sentence: what won, by how much, against the best torch schedule."""
    w = result.winner
    if w is None:
        return "nothing was measured"
    last = result.rounds[-1].contenders
    lo, hi = w.ci95_ms
    text = f"{w.candidate.name} measured fastest: {w.median_ms:.2f} ms [{lo:.2f}, {hi:.2f}] (95% interval)"
    if dropped := len(result.rounds[-1].over_limit):
        text += f" of the contenders that fit the memory limit ({dropped} measured over it, dropped)"
    if w.candidate.runtime == "torch":
        return (text + f" with torch's own schedule class: torch's schedule {w.candidate.schedule} is as good as or better "
                "than every plan umsearch found here; plan.json is that schedule, exported for torchtitan "
                "(torchtitan.toml) and torch's CSV (schedule.csv)")  # fmt: skip
    peer = best_torch(last)
    if peer is None:
        return text + " through PlanSchedule (no torch schedule ran)"
    r = paired_ratio(peer, w)
    return (text + f" through PlanSchedule; the best torch schedule class on the same kind of PipelineStages, "
            f"{peer.candidate.schedule}, took {r['median']:.3f}x as long [{r['ci95'][0]:.3f}, {r['ci95'][1]:.3f}]")  # fmt: skip


def document(result: TuneResult, meta: dict[str, Any]) -> dict[str, Any]:
    """``tune.json``: every round's contenders (predicted before and after the refit, measured median
    with its interval, which runtime ran it), the refits, the winner and why the loop stopped."""
    w = result.winner
    winner = None
    if w is not None:
        peer = best_torch(result.rounds[-1].contenders)
        winner = {"name": w.candidate.name, "key": w.candidate.key, "runtime": w.candidate.runtime,
                  "schedule": w.candidate.schedule, "round": len(result.rounds),
                  "measured_median_ms": w.median_ms, "measured_ci95_ms": list(w.ci95_ms),
                  "predicted_ms": w.predicted_after_ms,
                  "best_torch": None if peer is None or peer is w else {
                      "schedule": peer.candidate.schedule, "measured_median_ms": peer.median_ms,
                      "measured_ci95_ms": list(peer.ci95_ms), "predicted_ms": peer.predicted_after_ms,
                      "measured_ratio_over_winner": paired_ratio(peer, w),
                      "predicted_ratio_over_winner": predicted_ratio(peer, w)},
                  "model_check": model_check(result.rounds[-1].contenders, w)}  # fmt: skip
    calibration = result.profile.runtime.calibration or {}
    return {"schema": SCHEMA, **meta, "stopped": result.stopped, "interrupted": result.interrupted,
            "wall_s": result.wall_s, "verdict": verdict(result), "winner": winner,
            "held_out_mape_percent": calibration.get("held_out_mape_percent"),
            "timing": "measured: barrier to the end of the optimizer step, slowest rank, median over rotated rounds; "
                      "predicted: the reference simulator's iteration time",
            "memory": "measured peak per rank, one warm-up iteration: the tally of parameters, gradients, optimizer "
                      "states and saved tensors on CPU, the allocator's peak on CUDA; a contender over the memory "
                      "limit on any rank is dropped from its round (over_memory_limit)",
            "rounds": [{"index": r.index + 1, "wall_s": r.wall_s, "fastest": r.fastest.candidate.name,
                        "contenders": [c.to_json() for c in r.contenders],
                        "over_memory_limit": [o.to_json() for o in r.over_limit],
                        "refit": None if r.refit is None else {k: v for k, v in r.refit.items() if k != "probe_rows"}}
                       for r in result.rounds]}  # fmt: skip


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def report_md(result: TuneResult, meta: dict[str, Any]) -> str:
    """``report.md``: the verdict, then per round a table of every contender."""
    lines = ["# umsearch tune", "", f"Profile `{meta.get('profile')}`; {meta.get('ranks')} ranks, "
             f"B = {meta.get('global_batch')}, seed {meta.get('seed')}.", "", f"**{verdict(result)}.**", "",
             f"The loop stopped because {result.stopped} after {len(result.rounds)} round(s) "
             f"({result.wall_s / 60:.1f} min)."]  # fmt: skip
    held = (result.profile.runtime.calibration or {}).get("held_out_mape_percent")
    if held is not None:
        lines += ["", f"Held-out error of the refitted model: {held:.1f}% (each plan measured through PlanSchedule "
                      "predicted by a fit of the others): expect about that error on a prediction."]  # fmt: skip
    lines += ["", "Measured: barrier to the end of the optimizer step, slowest rank, median of the rotated rounds "
              "with a bootstrap 95% interval. Predicted: the simulator under the profile the round searched on "
              "(before) and refitted on what ran through PlanSchedule (after); torch's schedule classes are compared "
              "against, never fitted. Every contender ran on torch's PipelineStage objects in the same processes."]  # fmt: skip
    check = model_check(result.rounds[-1].contenders, result.winner) if result.winner is not None else None
    if check is not None:
        r = check["measured_ratio_over_tuned"]
        pred = check["predicted_ratio_over_tuned"]
        lines += ["", f"Model check on the runtime it describes: {check['peer_plan']} took {r['median']:.3f}x "
                      f"{check['tuned_plan']}'s time [{r['ci95'][0]:.3f}, {r['ci95'][1]:.3f}]; predicted "
                      f"{'-' if pred is None else f'{pred:.3f}x'}."]  # fmt: skip
    for r in result.rounds:
        lines += ["", f"## Round {r.index + 1}", "",
                  "| contender | runtime | predicted before ms | predicted after ms | measured ms | 95% interval |",
                  "|---|---|---:|---:|---:|---|"]  # fmt: skip
        for c in sorted(r.contenders, key=lambda c: c.median_ms):
            mark = " **(fastest)**" if c is r.fastest else ""
            lines.append(f"| {c.candidate.name}{mark} | {c.candidate.runtime} | {_ms(c.predicted_before_ms)} | "
                         f"{_ms(c.predicted_after_ms)} | {c.median_ms:.2f} | {c.ci95_ms[0]:.2f}-{c.ci95_ms[1]:.2f} |")  # fmt: skip
        if r.over_limit:
            lines += ["", "Dropped, over the memory limit as measured (one warm-up iteration per rank):", ""]
            lines += [f"- {o.describe()}" for o in r.over_limit]
    if result.interrupted:
        lines += ["", "Interrupted: only the rounds above were measured."]
    return "\n".join(lines) + "\n"


def _profile_text(profile: Profile) -> str:
    return json.dumps(profile.to_json(), indent=2, allow_nan=False) + "\n"


def fill(stage: Path, result: TuneResult, meta: dict[str, Any], layer_names: list[str]) -> None:
    """Write every output of a finished (or interrupted) tune with at least one round into ``stage``."""
    from umsearch.sim.reference import simulate

    w = result.winner
    assert w is not None, "a tune with no measured round writes nothing"
    text = _profile_text(result.profile)
    write_output_file(stage / "profile.json", text)
    plan = w.candidate.plan
    lo, hi = w.ci95_ms
    from umsearch.core.cost import CostModel

    runtime = "torch's own schedule class" if w.candidate.runtime == "torch" else "PlanSchedule"
    meta_doc: dict[str, Any] = {
        "profile": "profile.json", "profile_sha256": hashlib.sha256(text.encode()).hexdigest(),
        "state_factor": meta.get("state_factor", 4.0), "seed": meta.get("seed"),
        "source": f"umsearch tune: measured fastest in round {len(result.rounds)}, {w.candidate.name} on {runtime}: "
                  f"median {w.median_ms:.3f} ms, 95% interval [{lo:.3f}, {hi:.3f}] ms",
    }  # fmt: skip
    if "model_spec" in result.profile.extra:
        meta_doc["model"] = result.profile.extra["model_spec"]
    predicted = simulate(plan, CostModel(result.profile, state_factor=meta_doc["state_factor"])).predicted()
    save_document(PlanDocument(plan=plan, predicted=predicted, meta=meta_doc), stage / "plan.json")
    if w.candidate.runtime == "torch":
        from umsearch.formats.torch_csv import pipelining_csv
        from umsearch.formats.torchtitan import module_names, torchtitan_export

        export = torchtitan_export(plan, module_names(layer_names, sequential=True))
        header = (f"umsearch tune: torch's {w.candidate.schedule} measured fastest ({w.median_ms:.3f} ms, "
                  f"[{lo:.3f}, {hi:.3f}]); merge into your torchtitan train config")  # fmt: skip
        write_output_file(stage / "torchtitan.toml", export.toml(header))
        write_output_file(stage / "schedule.csv", pipelining_csv(plan.actions))
    write_output_file(stage / "tune.json", json.dumps(document(result, meta), indent=2, allow_nan=False) + "\n")
    write_output_file(stage / "report.md", report_md(result, meta))
