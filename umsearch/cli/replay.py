"""``umsearch replay``: run one rank's actions of a plan alone, on one device, against the prediction.

What it does and what it writes: docs/replay.md; the library is
:mod:`umsearch.runtime.replay`. A plan's model runs under the same rule as
``umsearch run`` (a zoo model, one you name with ``--model``, or
``--trust-model-code``); every failure is one line, exit code 1.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from umsearch.cli.console import console, warn
from umsearch.cli.flags import rows, shared, take
from umsearch.cli.run import (
    check_runnable,
    measured_on,
    one_line_errors,
    run_state_factor,
    split_values,
)
from umsearch.core.actions import KINDS
from umsearch.core.cost import CostModel
from umsearch.core.loader import load_plan_file
from umsearch.core.options import option
from umsearch.errors import RuntimeExecutionError
from umsearch.runtime.config import FLAGS, ModelChoice

REPLAY_FILE = "replay.json"
"""What ``--out`` holds."""

_TABLE_FLAGS = ("seed", "threads", "optimizer", "lr")
"""Run settings replay takes besides the model's (:class:`~umsearch.runtime.config.ModelChoice`)."""


@dataclass(frozen=True, kw_only=True)
class ReplayFlags:
    """``replay``'s own flags (their values are checked by the command, with the way out)."""

    rank: int | None = field(default=None, metadata=option("The rank to replay [default: 0].", kind="int"))
    all_ranks: bool = field(default=False, metadata=option(
        "Replay every rank, one after the other.", kind="switch"))
    device: str = field(default="cpu", metadata=option(
        "Where the rank runs.", kind="text", metavar="cpu|cuda[:N]"))
    steps: int = field(default=3, metadata=option(
        "Iterations; the first is warm-up unless N is 1, the rest give the medians.", kind="int", metavar="N"))
    out: str | None = field(default=None, metadata=option(
        f"Write {REPLAY_FILE} into this folder; files of yours and of other commands in it are kept.",
        kind="folder", metavar="DIR"))


