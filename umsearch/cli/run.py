"""``umsearch run`` (execute a plan on one local torchrun process per stage) and ``umsearch validate``
(predicted vs. measured iteration time)."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path
from typing import Any

import click

from umsearch.cli.console import console, err_console
from umsearch.core.cost import CostModel
from umsearch.core.errors import PlanError, RuntimeExecutionError
from umsearch.core.plan import Plan, load_plan, resolve_profile_path
from umsearch.core.profile import file_sha256, load_profile
from umsearch.runtime.config import LaunchConfig, RunConfig
from umsearch.runtime.launch import ENTRY_MODULE
from umsearch.runtime.model import ModelFactory, plan_model_spec, spec_factory
from umsearch.runtime.preflight import preflight

_RUN = RunConfig()
_LAUNCH = LaunchConfig()


def plan_profile_path(plan: Plan, plan_path: str, profile_path: str | None) -> Path | None:
    """``--profile``, else the plan's own profile if that file exists; None when there is none."""
    if profile_path:
        return Path(profile_path)
    prof = resolve_profile_path(plan, plan_path)
    return prof if prof is not None and prof.exists() else None


def plan_cost(plan: Plan, prof: Path | None) -> CostModel | None:
    """The cost model of profile ``prof``, checked to describe as many layers as the plan covers."""
    if prof is None:
        return None
    profile = load_profile(prof)
    covered = plan.stages[-1].hi
    if profile.num_layers != covered:
        raise PlanError(
            f"the plan covers layers [0, {covered}) but the profile {prof} has {profile.num_layers} layers; "
            "pass --profile with the profile the plan was searched on"
        )
    return CostModel(profile)


def usable_cpus() -> int:
    """Cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def run_warnings(plan: Plan, prof: Path | None, cfg: RunConfig, cpus: int | None = None) -> list[str]:
    """What makes measured times (or the prediction they are compared with) untrustworthy."""
    out = []
    recorded = plan.meta.get("profile_sha256")
    if prof is not None and isinstance(recorded, str) and file_sha256(prof) != recorded:
        out.append(f"the profile {prof} is not the one the plan was searched on (its sha256 differs from the "
                   "plan's profile_sha256); the prediction is for another measurement")  # fmt: skip
    lc = cfg.launch
    cpus = usable_cpus() if cpus is None else cpus
    if lc.backend == "gloo" and plan.num_stages * (lc.threads or 1) > cpus:
        out.append(f"{plan.num_stages} stages x {lc.threads or 1} thread(s) need "
                   f"{plan.num_stages * (lc.threads or 1)} cores but {cpus} are available: ranks share "
                   "cores, so measured times include contention the model does not have")  # fmt: skip
    return out


def _warn(lines: list[str]) -> None:
    for line in lines:
        err_console.print(f"[bold yellow]warning:[/] {line}", soft_wrap=True)


def entry_argv(plan_path: str, cfg: RunConfig) -> list[str]:
    """The entry point's arguments for ``plan_path``: the same locally and on a cluster."""
    return ["-m", ENTRY_MODULE, plan_path, *cfg.to_argv()]


def launch_text(plan_path: str, plan: Plan, cfg: RunConfig, nproc_per_node: int) -> str:
    """The torchrun command (and environment) that runs ``plan`` on a cluster."""
    S = plan.num_stages
    nnodes = -(-S // nproc_per_node)
    if nnodes * nproc_per_node != S:
        raise PlanError(f"{S} stages do not fill {nnodes} node(s) of {nproc_per_node} process(es); "
                        f"pick --nproc-per-node dividing {S}")  # fmt: skip
    be = cfg.launch.backend
    cmd = ["torchrun", f"--nnodes={nnodes}", f"--nproc-per-node={nproc_per_node}", "--node-rank=$NODE_RANK",
           "--master-addr=$MASTER_ADDR", "--master-port=29500",
           *[shlex.quote(a) for a in entry_argv(plan_path, cfg)]]  # fmt: skip
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
    click.option("--steps", type=click.IntRange(min=1), default=_RUN.steps, show_default=True,
                 help="Iterations to run."),
    click.option("--warmup-steps", type=click.IntRange(min=0), default=_RUN.warmup_steps, show_default=True,
                 help="Leading iterations left out of the median and the spread."),
    click.option("--backend", type=click.Choice(["gloo", "nccl"]), default=_LAUNCH.backend, show_default=True,
                 help="gloo: CPU processes; nccl: one GPU per stage (cuda:local_rank)."),
    click.option("--seed", type=int, default=_RUN.seed, show_default=True, help="Seed of weights and batches."),
    click.option("--lr", type=float, default=_RUN.lr, show_default=True, help="SGD learning rate."),
    click.option("--threads", type=click.IntRange(min=1), default=_LAUNCH.threads, show_default=True,
                 help="torch threads per process (CPU); each process is pinned to its own cores when there are enough."),
    click.option("--timeout", "timeout_s", type=click.FloatRange(min=0, min_open=True), default=_LAUNCH.timeout_s,
                 show_default=True, help="Seconds a rank may wait for a peer (every link) before the run fails."),
    click.option("--profile", "profile_path", type=click.Path(dir_okay=False), default=None,
                 help="Profile for the prediction (default: the one the plan names)."),
]  # fmt: skip


