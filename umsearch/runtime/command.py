"""``umsearch run`` (execute a plan on one local process per stage) and ``umsearch validate``
(predicted vs. measured iteration time)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import click

from umsearch.console import console
from umsearch.cost_model import CostModel
from umsearch.errors import PlanError
from umsearch.plan import Plan, load_plan, resolve_profile_path
from umsearch.profile import load_profile
from umsearch.runtime.config import RunConfig
from umsearch.runtime.launch import LaunchConfig
from umsearch.runtime.model import plan_model_spec, spec_factory
from umsearch.runtime.preflight import check_deadlock


def _plan_cost(plan: Plan, plan_path: str, profile_path: str | None) -> CostModel | None:
    """The cost model of the plan's profile (or ``--profile``), None when there is none."""
    prof = Path(profile_path) if profile_path else resolve_profile_path(plan, plan_path)
    if prof is None or (profile_path is None and not prof.exists()):
        return None
    return CostModel(load_profile(prof))


def launch_text(plan_path: str, plan: Plan, cfg: RunConfig, nproc_per_node: int) -> str:
    """The torchrun command (and environment) that runs ``plan`` on a cluster."""
    S = plan.num_stages
    nnodes = -(-S // nproc_per_node)
    if nnodes * nproc_per_node != S:
        raise PlanError(f"{S} stages do not fill {nnodes} node(s) of {nproc_per_node} process(es); "
                        f"pick --nproc-per-node dividing {S}")  # fmt: skip
    be = cfg.launch.backend
    cmd = [
        "torchrun", f"--nnodes={nnodes}", f"--nproc-per-node={nproc_per_node}", "--node-rank=$NODE_RANK",
        "--master-addr=$MASTER_ADDR", "--master-port=29500", "-m", "umsearch.runtime.worker",
        shlex.quote(plan_path), f"--steps={cfg.steps}", f"--seed={cfg.seed}", f"--lr={cfg.lr}",
        f"--backend={be}", f"--timeout={cfg.launch.timeout_s:g}",
    ]  # fmt: skip
    if cfg.launch.threads is not None:
        cmd.append(f"--threads={cfg.launch.threads}")
    lines = [
        f"# {S} stages: {nnodes} node(s) x {nproc_per_node} process(es); stage s runs on global rank s,",
        "# i.e. node s // nproc-per-node, " + ("GPU cuda:(s % nproc-per-node)." if be == "nccl" else "CPU."),
        "# On every node, with the same plan file and umsearch installed:",
        f"export MASTER_ADDR=<host of node 0>  NODE_RANK=<0..{nnodes - 1}>",
    ]
    if be == "gloo":
        lines.append(f"export OMP_NUM_THREADS={cfg.launch.threads or 1}")
    return "\n".join([*lines, " ".join(cmd)])


def _step_rows(result: Any) -> list[dict[str, Any]]:
    return [
        {"step": i, "iteration_ms": s.iteration_ms, "step_ms": s.step_ms, "loss": s.loss}
        for i, s in enumerate(result.steps)
    ]


_common = [
    click.option("--steps", type=click.IntRange(min=1), default=5, show_default=True, help="Iterations to run."),
    click.option("--backend", type=click.Choice(["gloo", "nccl"]), default="gloo", show_default=True,
                 help="gloo: CPU processes; nccl: one GPU per stage (cuda:local_rank)."),
    click.option("--seed", type=int, default=0, show_default=True, help="Seed of weights and batches."),
    click.option("--lr", type=float, default=0.01, show_default=True, help="SGD learning rate."),
    click.option("--threads", type=click.IntRange(min=1), default=1, show_default=True,
                 help="torch threads per process (CPU)."),
    click.option("--timeout", "timeout_s", type=float, default=300.0, show_default=True,
                 help="Seconds a rank may wait for a peer before the run fails."),
    click.option("--profile", "profile_path", type=click.Path(dir_okay=False), default=None,
                 help="Profile for the prediction (default: the one the plan names)."),
]  # fmt: skip


def _with_common(f: Any) -> Any:
    for opt in reversed(_common):
        f = opt(f)
    return f


def _config(steps: int, backend: str, seed: int, lr: float, threads: int, timeout_s: float) -> RunConfig:
    return RunConfig(steps=steps, seed=seed, lr=lr,
                     launch=LaunchConfig(backend=backend, threads=threads, timeout_s=timeout_s))  # fmt: skip


@click.command("run")
@click.argument("plan_path", metavar="PLAN.json", type=click.Path(dir_okay=False))
@_with_common
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
@click.option("--trace", type=click.Path(dir_okay=False), default=None,
              help="Write the measured timeline (median iteration) as Chrome-trace JSON here.")  # fmt: skip
@click.option("--print-launch", is_flag=True, help="Print the torchrun command for a cluster and exit.")
@click.option("--nproc-per-node", type=click.IntRange(min=1), default=1, show_default=True,
              help="Processes (GPUs) per node for --print-launch.")  # fmt: skip
def run_command(plan_path: str, steps: int, backend: str, seed: int, lr: float, threads: int, timeout_s: float,
                profile_path: str | None, as_json: bool, trace: str | None, print_launch: bool,
                nproc_per_node: int) -> None:  # fmt: skip
    """Train PLAN.json's model for a few iterations, one local process per stage, and time it."""
    from umsearch.runtime.run import run_plan
    from umsearch.simulator import simulate

    plan = load_plan(plan_path)
    cfg = _config(steps, backend, seed, lr, threads, timeout_s)
    cost = _plan_cost(plan, plan_path, profile_path)
    check_deadlock(plan, cost)
    spec = plan_model_spec(plan, plan_path)
    if print_launch:
        click.echo(launch_text(plan_path, plan, cfg, nproc_per_node))
        return
    result = run_plan(plan, spec_factory(spec, seed), cfg, cost)
    predicted = simulate(plan, cost).iteration_ms if cost is not None else None
    if predicted is None and plan.predicted is not None:
        predicted = plan.predicted.get("iteration_ms")
    median = result.median_iteration_ms()
    if trace:
        from umsearch.viz import write_chrome_trace

        write_chrome_trace(result.median_step().ops, trace, source="measured",
                           metadata={"plan": str(plan_path), "iteration_ms": result.median_step().iteration_ms})  # fmt: skip
    if as_json:
        click.echo(json.dumps({
            "plan": str(plan_path), "model": spec, "backend": backend, "steps": _step_rows(result),
            "median_iteration_ms": median, "predicted_iteration_ms": predicted, "trace": trace,
        }))  # fmt: skip
        return
    _print_run(result, median, predicted, trace)


def _print_run(result: Any, median: float, predicted: float | None, trace: str | None) -> None:
    from rich.table import Table

    table = Table(title="measured iterations", title_justify="left")
    for col in ("step", "iteration ms", "with optimizer ms", "loss"):
        table.add_column(col, justify="right")
    for i, s in enumerate(result.steps):
        loss = "-" if s.loss is None else f"{s.loss:.6f}"
        table.add_row(str(i), f"{s.iteration_ms:.3f}", f"{s.step_ms:.3f}", loss)
    console.print(table)
    line = f"median iteration [bold]{median:.3f} ms[/] (first step left out as warm-up)"
    if predicted is not None:
        line += f", predicted {predicted:.3f} ms ({(predicted - median) / median:+.1%})"
    console.print(line)
    if trace:
        console.print(f"Chrome trace: {trace} (open in https://ui.perfetto.dev or chrome://tracing)")


@click.command("validate")
@click.argument("plan_paths", metavar="PLAN.json...", nargs=-1, required=True, type=click.Path(dir_okay=False))
@_with_common
@click.option("--warmup-steps", type=click.IntRange(min=0), default=1, show_default=True,
              help="Leading iterations left out of the median.")  # fmt: skip
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="Write the comparison JSON here.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
def validate_command(plan_paths: tuple[str, ...], steps: int, backend: str, seed: int, lr: float, threads: int,
                     timeout_s: float, profile_path: str | None, warmup_steps: int, out: str | None,
                     as_json: bool) -> None:  # fmt: skip
    """Run each PLAN.json for real and compare its iteration time with the simulator's prediction."""
    from umsearch.runtime.fidelity import mape, measure_plan

    cfg = _config(steps, backend, seed, lr, threads, timeout_s)
    rows = []
    for path in plan_paths:
        plan = load_plan(path)
        cost = _plan_cost(plan, path, profile_path)
        if cost is None:
            raise PlanError(f"{path}: no profile to predict with; pass --profile PROFILE.json")
        rows.append(measure_plan(path, plan, cost, spec_factory(plan_model_spec(plan, path), seed), cfg,
                                 warmup_steps))  # fmt: skip
    error = mape(rows)
    doc = {"schema": "umsearch.fidelity/1", "mape_percent": error, "warmup_steps": warmup_steps,
           "steps": steps, "backend": backend, "threads": threads, "plans": [r.to_json() for r in rows]}  # fmt: skip
    if out:
        from umsearch.jsonio import write_json

        write_json(out, doc)
    if as_json:
        click.echo(json.dumps(doc))
        return
    _print_fidelity(rows, error, out)


def _print_fidelity(rows: list[Any], mape_percent: float, out: str | None) -> None:
    from rich.table import Table

    table = Table(title="predicted vs measured", title_justify="left")
    for col in ("plan", "predicted ms", "measured ms", "error"):
        table.add_column(col, justify="left" if col == "plan" else "right")
    for r in rows:
        table.add_row(r.name, f"{r.predicted_ms:.3f}", f"{r.measured_ms:.3f}", f"{r.error:+.1%}")
    console.print(table)
    console.print(f"MAPE [bold]{mape_percent:.1f}%[/]" + (f"; written to {out}" if out else ""))

