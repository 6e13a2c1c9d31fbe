"""The ``umsearch`` command: thin click commands over the library.

Commands live next to the code they drive and are imported only when invoked,
so ``umsearch simulate`` never pays for importing torch. Every user error is a
:class:`~umsearch.core.errors.UmsearchError`; :func:`main` turns it into one red
line and exit code 1 (tracebacks with ``UMSEARCH_DEBUG=1``).
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import click

from umsearch import __version__
from umsearch.cli.console import abort, console, debug_enabled
from umsearch.core.errors import PlanError, UmsearchError

# name -> "module:attribute" of a click.Command, imported on first use.
_LAZY_COMMANDS = {
    "search": "umsearch.cli.search:search_command",
    "profile": "umsearch.cli.profile:profile_command",
    "run": "umsearch.cli.run:run_command",
    "validate": "umsearch.cli.run:validate_command",
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
      umsearch search --profile gpt.json ...   find the fastest plan
      umsearch show results/x/plan.json        look at it
      umsearch run results/x/plan.json         run it for real
    """


def _load(plan_path: str, profile_path: str | None, state_factor: float | None):  # type: ignore[no-untyped-def]
    """Plan, its profile and a cost model; the plan's own profile unless overridden."""
    from umsearch.core.cost import CostModel
    from umsearch.core.plan import load_plan, resolve_profile_path
    from umsearch.core.profile import load_profile

    plan = load_plan(plan_path)
    prof = Path(profile_path) if profile_path else resolve_profile_path(plan, plan_path)
    if prof is None:
        raise PlanError(f"{plan_path}: the plan names no profile; pass --profile PROFILE.json")
    profile = load_profile(prof)
    from umsearch.core.plan import validate_plan

    try:
        validate_plan(plan, profile.num_layers)
    except PlanError as exc:
        raise PlanError(f"{plan_path} does not fit profile {prof}: {exc}") from None
    factor = state_factor if state_factor is not None else float(plan.meta.get("state_factor", 4.0))
    return plan, profile, CostModel(profile, state_factor=factor)


_plan_arg = click.argument("plan_path", metavar="PLAN.json", type=click.Path(dir_okay=False))
_profile_opt = click.option("--profile", "profile_path", type=click.Path(dir_okay=False),
                            help="Profile to cost the plan with (default: the one the plan names).")  # fmt: skip
_factor_opt = click.option("--state-factor", type=float, default=None,
                           help="Bytes of state per parameter byte (default: the plan's, else 4).")  # fmt: skip


@cli.command("simulate")
@_plan_arg
@_profile_opt
@_factor_opt
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
def simulate_command(plan_path: str, profile_path: str | None, state_factor: float | None, as_json: bool) -> None:
    """Predict iteration time and per-stage memory of PLAN.json."""
    from umsearch.cli.tables import stage_table
    from umsearch.sim.reference import simulate

    plan, profile, cost = _load(plan_path, profile_path, state_factor)
    res = simulate(plan, cost)
    if as_json:
        out = {
            "iteration_ms": res.iteration_ms,
            "peak_memory_bytes": list(res.peak_memory_bytes),
            "deadlock": res.deadlock,
            "stage_busy_ms": list(res.busy_ms),
            "bubble_fraction": res.bubble_fraction,
            "blocked": list(res.blocked),
        }
        click.echo(json.dumps(out))
        return
    console.print(stage_table(plan, res, [lay.name for lay in profile.layers]))
    if res.deadlock:
        console.print("[bold red]deadlock:[/] " + "; ".join(res.blocked))
        console.print("raise the warmup of the stuck stages or align their microbatches with the neighbour's")
        return
    console.print(f"iteration time [bold]{res.iteration_ms:.3f} ms[/], bubble {res.bubble_fraction:.1%}")


@cli.command("show")
@_plan_arg
@_profile_opt
@_factor_opt
@click.option("--gantt", type=click.Path(dir_okay=False), default=None, help="Write a Gantt chart PNG here.")
@click.option("--trace", type=click.Path(dir_okay=False), default=None, help="Write a Chrome-trace JSON here.")
def show_command(
    plan_path: str, profile_path: str | None, state_factor: float | None, gantt: str | None, trace: str | None
) -> None:
    """Draw the predicted timeline of PLAN.json (Gantt PNG, Chrome trace for Perfetto)."""
    from umsearch.cli.pictures import write_chrome_trace, write_gantt
    from umsearch.cli.tables import stage_table
    from umsearch.sim.reference import simulate

    plan, profile, cost = _load(plan_path, profile_path, state_factor)
    res = simulate(plan, cost)
    console.print(stage_table(plan, res, [lay.name for lay in profile.layers]))
    if res.deadlock:
        console.print("[bold red]deadlock:[/] " + "; ".join(res.blocked) + " (drawing the ops that ran)")
    gantt = gantt or str(Path(plan_path).with_name(Path(plan_path).stem + "_timeline.png"))
    title = f"{profile.model}: predicted " + ("DEADLOCK" if res.deadlock else f"{res.iteration_ms:.2f} ms")
    write_gantt(res.ops, plan.num_stages, gantt, title=title)
    console.print(f"Gantt chart: {gantt}")
    if trace:
        write_chrome_trace(res.ops, trace, source="predicted", metadata={"plan": str(plan_path)})
        console.print(f"Chrome trace: {trace} (open in https://ui.perfetto.dev or chrome://tracing)")


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the CLI, turning domain errors into one red line and exit 1."""
    try:
        cli.main(args=argv, prog_name="umsearch", standalone_mode=False)
    except click.exceptions.Abort:
        abort("aborted", 130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except UmsearchError as exc:
        if debug_enabled():
            raise
        abort(str(exc))
    except KeyboardInterrupt:
        abort("interrupted", 130)