def _with_common(f: Any) -> Any:
    for opt in reversed(_common):
        f = opt(f)
    return f


def _config(steps: int, warmup_steps: int, backend: str, seed: int, lr: float, threads: int,
            timeout_s: float) -> RunConfig:  # fmt: skip
    return RunConfig(steps=steps, warmup_steps=warmup_steps, seed=seed, lr=lr,
                     launch=LaunchConfig(backend=backend, threads=threads, timeout_s=timeout_s))  # fmt: skip


def _model(plan: Plan, plan_path: str, seed: int) -> tuple[dict[str, Any], ModelFactory]:
    spec = plan_model_spec(plan, plan_path)
    return spec, spec_factory(spec, seed)


@click.command("run")
@click.argument("plan_path", metavar="PLAN.json", type=click.Path(dir_okay=False))
@_with_common
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
@click.option("--trace", type=click.Path(dir_okay=False), default=None,
              help="Write the measured timeline (median iteration) as Chrome-trace JSON here.")  # fmt: skip
@click.option("--print-launch", is_flag=True, help="Print the torchrun command for a cluster and exit.")
@click.option("--nproc-per-node", type=click.IntRange(min=1), default=None,
              help="Processes (GPUs) per node in the --print-launch command [default: 1].")  # fmt: skip
def run_command(plan_path: str, steps: int, warmup_steps: int, backend: str, seed: int, lr: float, threads: int,
                timeout_s: float, profile_path: str | None, as_json: bool, trace: str | None, print_launch: bool,
                nproc_per_node: int | None) -> None:  # fmt: skip
    """Train PLAN.json's model for a few iterations, one local torchrun process per stage, and time it."""
    from umsearch.runtime.run import run_plan_file

    plan = load_plan(plan_path)
    if nproc_per_node is not None and not print_launch:
        raise RuntimeExecutionError(
            f"--nproc-per-node {nproc_per_node} only shapes the --print-launch command; a local run starts one "
            f"process per stage ({plan.num_stages} here): drop it or add --print-launch"
        )
    cfg = _config(steps, warmup_steps, backend, seed, lr, threads, timeout_s)
    spec, factory = _model(plan, plan_path, seed)
    prof = plan_profile_path(plan, plan_path, profile_path)
    cost = plan_cost(plan, prof)
    # One simulation: it refuses a deadlocking plan and, with a profile, is the prediction.
    sim = preflight(plan, factory, cost)
    if print_launch:
        click.echo(launch_text(plan_path, plan, cfg, nproc_per_node or 1))
        return
    _warn(run_warnings(plan, prof, cfg))
    result = run_plan_file(plan_path, plan.num_stages, cfg)
    predicted = sim.iteration_ms if cost is not None else (plan.predicted or {}).get("iteration_ms")
    median_step = result.median_step(warmup_steps)
    quartiles = result.quartiles_ms(warmup_steps)
    if trace:
        from umsearch.cli.pictures import write_chrome_trace

        write_chrome_trace(median_step.ops, trace, source="measured",
                           metadata={"plan": str(plan_path), "iteration_ms": median_step.iteration_ms})  # fmt: skip
    if as_json:
        click.echo(json.dumps({
            "plan": str(plan_path), "model": spec, "backend": backend, "steps": _step_rows(result),
            "warmup_steps": warmup_steps, "median_iteration_ms": median_step.iteration_ms,
            "quartiles_ms": list(quartiles), "predicted_iteration_ms": predicted, "trace": trace,
        }))  # fmt: skip
        return
    _print_run(result, median_step.iteration_ms, quartiles, warmup_steps, predicted, trace)


