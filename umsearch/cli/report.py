"""Write a search's outputs: plan, Pareto front, baselines, report and pictures (all atomic)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.table import Table

from umsearch.cli.pictures import write_chrome_trace, write_gantt, write_pareto
from umsearch.cli.tables import format_bytes
from umsearch.core.cost import CostModel
from umsearch.core.jsonio import write_json, write_text_atomic
from umsearch.core.plan import Plan, save_plan
from umsearch.core.profile import Profile, file_sha256
from umsearch.search.driver import SearchResult
from umsearch.search.scoring import Scored
from umsearch.search.space import SearchSpace
from umsearch.sim.reference import SimResult, simulate

PARETO_SCHEMA = "umsearch.pareto/1"
BASELINES_SCHEMA = "umsearch.baselines/1"


def comparison_rows(result: SearchResult) -> list[dict[str, Any]]:
    """The plan and each baseline: time, speedup of the plan over it, memory."""
    rows = [{"name": "umsearch", "iteration_ms": result.best.iteration_ms, "speedup": 1.0,
             "peak_memory_bytes": result.best.max_memory, "method": "NSGA-II + local search"}]  # fmt: skip
    for name, b in result.baselines.items():
        rows.append({
            "name": name, "method": b.method if b else "no plan fits the memory limit",
            "iteration_ms": b.iteration_ms if b else None,
            "speedup": b.iteration_ms / result.best.iteration_ms if b else None,
            "peak_memory_bytes": b.max_memory if b else None,
        })  # fmt: skip
    return rows


def _cells(row: dict[str, Any]) -> list[str]:
    """Display cells of one comparison row: name, time, speedup, memory, method."""
    t = "-" if row["iteration_ms"] is None else f"{row['iteration_ms']:.3f}"
    sp = "-" if row["speedup"] is None else f"{row['speedup']:.3f}x"
    mem = "-" if row["peak_memory_bytes"] is None else format_bytes(row["peak_memory_bytes"])
    return [row["name"], t, sp, mem, row["method"]]


def comparison_table(result: SearchResult) -> Table:
    table = Table(title="plan vs baselines (same cost model)", title_justify="left")
    for col in ("plan", "iteration ms", "umsearch speedup", "peak memory", "how"):
        table.add_column(col, justify="left" if col in ("plan", "how") else "right")
    for r in comparison_rows(result):
        table.add_row(*_cells(r))
    gap = result.best.iteration_ms / result.lower_bound_ms - 1
    table.caption = f"lower bound {result.lower_bound_ms:.3f} ms; plan is {gap:.1%} above it"
    return table


def _plan_with_meta(s: Scored, space: SearchSpace, profile: Profile, profile_path: Path, res: SimResult) -> Plan:
    meta: dict[str, Any] = {"profile_sha256": file_sha256(profile_path), "search_space": space.to_json(),
                            "seed": space.seed, "state_factor": space.state_factor}  # fmt: skip
    if "model_spec" in profile.extra:
        meta["model"] = profile.extra["model_spec"]
    return Plan(global_batch=s.plan.global_batch, stages=s.plan.stages, predicted=res.predicted(),
                profile=str(profile_path.resolve()), meta=meta)  # fmt: skip


def write_outputs(result: SearchResult, space: SearchSpace, profile: Profile, out: Path) -> dict[str, Path]:
    """Write every output file under ``out``; returns name -> path."""
    profile_path = Path(space.profile)
    cost = CostModel(profile, state_factor=space.state_factor)
    sim = simulate(result.best.plan, cost)
    plan = _plan_with_meta(result.best, space, profile, profile_path, sim)
    paths = {"plan": save_plan(plan, out / "plan.json")}
    paths["pareto"] = write_json(out / "pareto.json", {
        "schema": PARETO_SCHEMA,
        "plans": [{"iteration_ms": s.iteration_ms, "peak_memory_bytes": list(s.peak_memory_bytes),
                   "plan": s.plan.to_json()} for s in result.pareto],
    })  # fmt: skip
    rows = comparison_rows(result)
    paths["baselines"] = write_json(out / "baselines.json", {
        "schema": BASELINES_SCHEMA, "lower_bound_ms": result.lower_bound_ms, "rows": rows,
        "baseline_plans": {k: (v.plan.to_json() if v else None) for k, v in result.baselines.items()},
    })  # fmt: skip
    lines = [f"# umsearch plan: {space.name}", "",
             f"Profile `{profile_path}` ({profile.model}, {profile.device}); S={space.stages}, "
             f"B={space.global_batch}, memory limit {format_bytes(space.memory_limit)}, seed {space.seed}.", "",
             "| plan | iteration ms | umsearch speedup | peak memory | how |", "|---|---:|---:|---:|---|"]  # fmt: skip
    for r in rows:
        lines.append("| " + " | ".join(_cells(r)) + " |")
    gap = result.best.iteration_ms / result.lower_bound_ms - 1
    lines += ["", f"Lower bound {result.lower_bound_ms:.3f} ms; the plan is {gap:.1%} above it.",
              f"Search: {result.generations} NSGA-II generations and local polish, {result.evaluations} plans "
              f"scored in {result.wall_s:.1f} s" + (" (interrupted)" if result.interrupted else "")
              + (" (stopped by the time budget)" if result.budget_hit else "") + "."]  # fmt: skip
    paths["report"] = write_text_atomic(out / "report.md", "\n".join(lines) + "\n")
    front = [(s.iteration_ms, s.max_memory) for s in result.pareto]
    marks = {k: (v.iteration_ms, v.max_memory) for k, v in result.baselines.items() if v is not None}
    paths["pareto_png"] = write_pareto(front, marks, out / "pareto.png", memory_limit=space.memory_limit,
                                       chosen=front[0], title=f"{space.name}: time vs memory")  # fmt: skip
    paths["timeline"] = write_gantt(sim.ops, plan.num_stages, out / "timeline.png",
                                    title=f"{space.name}: predicted {sim.iteration_ms:.2f} ms")  # fmt: skip
    paths["trace"] = write_chrome_trace(sim.ops, out / "trace.json", source="predicted")
    return paths
