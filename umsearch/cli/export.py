"""``umsearch export``: a plan as files other trainers read (torch's schedule CSV, torchtitan settings).

Into a folder, export writes as every command does
(:class:`~umsearch.storage.output_folder.OutputFolder`): it replaces only files
it proves an export of the same format wrote there, never an input (the plan,
its profile, the baselines beside it) and never a file of the user's or of
another command. An explicit ``--out FILE.csv`` is replaced atomically.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.markup import escape

from umsearch.cli.console import console, write_output
from umsearch.cli.flags import rows, shared, take
from umsearch.core.loader import LoadedPlan, load_plan_file
from umsearch.core.options import option
from umsearch.core.plan import Plan
from umsearch.errors import PlanError
from umsearch.storage.jsonio import write_text_atomic
from umsearch.storage.outputs import check_output_dir, check_output_file

if TYPE_CHECKING:
    from umsearch.formats.torchtitan import TorchtitanExport
    from umsearch.storage.output_folder import OutputFolder

FORMATS = ("pipelining-csv", "torchtitan")
CSV_FILE = "schedule.csv"
TOML_FILE = "torchtitan.toml"
Files = dict[str, str]
"""Output name in the folder -> its text."""


def _names(fmt: str) -> list[str]:
    """Every name an export of ``fmt`` may write into its folder."""
    from umsearch.formats.torchtitan import PLAN_FILE, RECIPE_FILE

    return [CSV_FILE] if fmt == "pipelining-csv" else [TOML_FILE, PLAN_FILE, RECIPE_FILE, CSV_FILE]


def _csv(plan: Plan) -> str:
    from umsearch.formats.torch_csv import pipelining_csv

    if not plan.equal_microbatches or len(set(plan.stages[0].forward)) != 1:
        raise PlanError("the plan has unequal microbatches; torch.distributed.pipelining splits the batch into equal "
                        "ones, so only umsearch's runtime can run it (umsearch run PLAN); for torch, export one of "
                        "the baselines/NAME.json a search writes beside its plan")  # fmt: skip
    try:
        return pipelining_csv(plan.actions)
    except ValueError as exc:
        raise PlanError(f"{exc}; export a plan with equal microbatches on every stage") from None


def _expressed(plan: Plan, modules: list[str]) -> TorchtitanExport:
    from umsearch.formats.torchtitan import torchtitan_export

    return torchtitan_export(plan, modules)


def _fallback(loaded: LoadedPlan, plan_path: Path, modules: list[str],
              why: PlanError) -> tuple[TorchtitanExport, str] | PlanError:  # fmt: skip
    """The fastest baseline beside the plan that torchtitan can run, each checked against the plan first.

    Times are the simulator's under the plan's profile, not the file's claims.
    Returns the reason (with the way out) when there is none; raises when the baselines file is malformed or
    none of its baselines fits the plan (the file is wrong).
    """
    from umsearch.formats.baselines_file import BASELINES_FILE, checked_baselines
    from umsearch.sim.reference import simulate

    path = plan_path.with_name(BASELINES_FILE)
    if not os.path.lexists(path):  # anything else there (a FIFO, a folder, a link) is refused by its reader
        return PlanError(f"{plan_path} cannot be expressed in torchtitan ({why}), and no {BASELINES_FILE} lies "
                         "beside it to take a baseline from; export a search's output folder plan, or run it with "
                         "umsearch run")  # fmt: skip
    usable, refused = checked_baselines(path, loaded.plan)
    cost = loaded.cost()
    times = [(simulate(b.plan, cost).iteration_ms, b) for b in usable]
    timed = sorted(((t, b) for t, b in times if t is not None and t > 0), key=lambda tb: tb[0])
    for t, b in timed:
        try:
            exp = _expressed(b.plan, modules)
        except PlanError:
            continue
        mine = simulate(loaded.plan, cost).iteration_ms
        gain = f"predicted {t / mine - 1:.1%} faster than it" if mine else "not comparable with it (it deadlocks)"
        note = (f"{plan_path} cannot be expressed in torchtitan ({why}); exported instead the fastest baseline "
                f"torchtitan can run, {b.name} (predicted {t:.3f} ms); the plan itself is {gain} and runs with "
                "umsearch run")  # fmt: skip
        return exp, note
    skipped = f" (ignored: {'; '.join(refused[:3])})" if refused else ""
    none = PlanError(f"{plan_path} cannot be expressed in torchtitan ({why}), and no baseline in {path} can "
                     f"either{skipped}; run the plan with umsearch run")  # fmt: skip
    if refused and not usable:
        raise none  # the baselines file beside the plan is wrong: say so rather than work around it
    return none


def _torchtitan(loaded: LoadedPlan, plan_path: Path) -> tuple[Files, list[str]]:
    """The torchtitan export's files and the notes for the user."""
    from umsearch.formats.torchtitan import module_names

    if loaded.profile is None:
        raise PlanError(f"{plan_path}: torchtitan needs the layers' module names, from the profile; pass --profile")
    sequential = loaded.model is not None and loaded.model.is_zoo
    modules = module_names([lay.name for lay in loaded.profile.layers], sequential)
    notes: list[str] = []
    try:
        exp = _expressed(loaded.plan, modules)
    except PlanError as why:
        found = _fallback(loaded, plan_path, modules, why)
        if isinstance(found, PlanError):
            # Stock torchtitan settings cannot carry the plan, but PlanSchedule can: the recipe alone.
            files = _recipe(loaded.plan, modules, plan_path, notes)
            if not files:
                raise found from None
            return files, [f"no {TOML_FILE}: {found}", *notes]
        exp, note = found
        notes.append(note)
    notes.extend(exp.notes)  # data-parallel replicas: what torchtitan runs instead
    header = (f"torchtitan settings written by umsearch export from {plan_path}\n"
              "merge these sections into your train config (or pass them as --parallelism.* flags)")  # fmt: skip
    files = {TOML_FILE: exp.toml(header), **_recipe(loaded.plan, modules, plan_path, notes)}
    if exp.csv is not None:
        files[CSV_FILE] = exp.csv
        notes.append(f"the order is none of torch's named schedules: torchtitan runs {CSV_FILE} "
                     "(give its path in pipeline_parallel_schedule_csv)")  # fmt: skip
    if sequential:
        notes.append("module names are the zoo model's nn.Sequential indices (0, 1, ...)")
    return files, notes


