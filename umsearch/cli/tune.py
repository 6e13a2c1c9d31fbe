"""``umsearch tune``: search, measure on the machine, refit, repeat; write the plan that measured fastest."""

from __future__ import annotations

import dataclasses
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
from rich.markup import escape
from rich.table import Table

from umsearch.cli.calibrate import _spec
from umsearch.cli.console import console, err_console
from umsearch.cli.flags import rows, shared, take
from umsearch.cli.interrupts import StopSignals
from umsearch.cli.options import click_options
from umsearch.cli.progress import Reporter
from umsearch.cli.run import split_values
from umsearch.core.options import option, settings
from umsearch.core.profile import check_not_partial, load_profile
from umsearch.orchestrate.tune import TuneConfig
from umsearch.runtime.config import FLAGS
from umsearch.search.space import build_space, space_settings


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


_SPACE_KEYS = ("ranks", "global_batch", "memory_limit", "stages_per_rank", "time_budget_s", "seed")
"""The search-space keys tune takes as flags (the same flags, bounds and help as ``search``'s)."""
_SPACE_DEFAULTS = {"ranks": 2, "global_batch": 32}
"""Tune needs no space TOML: these stand in for its required keys."""
_RUN_KEYS = ("threads", "warmup_steps", "model", "model_args", "trust_model_code")
"""The run settings tune takes as flags (``run``'s); its seed is the search's."""


@dataclass(frozen=True, kw_only=True)
class TuneFlags:
    """``tune``'s own flags, beside its knobs (:class:`~umsearch.orchestrate.tune.TuneConfig`)."""

    out: str | None = field(default=None, metadata=option(
        "Output folder (default results/tune/<profile name>/); files of yours and of other commands in it are "
        "kept.", kind="folder"))


@click.command("tune")
@click.argument("profile_path", metavar="PROFILE.json", type=click.Path(dir_okay=False))
@click_options(space_settings(_SPACE_KEYS), defaults=_SPACE_DEFAULTS,
               help_suffix=lambda row: " (the search's, each round)")  # fmt: skip
@click_options(settings(TuneConfig), use_field_defaults=True)
@click_options([row for row in FLAGS if row.dest in _RUN_KEYS], use_field_defaults=True)
@take(rows(TuneFlags))
@shared("as_json", "progress")
def tune_command(profile_path: str, out: str | None, as_json: bool, progress: str, **values: Any) -> None:
    """Search, run the K best plans and every torch schedule for real, refit, repeat; plan.json is the
    contender that MEASURED fastest (a torch schedule if one did, exported for torchtitan)."""
    from umsearch.errors import ModelSpecError
    from umsearch.orchestrate.held_out import trust_line
    from umsearch.orchestrate.tune import stopped_by, tune_meta, tune_on_machine
    from umsearch.orchestrate.tune_output import EXPORT_FILES, FILES, fill, verdict
    from umsearch.runtime.model_source import spec_factory
    from umsearch.storage.output_folder import OutputFolder

    space_values = {"profile": profile_path, **{k: values.pop(k) for k in _SPACE_KEYS if values.get(k) is not None}}
    for k in _SPACE_KEYS:
        values.pop(k, None)
    space = build_space(space_values)
    run, choice, rest = split_values(values)
    cfg = TuneConfig(**rest, state_factor=space.state_factor, memory_limit=space.memory_limit)  # every flag checked before any file is read
    if choice.model_args and choice.model is None:
        raise ModelSpecError("--arg needs --model: it is an argument of the model you name")
    profile = load_profile(profile_path)
    check_not_partial(profile, False, profile_path, flag=None)  # calibrated and tuned only when whole
    spec = _spec(profile, profile_path, choice.model, choice.model_args, choice.trust_model_code)
    seed = space.search.seed
    run_cfg = dataclasses.replace(run, seed=seed, launch=dataclasses.replace(run.launch, timeout_s=600))
    target = Path(out) if out else Path("results") / "tune" / Path(profile_path).stem
    # Before any work: a file of the user's or of another command under a name tune writes stops it here.
    folder = OutputFolder(target, "--out", command="tune", inputs=[profile_path], expected=(*FILES, *EXPORT_FILES))
    err_console.print(trust_line(profile, profile_path), soft_wrap=True, markup=False)
    shown = Reporter(progress, "tune", quiet=as_json, transient=False)
    with StopSignals() as stops, shown:

        def show(p: Any) -> None:  # a round's steps: search, measure, refit (``phase`` is the one now under way)
            shown.update(p.done, p.total, f"round {p.round} of at most {p.rounds}", info=p.phase,
                         phase=f"round {p.round}")  # fmt: skip

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
        for o in result.rounds[-1].over_limit:
            console.print("dropped: " + escape(o.describe()), soft_wrap=True)
        console.print(escape(verdict(result)), soft_wrap=True)
        console.print(f"stopped: {escape(result.stopped)} ({len(result.rounds)} round(s), {result.wall_s / 60:.1f} min)")
        console.print("wrote " + escape(", ".join(p.name for p in written)) + f" into {escape(str(target))}/")
    if result.interrupted:
        err_console.print(f"{result.stopped.split(';')[0]}: kept and wrote the {len(result.rounds)} round(s) "
                          "measured before it", markup=False)  # fmt: skip
        sys.exit(stops.exit_code(True))
