"""``umsearch export``: a plan as files other trainers read (torch's schedule CSV, torchtitan settings)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
from rich.markup import escape

from umsearch.cli.console import console, write_output
from umsearch.core.errors import PlanError
from umsearch.core.jsonio import write_text_atomic
from umsearch.core.loader import LoadedPlan, load_plan_file
from umsearch.core.plan import Plan, document_from_json

FORMATS = ("pipelining-csv", "torchtitan")


def _csv(plan: Plan) -> str:
    from umsearch.core.export import pipelining_csv

    if not plan.equal_microbatches or len(set(plan.stages[0].forward)) != 1:
        raise PlanError("the plan has unequal microbatches; torch.distributed.pipelining splits the batch into equal "
                        "ones, so only umsearch's runtime can run it (umsearch run PLAN)")  # fmt: skip
    try:
        return pipelining_csv(plan.actions)
    except ValueError as exc:
        raise PlanError(f"{exc}; export a plan with equal microbatches on every stage") from None


def _make(folder: Path, flag_value: str) -> None:
    """Create the output folder, only once there is something to write into it."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PlanError(f"--out {flag_value!r} cannot be created: {exc.strerror}; choose another folder") from None


def best_equal_baseline(plan_path: Path) -> tuple[str, Plan, float] | None:
    """The fastest baseline with equal microbatches in the ``baselines.json`` beside a searched plan."""
    path = plan_path.with_name("baselines.json")
    if not path.is_file():
        return None
    from umsearch.core.jsonio import read_json

    doc = read_json(path, "baselines", PlanError)
    if not isinstance(doc, dict):
        return None
    best: tuple[str, Plan, float] | None = None
    for name, raw in (doc.get("baseline_plans") or {}).items():
        if raw is None:
            continue
        d = document_from_json(raw)
        t = (d.predicted or {}).get("iteration_ms")
        if d.plan.equal_microbatches and isinstance(t, (int, float)) and (best is None or t < best[2]):
            best = (name, d.plan, float(t))
    return best


def _torchtitan(loaded: LoadedPlan, out: Path, plan_path: Path) -> list[str]:
    from umsearch.core.torchtitan import module_names, torchtitan_export

    plan, notes = loaded.plan, []
    if not plan.equal_microbatches:
        found = best_equal_baseline(plan_path)
        if found is None:
            raise PlanError(f"{plan_path} has unequal microbatches, which torchtitan cannot run, and no "
                            "baselines.json lies beside it; export a search's output folder plan, or run it "
                            "with umsearch run")  # fmt: skip
        name, plan, t = found
        mine = (loaded.document.predicted or {}).get("iteration_ms")
        gain = f"{t / mine - 1:.1%} faster than" if isinstance(mine, (int, float)) and mine > 0 else "unlike"
        notes.append(f"exported the best equal plan ({name}, predicted {t:.3f} ms); the unequal plan is predicted "
                     f"{gain} it and needs umsearch's runtime (umsearch run)")  # fmt: skip
    if loaded.profile is None:
        raise PlanError(f"{plan_path}: torchtitan needs the layers' module names, from the profile; pass --profile")
    sequential = loaded.model is not None and loaded.model.is_zoo
    modules = module_names([lay.name for lay in loaded.profile.layers], sequential)
    exp = torchtitan_export(plan, modules)
    _make(out, str(out))
    header = (f"torchtitan settings written by umsearch export from {plan_path}\n"
              "merge these sections into your train config (or pass them as --parallelism.* flags)")  # fmt: skip
    write_output(str(out / "torchtitan.toml"), "--out", lambda p: write_text_atomic(p, exp.toml(header)))
    files = [str(out / "torchtitan.toml")]
    if exp.csv is not None:
        write_output(str(out / "schedule.csv"), "--out", lambda p: write_text_atomic(p, exp.csv or ""))
        files.append(str(out / "schedule.csv"))
        notes.append("the order is none of torch's named schedules: torchtitan runs schedule.csv "
                     "(give its path in pipeline_parallel_schedule_csv)")  # fmt: skip
    if sequential:
        notes.append("module names are the zoo model's nn.Sequential indices (0, 1, ...)")
    return files + notes


@click.command("export")
@click.argument("plan_path", metavar="PLAN.json", type=click.Path(dir_okay=False))
@click.option("--format", "fmt", type=click.Choice(FORMATS), required=True,
              help="pipelining-csv: torch's compute-only schedule CSV; torchtitan: [parallelism] settings.")  # fmt: skip
@click.option("--out", type=click.Path(), required=True,
              help="Folder to write into (pipelining-csv: or a FILE.csv to write).")  # fmt: skip
@click.option("--profile", "profile_path", type=click.Path(dir_okay=False),
              help="Profile of the plan's model (default: the one the plan names).")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print the files written as JSON.")
def export_command(plan_path: str, fmt: str, out: str, profile_path: str | None, as_json: bool) -> None:
    """Write PLAN.json in a form torch.distributed.pipelining or torchtitan runs."""
    loaded = load_plan_file(plan_path, profile=profile_path)
    target = Path(out)
    as_file = fmt == "pipelining-csv" and target.suffix == ".csv"
    folder = target.parent if as_file else target
    lines: list[str]
    if fmt == "pipelining-csv":
        text = _csv(loaded.plan)
        _make(folder, out)
        csv_path = target if as_file else folder / "schedule.csv"
        write_output(str(csv_path), "--out", lambda p: write_text_atomic(p, text))
        lines = [str(csv_path), f"load it with schedule._load_csv(path) on a _PipelineScheduleRuntime "
                 f"of n_microbatches={len(loaded.plan.stages[0].forward)}"]  # fmt: skip
    else:
        lines = _torchtitan(loaded, folder, Path(plan_path))
    files = [x for x in lines if x.startswith(str(folder))]
    if as_json:
        click.echo(json.dumps({"files": files, "notes": [x for x in lines if x not in files]}))
        return
    _print(files, [x for x in lines if x not in files])


def _print(files: list[str], notes: list[Any]) -> None:
    for f in files:
        console.print("wrote " + escape(f), soft_wrap=True)
    for n in notes:
        console.print(escape(n), soft_wrap=True)