@dataclass(frozen=True, kw_only=True)
class ExportFlags:
    """``export``'s own flags."""

    fmt: str = field(metadata=option(
        "pipelining-csv: torch's compute-only schedule CSV; torchtitan: [parallelism] settings and the "
        "PlanSchedule recipe.", kind="choice", choices=FORMATS, flag="--format", dest="fmt"))
    out: str = field(metadata=option(
        "Folder to write into (files of yours and of other commands in it are kept); pipelining-csv: or a "
        "FILE.csv to write.", kind="text", metavar="DIR|FILE.csv"))


@click.command("export")
@click.argument("plan_path", metavar="PLAN.json", type=click.Path(dir_okay=False))
@take(rows(ExportFlags))
@shared("profile", "as_json")
def export_command(plan_path: str, fmt: str, out: str, profile: str | None, as_json: bool) -> None:
    """Write PLAN.json in a form torch.distributed.pipelining or torchtitan runs."""
    target = Path(out)
    as_file = fmt == "pipelining-csv" and target.suffix == ".csv"
    # Before any work: a bad path is refused, a device never replaced, an input never written over.
    inputs = [plan_path, *([profile] if profile else [])]
    if as_file:
        check_output_file(out, "--out", inputs=inputs)
    else:
        check_output_dir(out, "--out")
    loaded = load_plan_file(plan_path, profile=profile, allow_missing_profile=True)
    folder = None if as_file else _folder(target, fmt, [*inputs, *_read_beside(loaded)])
    notes = list(loaded.notes)
    if fmt == "pipelining-csv":
        files = {CSV_FILE: _csv(loaded.plan)}
        notes.append(f"load it with schedule._load_csv(path) on a _PipelineScheduleRuntime of "
                     f"n_microbatches={len(loaded.plan.stages[0].forward)}")  # fmt: skip
    else:
        files, more = _torchtitan(loaded, Path(plan_path))
        notes += more
    written = _write(files, target, folder)
    if as_json:
        click.echo(json.dumps({"files": written, "notes": notes}))
        return
    _print(written, notes)


def _read_beside(loaded: LoadedPlan) -> list[str | Path]:
    """The other files the export read: the plan's profile and the baselines beside the plan."""
    from umsearch.formats.baselines_file import BASELINES_FILE

    return [p for p in (loaded.profile_path, loaded.path.with_name(BASELINES_FILE)) if p is not None]


def _folder(target: Path, fmt: str, inputs: list[Any]) -> OutputFolder:
    """The ``--out`` folder, checked before the export is computed: every name it may write, every input."""
    from umsearch.storage.output_folder import OutputFolder

    return OutputFolder(target, "--out", command=f"export-{fmt}", inputs=inputs, expected=_names(fmt), last=())


def _write(files: Files, target: Path, folder: OutputFolder | None) -> list[str]:
    """Write ``files``: the one file at ``target`` (no folder), else into ``folder`` under its rules; the paths."""
    if folder is None:
        text = files[CSV_FILE]
        write_output(str(target), "--out", lambda p: write_text_atomic(p, text))
        return [str(target)]

    def fill(stage: Path) -> None:
        for name, text in files.items():
            (stage / name).write_text(text, encoding="utf-8")

    return [str(p) for p in folder.write(fill)]


def _recipe(plan: Plan, modules: list[str], plan_path: Path, notes: list[str]) -> Files:
    """The plan itself and the PlanSchedule recipe that runs it in torchtitan (none, with a note why, where
    torchtitan cannot place the plan's stages)."""
    from umsearch.formats.torchtitan import PLAN_FILE, RECIPE_FILE, plan_schedule_recipe

    try:
        recipe = plan_schedule_recipe(plan, modules, str(plan_path))
    except PlanError as why:
        notes.append(f"no {RECIPE_FILE}: {why}")
        return {}
    notes.append(f"to run the plan itself in torchtitan, build its schedule with {RECIPE_FILE}'s "
                 "build_plan_schedule(stages, loss_fn) (umsearch.pipelining.PlanSchedule; see docs/torchtitan.md)")
    return {PLAN_FILE: json.dumps(plan.to_json(), indent=1) + "\n", RECIPE_FILE: recipe}


def _print(files: list[str], notes: list[Any]) -> None:
    for f in files:
        console.print("wrote " + escape(f), soft_wrap=True)
    for n in notes:
        console.print(escape(n), soft_wrap=True)