@click.command("replay")
@click.argument("plan_path", metavar="PLAN.json", type=click.Path(dir_okay=False))
@take(rows(ReplayFlags, "rank", "all_ranks", "device", "steps"))
@shared("as_json")
@take(rows(ReplayFlags, "out"))
@take(row for row in FLAGS if row.owner is ModelChoice or row.dest in _TABLE_FLAGS)
@one_line_errors
def replay_command(plan_path: str, rank: int | None, all_ranks: bool, device: str, steps: int, as_json: bool,
                   out: str | None, **values: Any) -> None:  # fmt: skip
    """Run one rank of PLAN.json alone (every message to it made up, every message from it dropped) and
    compare its measured busy time and memory with the prediction."""
    from umsearch.runtime.model_source import spec_factory, user_model
    from umsearch.runtime.replay import (
        check_rank,
        check_steps,
        parse_device,
        predict,
        replay_document,
        replay_rank,
        session_config,
    )
    from umsearch.storage.output_folder import OutputFolder

    if rank is not None and all_ranks:
        raise RuntimeExecutionError(f"--rank {rank} and --all-ranks both name the ranks to replay; give one of them")
    check_steps(steps)
    where = parse_device(device)
    cfg, choice, _ = split_values(values)
    loaded = load_plan_file(plan_path, profile=choice.profile, model=user_model(choice),
                            trust_model_code=choice.trust_model_code)  # fmt: skip
    check_runnable(loaded)
    plan = loaded.plan
    ranks = list(range(plan.ranks)) if all_ranks else [0 if rank is None else rank]
    for r in ranks:
        check_rank(plan, r)
    inputs: list[str | Path] = [plan_path, *([loaded.profile_path] if loaded.profile_path is not None else [])]
    folder = OutputFolder(out, "--out", command="replay", inputs=inputs, expected=[REPLAY_FILE],
                          last=(REPLAY_FILE,)) if out else None
    cfg, on = measured_on(loaded, session_config(cfg, where))
    from umsearch.runtime.config import optimizer_warning

    planned = optimizer_warning(cfg.optimizer, loaded.state_factor)
    warnings = [*on.warnings, *([planned] if planned is not None else [])]
    for line in warnings:
        warn(line)
    # The prediction's state is what the rank steps (--optimizer), as run's memory report has it.
    predictions = predict(plan, CostModel(loaded.profile, state_factor=run_state_factor(cfg))) \
        if loaded.profile is not None else None  # fmt: skip
    if predictions is None:
        warn("the plan names no profile: measured only (pass --profile PROFILE.json for the prediction)")
    spec = loaded.require_model()
    factory = spec_factory(spec, cfg.seed)
    replays = [replay_rank(plan, factory, r, device=where, cfg=cfg, steps=steps,
                           prediction=predictions[r] if predictions else None) for r in ranks]  # fmt: skip
    meta = {"plan": str(plan_path), "profile": None if loaded.profile_path is None else str(loaded.profile_path),
            "model": spec.to_json(), "device": str(where), "precision": cfg.precision or "fp32",
            "threads": cfg.launch.threads if where.type == "cpu" else None, "ranks_in_plan": plan.ranks,
            "data_parallel": plan.data_parallel, "replica_batch": plan.replica_batch,
            "state_factor": run_state_factor(cfg), "optimizer": cfg.optimizer, "warnings": warnings}  # fmt: skip
    doc = replay_document(replays, steps=steps, meta=meta)
    if folder is not None:
        from umsearch.storage.jsonio import write_json

        folder.write(lambda stage: write_json(stage / REPLAY_FILE, doc))
    if as_json:
        click.echo(json.dumps(doc))
        return
    _print(doc, out)


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def _print(doc: dict[str, Any], out: str | None) -> None:
    from rich.markup import escape
    from rich.table import Table

    from umsearch.core.units import format_bytes

    def size(x: float | None) -> str:
        return "-" if x is None else format_bytes(x)

    kinds = [k for k in KINDS if any(k in r["kinds"] for r in doc["ranks"])]
    title = (f"replay on {doc['device']} ({doc['precision']}), median of "
             f"{max(doc['steps'] - doc['warmup_steps'], 1)} iteration(s)")  # fmt: skip
    table = Table(title=escape(title), title_justify="left")
    for col in ("rank", "stages", "busy ms predicted", "busy ms measured", "ratio", *(f"{k} ratio" for k in kinds),
                "peak predicted", "peak measured", *(["device peak"] if "device_peak_bytes" in doc["ranks"][0] else [])):
        table.add_column(col, justify="right")
    for r in doc["ranks"]:
        over = r["memory_over_prediction"]
        measured_peak = size(r["measured_peak_bytes"]) + (" [yellow](over)[/]" if over else "")
        row = [str(r["rank"]), ",".join(map(str, r["stages"])), _ms(r["predicted_busy_ms"]), _ms(r["measured_busy_ms"]),
               _ratio(r["busy_ratio"]), *(_ratio(r["kind_ratios"].get(k)) for k in kinds),
               size(r["predicted_peak_bytes"]), measured_peak]  # fmt: skip
        if "device_peak_bytes" in r:
            row.append(size(r["device_peak_bytes"]))
        table.add_row(*row)
    console.print(table)
    for r in doc["ranks"]:
        m, p = r["measured_memory"], r["predicted_memory"]
        state = m["param_bytes"] + m["grad_bytes"] + m["optimizer_bytes"]
        line = f"rank {r['rank']} memory: state {size(state)}, saved activations at most {size(m['saved_peak_bytes'])}"
        if p is not None:
            line += (f" (predicted {size(p['state_bytes'])} = state_factor {doc['state_factor']:g} x parameters, "
                     f"activations {size(p['activation_peak_bytes'])})")  # fmt: skip
        console.print(escape(line))
    console.print("ratio: measured over predicted (the simulator's durations: layer times, stage scale, overheads); "
                  "peak measured: parameters, gradients, optimizer states and autograd's saved tensors "
                  "(docs/model.md section 5's terms); the prediction's state is state_factor x parameters")  # fmt: skip
    if out:
        console.print(f"wrote {REPLAY_FILE} into {escape(out)}")
