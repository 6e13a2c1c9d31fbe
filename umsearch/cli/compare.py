"""``umsearch compare``: several plans side by side under their profiles, one table and one picture."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
from rich.markup import escape
from rich.table import Table

from umsearch.cli.console import console, write_output
from umsearch.cli.flags import shared
from umsearch.core.units import format_bytes
from umsearch.errors import PlanError
from umsearch.storage.outputs import check_output_file


def compare_rows(paths: tuple[str, ...], profile: str | None) -> list[dict[str, Any]]:
    """Per plan: predicted time, memory per rank, bubble, structure, speedup over the slowest-first
    baseline (the first plan given)."""
    from umsearch.core.loader import load_plan_file
    from umsearch.sim.reference import simulate

    rows: list[dict[str, Any]] = []
    for path in paths:
        loaded = load_plan_file(path, profile=profile, require_profile=True)
        plan = loaded.plan
        res = simulate(plan, loaded.cost())
        rows.append({"plan": path, "ranks": plan.ranks, "stages": plan.num_stages,
                     "microbatches": sorted({len(st.forward) for st in plan.stages}),
                     "equal": plan.equal_microbatches, "split": any(plan.uses_split),
                     "iteration_ms": res.iteration_ms, "bubble_fraction": res.bubble_fraction,
                     "peak_memory_bytes": None if res.peak_memory_bytes is None else list(res.peak_memory_bytes),
                     "deadlock": res.deadlock, "blocked": list(res.blocked), "_records": res.records})  # fmt: skip
    base = rows[0]["iteration_ms"]
    for r in rows:
        r["speedup_over_first"] = base / r["iteration_ms"] if base and r["iteration_ms"] else None
    return rows


def _table(rows: list[dict[str, Any]]) -> Table:
    table = Table(title="plans (predicted)", title_justify="left", pad_edge=False)
    for col in ("#", "plan", "RxS", "mb", "ms", "vs #0", "bubble", "max mem"):
        table.add_column(col, justify="left" if col in ("plan", "mb") else "right", no_wrap=True,
                         overflow="ellipsis", min_width=6 if col == "plan" else None)  # fmt: skip
    stems = [Path(r["plan"]).stem for r in rows]
    for i, r in enumerate(rows):
        label = stems[i] if stems.count(stems[i]) == 1 else r["plan"]
        mb = "/".join(map(str, r["microbatches"])) + ("" if r["equal"] else " uneq") + (" IW" if r["split"] else "")
        table.add_row(str(i), escape(label), f"{r['ranks']}x{r['stages']}", mb,
                      "deadlock" if r["deadlock"] else f"{r['iteration_ms']:.3f}",
                      "-" if r["speedup_over_first"] is None else f"{r['speedup_over_first']:.3f}x",
                      "-" if r["bubble_fraction"] is None else f"{r['bubble_fraction']:.1%}",
                      "-" if r["peak_memory_bytes"] is None else format_bytes(max(r["peak_memory_bytes"])))  # fmt: skip
    return table


@click.command("compare")
@click.argument("plan_paths", metavar="PLAN.json...", nargs=-1, required=True, type=click.Path(dir_okay=False))
@shared("profile", "gantt", "as_json")
def compare_command(plan_paths: tuple[str, ...], profile: str | None, gantt: str | None, as_json: bool) -> None:
    """Predicted time, memory per rank, bubble and speedup of several plans side by side (--profile costs
    every plan, else each its own; --gantt draws one panel per plan on a shared time axis)."""
    if len(plan_paths) > 32:
        raise PlanError(f"{len(plan_paths)} plans: compare at most 32 at once")
    if gantt is not None:
        check_output_file(gantt, "--gantt", inputs=plan_paths)  # before any work: a bad path refused, a device kept
    rows = compare_rows(plan_paths, profile)
    if gantt is not None:
        from umsearch.cli.pictures import write_gantts

        panels = [(f"#{i} {r['plan']}: " + ("DEADLOCK" if r["deadlock"] else f"{r['iteration_ms']:.2f} ms"),
                   r["_records"], r["ranks"]) for i, r in enumerate(rows)]  # fmt: skip
        write_output(gantt, "--gantt", lambda p: write_gantts(panels, p))
    public = [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows]
    if as_json:
        click.echo(json.dumps({"plans": public, "gantt": gantt}))
        return
    console.print(_table(rows))
    console.print("RxS: ranks x stages; mb: microbatches per stage (uneq: unequal lists, IW: split backwards); "
                  "ms: predicted iteration; vs #0: speedup over plan #0")  # fmt: skip
    if gantt is not None:
        console.print("timelines: " + escape(gantt))