def _print_run(result: Any, median: float, quartiles: tuple[float, float], skip: int, predicted: float | None,
               trace: str | None) -> None:  # fmt: skip
    from rich.table import Table

    table = Table(title="measured iterations", title_justify="left")
    for col in ("step", "iteration ms", "with optimizer ms", "loss"):
        table.add_column(col, justify="right")
    for i, s in enumerate(result.steps):
        loss = "-" if s.loss is None else f"{s.loss:.6f}"
        table.add_row(str(i), f"{s.iteration_ms:.3f}", f"{s.step_ms:.3f}", loss)
    console.print(table)
    kept = len(result.kept(skip))
    line = (f"median iteration [bold]{median:.3f} ms[/], IQR {quartiles[0]:.3f}-{quartiles[1]:.3f} ms "
            f"(of the last {kept} step(s))")  # fmt: skip
    if predicted is not None:
        line += f"; predicted {predicted:.3f} ms ({(predicted - median) / median:+.1%})"
    console.print(line)
    if trace:
        console.print(f"Chrome trace of the median iteration: {trace} (open in https://ui.perfetto.dev or chrome://tracing)")


@click.command("validate")
@click.argument("plan_paths", metavar="PLAN.json...", nargs=-1, required=True, type=click.Path(dir_okay=False))
@_with_common
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="Write the comparison JSON here.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
def validate_command(plan_paths: tuple[str, ...], steps: int, warmup_steps: int, backend: str, seed: int, lr: float,
                     threads: int, timeout_s: float, profile_path: str | None, out: str | None,
                     as_json: bool) -> None:  # fmt: skip
    """Run each PLAN.json for real and compare its iteration time with the simulator's prediction."""
    from umsearch.runtime.fidelity import mape, measure_plan

    cfg = _config(steps, warmup_steps, backend, seed, lr, threads, timeout_s)
    rows = []
    warned: set[str] = set()
    for path in plan_paths:
        plan = load_plan(path)
        prof = plan_profile_path(plan, path, profile_path)
        cost = plan_cost(plan, prof)
        if cost is None:
            raise PlanError(f"{path}: no profile to predict with; pass --profile PROFILE.json")
        fresh = [w for w in run_warnings(plan, prof, cfg) if w not in warned]
        _warn(fresh)
        warned.update(fresh)
        rows.append(measure_plan(path, plan, cost, _model(plan, path, seed)[1], cfg))
    error = mape(rows)
    doc = {"schema": "umsearch.fidelity/1", "mape_percent": error, "warmup_steps": warmup_steps,
           "steps": steps, "backend": backend, "threads": threads, "cpus": usable_cpus(),
           "plans": [r.to_json() for r in rows]}  # fmt: skip
    if out:
        from umsearch.core.jsonio import write_json

        write_json(out, doc)
    if as_json:
        click.echo(json.dumps(doc))
        return
    _print_fidelity(rows, error, out)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.1%}"


def _print_fidelity(rows: list[Any], mape_percent: float, out: str | None) -> None:
    from rich.table import Table

    table = Table(title="predicted vs measured", title_justify="left")
    for col in ("plan", "predicted ms", "measured ms", "IQR ms", "error", "busy error"):
        table.add_column(col, justify="left" if col == "plan" else "right")
    for r in rows:
        q1, q3 = r.measured_quartiles_ms
        table.add_row(r.name, f"{r.predicted_ms:.3f}", f"{r.measured_ms:.3f}", f"{q1:.3f}-{q3:.3f}", _pct(r.error),
                      " ".join(_pct(e) for e in r.busy_error))  # fmt: skip
    console.print(table)
    console.print("busy error: per stage, predicted vs measured compute time (the cost model alone); "
                  "the rest of the iteration error is communication and waiting")  # fmt: skip
    console.print(f"MAPE [bold]{mape_percent:.1f}%[/]" + (f"; written to {out}" if out else ""))
