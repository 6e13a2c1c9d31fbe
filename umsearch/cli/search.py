"""``umsearch search``: the main job."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from umsearch.cli.console import console
from umsearch.cli.report import comparison_rows, comparison_table, write_outputs
from umsearch.cli.tables import stage_table
from umsearch.core.cost import CostModel
from umsearch.core.data import default_space
from umsearch.core.profile import load_profile
from umsearch.search.driver import Progress as SearchProgress
from umsearch.search.driver import run_search
from umsearch.search.space import build_space, load_space
from umsearch.sim.reference import simulate


@click.command("search")
@click.argument("space_path", metavar="[SPACE.toml]", required=False, type=click.Path(dir_okay=False))
@click.option("--profile", type=click.Path(dir_okay=False), help="Profile JSON (overrides the space's).")
@click.option("--stages", type=int, help="Pipeline stages S.")
@click.option("--batch", "global_batch", type=int, help="Global batch B.")
@click.option("--memory-limit", help="Per-device limit, e.g. 80GiB, 16GB or bytes.")
@click.option("--schedule", type=click.Choice(["any", "gpipe", "1f1b"]), help="Schedule family.")
@click.option("--seed", type=int, help="Random seed (same seed, same plan).")
@click.option("--generations", type=int, help="NSGA-II generations.")
@click.option("--time-budget", "time_budget_s", type=float, help="Stop after this many seconds.")
@click.option("--out", type=click.Path(file_okay=False), help="Output folder (default results/<space name>/).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary instead of tables.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def search_command(space_path: str | None, out: str | None, as_json: bool, quiet: bool, **flags: Any) -> None:
    """Find the fastest plan that fits the memory limit (no arguments: the bundled default space)."""
    if space_path is None and flags.get("profile") is None:
        space_path = str(default_space())
    space = load_space(space_path, flags) if space_path else build_space({k: v for k, v in flags.items() if v is not None})
    profile = load_profile(space.profile)
    with Progress(TextColumn("[bold]search[/]"), BarColumn(), TextColumn("{task.fields[info]}"),
                  TimeElapsedColumn(), console=console, disable=quiet or as_json, transient=True) as bar:  # fmt: skip
        task = bar.add_task("search", total=space.generations, info="baselines...")

        def show(p: SearchProgress) -> None:
            best = "-" if p.best_ms == float("inf") else f"{p.best_ms:.3f} ms"
            bar.update(task, completed=p.generation,
                       info=f"{p.phase}  gen {p.generation}  best {best}  feasible {p.feasible}  "
                            f"plans scored {p.evaluations}")  # fmt: skip

        result = run_search(space, profile, show)
    target = Path(out) if out else Path("results") / space.name
    paths = write_outputs(result, space, profile, target)
    if as_json:
        click.echo(json.dumps({
            "iteration_ms": result.best.iteration_ms, "peak_memory_bytes": list(result.best.peak_memory_bytes),
            "lower_bound_ms": result.lower_bound_ms, "baselines": comparison_rows(result)[1:],
            "out": str(target), "interrupted": result.interrupted, "budget_hit": result.budget_hit,
        }))  # fmt: skip
        return
    console.print(stage_table(result.best.plan, simulate(result.best.plan, CostModel(profile, state_factor=space.state_factor)),
                              [lay.name for lay in profile.layers]))  # fmt: skip
    console.print(comparison_table(result))
    if result.interrupted:
        console.print("[yellow]interrupted: wrote the best plans found so far[/]")
    if result.budget_hit:
        console.print(f"[yellow]time budget of {space.time_budget_s:g} s reached: the result may differ between "
                      "runs; raise [search] time_budget_s for a reproducible one[/]")  # fmt: skip
    console.print(f"wrote {', '.join(str(p) for p in paths.values())}")
