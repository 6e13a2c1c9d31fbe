"""The ``umsearch`` command: thin click commands over the library.

Commands live next to the code they drive and are imported only when invoked,
so ``umsearch simulate`` never pays for importing torch. Every user error is a
:class:`~umsearch.errors.UmsearchError`; :func:`main` turns it into one red
line and exit code 1 (tracebacks with ``UMSEARCH_DEBUG=1``).
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import Any

import click
from rich.markup import escape

from umsearch import __version__
from umsearch.cli.console import abort, console, debug_enabled
from umsearch.cli.flags import shared
from umsearch.errors import UmsearchError

# name -> "module:attribute" of a click.Command, imported on first use.
_LAZY_COMMANDS = {
    "search": "umsearch.cli.search:search_command",
    "profile": "umsearch.cli.profile_model:profile_command",
    "run": "umsearch.cli.run:run_command",
    "validate": "umsearch.cli.run:validate_command",
    "export": "umsearch.cli.export:export_command",
    "calibrate": "umsearch.cli.calibrate:calibrate_command",
    "compare": "umsearch.cli.compare:compare_command",
    "tune": "umsearch.cli.tune:tune_command",
    "replay": "umsearch.cli.replay:replay_command",
}


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *_LAZY_COMMANDS])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in _LAZY_COMMANDS:
            module, attr = _LAZY_COMMANDS[cmd_name].split(":")
            command = getattr(importlib.import_module(module), attr)
            assert isinstance(command, click.Command)
            return command
        return super().get_command(ctx, cmd_name)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="umsearch")
def cli() -> None:
    """Plan pipeline-parallel training with unequal microbatches.

    \b
    Typical flow:
      umsearch profile gpt --out gpt.json      measure a model
      umsearch calibrate gpt.json              fit the runtime's own costs
      umsearch search --profile gpt.json ...   find the fastest plan
      umsearch show results/x/plan.json        look at it
      umsearch run results/x/plan.json         run it for real
    """


_plan_arg = click.argument("plan_path", metavar="PLAN.json", type=click.Path(dir_okay=False))


def _stage_busy(res: Any, stages: int) -> list[float]:
    busy = [0.0] * stages
    for a in res.records:
        busy[a.stage] += a.end_ms - a.start_ms
    return busy


@cli.command("simulate")
@_plan_arg
@shared("profile", "state_factor", "as_json")
def simulate_command(plan_path: str, profile: str | None, state_factor: float | None, as_json: bool) -> None:
    """Predict iteration time and per-rank memory of PLAN.json."""
    from umsearch.cli.tables import plan_tables
    from umsearch.core.loader import load_plan_file
    from umsearch.sim.reference import simulate

    # A plan that deadlocks is taken: the command shows where it is stuck.
    loaded = load_plan_file(plan_path, profile=profile, state_factor=state_factor, require_profile=True,
                            allow_deadlock=True)  # fmt: skip
    plan = loaded.plan
    res = simulate(plan, loaded.cost())
    if as_json:
        click.echo(json.dumps({
            "iteration_ms": res.iteration_ms,
            # docs/model.md 9: the last action of any replica, and the last all-reduce (null with one replica).
            "compute_end_ms": res.compute_end_ms, "allreduce_end_ms": res.allreduce_end_ms,
            "peak_memory_bytes": None if res.peak_memory_bytes is None else list(res.peak_memory_bytes),
            "busy_ms": None if res.busy_ms is None else list(res.busy_ms),
            "stage_busy_ms": _stage_busy(res, plan.num_stages),
            "bubble_fraction": res.bubble_fraction, "deadlock": res.deadlock, "blocked": list(res.blocked),
        }))  # fmt: skip
        return
    names = [lay.name for lay in loaded.require_profile().layers]
    for table in plan_tables(plan, None if res.deadlock else res, names, console.width):
        console.print(table)
    if res.deadlock:
        console.print("[bold red]deadlock:[/] " + escape("; ".join(res.blocked)))
        console.print("reorder the stuck ranks' actions so that every input is produced before it is needed")
        return
    console.print(f"iteration time [bold]{res.iteration_ms:.3f} ms[/], bubble {res.bubble_fraction:.1%}")


@cli.command("show")
@_plan_arg
@shared("profile", "state_factor", "gantt", "trace")
def show_command(
    plan_path: str, profile: str | None, state_factor: float | None, gantt: str | None, trace: str | None
) -> None:
    """Draw the predicted timeline of PLAN.json (Gantt PNG, by default PLAN_timeline.png beside the plan;
    Chrome trace for Perfetto)."""
    from umsearch.cli.console import write_output
    from umsearch.cli.pictures import write_chrome_trace, write_gantt
    from umsearch.cli.tables import plan_tables
    from umsearch.core.loader import load_plan_file
    from umsearch.sim.reference import simulate
    from umsearch.storage.outputs import check_output_file

    gantt = str(Path(plan_path).with_name(Path(plan_path).stem + "_timeline.png")) if gantt is None else gantt
    inputs = [plan_path, *([profile] if profile else [])]
    check_output_file(gantt, "--gantt", inputs=inputs)  # before any work: a bad path is refused, a device kept
    if trace is not None:
        check_output_file(trace, "--trace", inputs=inputs)
    # A plan that deadlocks is taken: the command shows where it is stuck.
    loaded = load_plan_file(plan_path, profile=profile, state_factor=state_factor, require_profile=True,
                            allow_deadlock=True)  # fmt: skip
    plan, prof = loaded.plan, loaded.require_profile()
    res = simulate(plan, loaded.cost())
    for table in plan_tables(plan, None if res.deadlock else res, [lay.name for lay in prof.layers],
                             console.width):  # fmt: skip
        console.print(table)
    if res.deadlock:
        console.print("[bold red]deadlock:[/] " + escape("; ".join(res.blocked)) + " (drawing the actions that ran)")
    title = f"{prof.model}: predicted " + ("DEADLOCK" if res.deadlock else f"{res.iteration_ms:.2f} ms")
    if plan.data_parallel > 1:
        title += f", replica {res.replica} of {plan.data_parallel} (the slowest) with its all-reduces"
    write_output(gantt, "--gantt", lambda p: write_gantt(res.records, plan.ranks, p, title=title,
                                                         allreduces=res.allreduces))  # fmt: skip
    console.print("Gantt chart: " + escape(gantt), soft_wrap=True)
    if trace is not None:
        write_output(trace, "--trace", lambda p: write_chrome_trace(res.records, p, source="predicted",
                                                                    metadata={"plan": str(plan_path)},
                                                                    allreduces=res.allreduces))  # fmt: skip
        console.print("Chrome trace: " + escape(trace) + " (open in https://ui.perfetto.dev or chrome://tracing)",
                      soft_wrap=True)  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the CLI, turning domain errors into one red line and exit 1."""
    from umsearch.cli.interrupts import exit_code

    try:
        cli.main(args=argv, prog_name="umsearch", standalone_mode=False)
    except click.exceptions.Abort as exc:  # click turns a KeyboardInterrupt (a signal) into Abort
        abort("interrupted" if exc.__context__ is not None else "aborted", exit_code(exc))
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except UmsearchError as exc:
        if debug_enabled():
            raise
        abort(str(exc))
    except KeyboardInterrupt as exc:
        abort("interrupted", exit_code(exc))
