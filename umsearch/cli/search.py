"""``umsearch search``: the main job."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
from rich.markup import escape

from umsearch.cli.console import console
from umsearch.cli.flags import rows, shared, take
from umsearch.cli.interrupts import StopSignals
from umsearch.cli.options import click_options
from umsearch.cli.progress import Reporter
from umsearch.cli.report import (
    comparison_rows,
    comparison_table,
    output_folder,
    summary_line,
    write_outputs,
)
from umsearch.core.bundled import default_space
from umsearch.core.field_checks import MAX_INT
from umsearch.core.options import int_at_least, option
from umsearch.core.profile import check_not_partial, load_profile
from umsearch.search.driver import Progress as SearchProgress
from umsearch.search.driver import SearchResult, run_search
from umsearch.search.space import build_space, cluster_values, load_space, options, space_settings


@dataclass(frozen=True, kw_only=True)
class SearchFlags:
    """``search``'s own flags, beside the search-space keys."""

    stages: int | None = field(default=None, metadata=option(
        "Alias of --ranks (version 1 spaces called the devices stages).", kind="int"))
    cluster_path: str | None = field(default=None, metadata=option(
        "TOML file with a [cluster] table (nodes, gpus_per_node, intra, inter): plan R x D on all its devices; its "
        "keys override the space's, the --nodes/--gpus-per-node/--intra/--inter flags override both.",
        kind="path", flag="--cluster"))
    out: str | None = field(default=None, metadata=option(
        "Output folder (default results/<space name>/); files of yours and of other commands in it are kept.",
        kind="folder"))
    pick: int = field(default=0, metadata=option(
        "Which Pareto point to write as plan.json (0: the fastest; report.md lists them).", kind="int",
        bounds=(0, MAX_INT), parse=int_at_least(0, "--pick")))
    allow_partial: bool = field(default=False, metadata=option(
        "Search on a partial profile (one whose measurement was interrupted).", kind="switch"))


def space_flags(command: Callable[..., Any]) -> Callable[..., Any]:
    """Every search-space key as a flag (overriding the TOML: unset unless given), plus ``--stages``."""
    command = take(rows(SearchFlags, "stages"))(command)
    keys = {o["dest"]: o["key"] for o in options()}
    return click_options(space_settings(), help_suffix=lambda row: f" ({keys[row.dest]})")(command)


@click.command("search")
@click.argument("space_path", metavar="[SPACE.toml]", required=False, type=click.Path(dir_okay=False))
@space_flags
@take(rows(SearchFlags, "cluster_path", "out", "pick"))
@shared("as_json", "quiet")
@take(rows(SearchFlags, "allow_partial"))
@shared("progress")
def search_command(space_path: str | None, cluster_path: str | None, out: str | None, pick: int, as_json: bool,
                   quiet: bool, allow_partial: bool, progress: str, **flags: Any) -> None:  # fmt: skip
    """Find the fastest plan that fits the memory limit (no arguments: the bundled default space)."""
    if space_path is None and flags.get("profile") is None:
        space_path = str(default_space())
    values = cluster_values(cluster_path) if cluster_path else {}
    values.update({k: v for k, v in flags.items() if v is not None})
    space = load_space(space_path, values) if space_path else build_space(values)
    # An empty --out is a mistake, not a request for the default folder.
    folder = output_folder(Path("results") / space.name if out is None else out, space, space_path)
    profile = load_profile(space.profile)
    check_not_partial(profile, allow_partial, space.profile)
    with StopSignals() as stops:
        result = _run(space, profile, Reporter(progress, "search", quiet=quiet or as_json))
    paths = write_outputs(result, space, profile, folder, pick)
    target = folder.path
    if as_json:
        click.echo(json.dumps({
            "iteration_ms": result.best.iteration_ms, "peak_memory_bytes": list(result.best.peak_memory_bytes),
            "lower_bound_ms": result.lower_bound_ms, "baselines": comparison_rows(result)[1:], "out": str(target),
            "interrupted": result.interrupted, "budget_hit": result.budget_hit, **_cluster_json(result),
        }))  # fmt: skip
    else:
        _print(result, space, profile, quiet, paths)
    if result.interrupted:
        sys.exit(stops.exit_code(True))


def _cluster_json(result: SearchResult) -> dict[str, Any]:
    """With a cluster: what the search chose and what it pruned."""
    plan = result.best.plan
    if not result.factorizations:
        return {}
    return {"ranks": plan.ranks, "data_parallel": plan.data_parallel, "layout": plan.layout, "zero1": plan.zero1,
            "pruned": [{"factorization": p.factorization.label, "reason": p.reason} for p in result.pruned]}  # fmt: skip


def _run(space: Any, profile: Any, reporter: Reporter) -> SearchResult:
    """The search, its progress shown by ``reporter``: one phase (bar) per search phase."""
    with reporter as shown:

        def show(p: SearchProgress) -> None:
            best = "-" if p.best_ms == float("inf") else f"{p.best_ms:.3f} ms"
            shown.update(p.done, p.total, p.phase, info=f"best {best} · scored {p.evaluations}", phase=p.phase)

        return run_search(space, profile, show)


def _print(result: SearchResult, space: Any, profile: Any, quiet: bool, paths: dict[str, Path]) -> None:
    budget = space.search.time_budget_s
    if not quiet:
        from umsearch.cli.tables import plan_tables
        from umsearch.core.cost import CostModel
        from umsearch.sim.reference import simulate

        sim = simulate(result.best.plan, CostModel(profile, state_factor=space.state_factor))
        for table in plan_tables(result.best.plan, sim, [lay.name for lay in profile.layers], console.width):
            console.print(table)
        console.print(comparison_table(result))
    if result.factorizations:
        plan = result.best.plan
        console.print(escape(f"chose R = {plan.ranks} x D = {plan.data_parallel}, layout {plan.layout}, zero1 "
                             f"{'on' if plan.zero1 else 'off'}; "
                             f"{sum(o.searched for o in result.factorizations)} of {len(result.factorizations)} "
                             f"factorizations searched, {len(result.pruned)} pruned"
                             + (" (report.md says why)" if result.pruned else "")))  # fmt: skip
    console.print(escape(summary_line(result)))
    if result.interrupted:
        console.print("[yellow]interrupted: wrote the best plans found so far[/]")
    if result.budget_hit:
        console.print(f"[yellow]time budget of {budget:g} s reached: the result may differ between runs; raise "
                      "[search] time_budget_s for a reproducible one[/]")  # fmt: skip
    folder = next(iter(paths.values())).parent
    names = ", ".join(p.name + ("/" if not p.suffix else "") for p in paths.values())
    console.print(f"wrote {escape(names)} into {escape(str(folder))}/")
