"""``umsearch tune``: search, measure on the machine, refit, repeat; write the plan that measured fastest."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import click
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from umsearch.cli.calibrate import _spec
from umsearch.cli.console import console, err_console
from umsearch.cli.interrupts import StopSignals
from umsearch.core.profile import load_profile


def _int_list(text: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(f"{text!r}: give integers separated by commas, e.g. 1,2",
                                 param_hint="--stages-per-rank") from None


def _table(result: Any) -> Table:
    table = Table(title=f"round {len(result.rounds)} (the last)", title_justify="left")
    for col in ("contender", "runtime", "predicted ms", "measured ms", "95% interval"):
        table.add_column(col, justify="left" if col in ("contender", "runtime") else "right")
    last = result.rounds[-1]
    for c in sorted(last.contenders, key=lambda c: c.median_ms):
        name = escape(c.candidate.name) + (" [bold](fastest)[/]" if c is last.fastest else "")
        pred = "-" if c.predicted_after_ms is None else f"{c.predicted_after_ms:.2f}"
        table.add_row(name, c.candidate.runtime, pred, f"{c.median_ms:.2f}", f"{c.ci95_ms[0]:.2f}-{c.ci95_ms[1]:.2f}")
    return table


@click.command("tune")
@click.argument("profile_path", metavar="PROFILE.json", type=click.Path(dir_okay=False))
@click.option("--ranks", type=click.IntRange(2, 64), default=2, show_default=True, help="Pipeline ranks.")
@click.option("--batch", "global_batch", type=click.IntRange(1, 1 << 20), default=32, show_default=True,
              help="Global batch B.")  # fmt: skip
@click.option("--k", "k", type=click.IntRange(1, 32), default=4, show_default=True,
              help="Distinct searched plans measured per round.")  # fmt: skip
@click.option("--rounds", "max_rounds", type=click.IntRange(1, 100), default=4, show_default=True,
              help="Most rounds of search, measure and refit.")  # fmt: skip
@click.option("--measure-rounds", type=click.IntRange(2, 10_000), default=10, show_default=True,
              help="Rotated measured rounds of every contender per round.")  # fmt: skip
@click.option("--budget-min", type=click.FloatRange(min=0, min_open=True), default=30.0, show_default=True,
              help="Wall-clock budget in minutes: no round starts that would end past it.")  # fmt: skip
@click.option("--time-budget", "search_budget_s", type=click.FloatRange(min=0, min_open=True), default=30.0,
              show_default=True, help="Seconds each round's search may take.")  # fmt: skip
@click.option("--stages-per-rank", default="1,2", show_default=True, help="Chunks a rank may hold, e.g. 1,2.")
@click.option("--memory-limit", default=None, help="Per-device limit, e.g. 16GiB (default: the search's).")
@click.option("--scales", type=click.Choice(["stage_scale", "ranges", "none"]), default="stage_scale",
              show_default=True, help="How the refit models layers run together in a stage.")  # fmt: skip
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True, help="Search and data seed.")
@click.option("--threads", type=click.IntRange(1, 1024), default=1, show_default=True, help="CPU threads per rank.")
@click.option("--warmup-steps", type=click.IntRange(0, 100), default=2, show_default=True,
              help="Unmeasured iterations of every contender before the rounds.")  # fmt: skip
@click.option("--model", default=None, help="Model to run (default: the profile's model_spec).")
@click.option("--arg", "model_args", multiple=True, help="Model argument KEY=VALUE (with --model; repeatable).")
@click.option("--trust-model-code", is_flag=True, help="Build a non-zoo model the profile names.")
@click.option("--out", default=None, type=click.Path(file_okay=False),
              help="Output folder (default results/tune/<profile name>/).")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print tune.json's summary as JSON instead of tables.")
def tune_command(profile_path: str, ranks: int, global_batch: int, k: int, max_rounds: int, measure_rounds: int,
                 budget_min: float, search_budget_s: float, stages_per_rank: str, memory_limit: str | None,
                 scales: str, seed: int, threads: int, warmup_steps: int, model: str | None,
                 model_args: tuple[str, ...], trust_model_code: bool, out: str | None, as_json: bool) -> None:  # fmt: skip
    """Search, run the K best plans and every torch schedule for real, refit, repeat; plan.json is the
    contender that MEASURED fastest (a torch schedule if one did, exported for torchtitan)."""
    from umsearch.core.errors import ModelSpecError
    from umsearch.core.output_folder import OutputFolder
    from umsearch.orchestrate.trust import trust_line
    from umsearch.orchestrate.tune import TuneConfig, stopped_by, tune_meta, tune_on_machine
    from umsearch.orchestrate.tune_output import EXPORT_FILES, FILES, fill, verdict
    from umsearch.runtime.config import LaunchConfig, RunConfig
    from umsearch.runtime.factory import spec_factory
    from umsearch.search.space import build_space

    profile = load_profile(profile_path)
    if model_args and model is None:
        raise ModelSpecError("--arg needs --model: it is an argument of the model you name")
    spec = _spec(profile, profile_path, model, model_args, trust_model_code)
    values: dict[str, Any] = {"profile": profile_path, "ranks": ranks, "global_batch": global_batch,
                              "time_budget_s": search_budget_s, "seed": seed,
                              "stages_per_rank": _int_list(stages_per_rank)}  # fmt: skip
    if memory_limit is not None:
        values["memory_limit"] = memory_limit
    space = build_space(values)
    cfg = TuneConfig(k=k, max_rounds=max_rounds, measure_rounds=measure_rounds, budget_min=budget_min,
                     scales=scales, state_factor=space.state_factor)  # type: ignore[arg-type]  # fmt: skip
    run_cfg = RunConfig(warmup_steps=warmup_steps, seed=seed, launch=LaunchConfig(threads=threads, timeout_s=600))
    target = Path(out) if out else Path("results") / "tune" / Path(profile_path).stem
    folder = OutputFolder(target, "--out", inputs=[profile_path], expected=(*FILES, *EXPORT_FILES))  # before any work
    err_console.print(trust_line(profile, profile_path), soft_wrap=True, markup=False)
    columns = (TextColumn("[bold]{task.description:<9}[/]"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[info]}"), TimeElapsedColumn())  # fmt: skip
    with StopSignals() as stops, Progress(*columns, console=err_console, disable=as_json) as bar:
        tasks: dict[int, Any] = {}

        def show(p: Any) -> None:
            if p.round not in tasks:
                tasks[p.round] = bar.add_task(f"round {p.round}", total=p.total, info="")
            bar.update(tasks[p.round], completed=p.done, info=p.phase)

        result = tune_on_machine(profile, space, spec_factory(spec, seed), cfg, run_cfg, on_progress=show)
    if result.interrupted and stops.received is not None:  # the search inside keeps only that it was stopped
        result = dataclasses.replace(result, stopped=stopped_by(stops.received))
    if not result.rounds:
        err_console.print(f"{result.stopped.split(';')[0]} before a round was measured; nothing was written",
                          markup=False)  # fmt: skip
        sys.exit(stops.exit_code(True))
    meta = tune_meta(space, cfg, run_cfg, profile_path)
    names = [lay.name for lay in profile.layers]
    written = folder.write(lambda stage: fill(stage, result, meta, names))
    if as_json:
        w = result.winner
        click.echo(json.dumps({"out": str(target), "stopped": result.stopped, "interrupted": result.interrupted,
                               "rounds": len(result.rounds), "verdict": verdict(result),
                               "winner": None if w is None else {"name": w.candidate.name, "runtime": w.candidate.runtime,
                                                                 "measured_median_ms": w.median_ms,
                                                                 "measured_ci95_ms": list(w.ci95_ms)}}))  # fmt: skip
    else:
        console.print(_table(result))
        console.print(escape(verdict(result)), soft_wrap=True)
        console.print(f"stopped: {escape(result.stopped)} ({len(result.rounds)} round(s), {result.wall_s / 60:.1f} min)")
        console.print("wrote " + escape(", ".join(p.name for p in written)) + f" into {escape(str(target))}/")
    if result.interrupted:
        err_console.print(f"{result.stopped.split(';')[0]}: kept and wrote the {len(result.rounds)} round(s) "
                          "measured before it", markup=False)  # fmt: skip
        sys.exit(stops.exit_code(True))
