"""``umsearch run`` (execute a plan on one local torchrun process per rank) and ``umsearch validate``
(predicted vs. measured iteration time, several plans in one set of processes).

Run settings are the flag table of :mod:`umsearch.runtime.config`; the click
options here are generated from it, as are the torchrun entry point's flags
and the command ``--print-launch`` prints, so the three cannot disagree.

Neither command lets a data file choose code: a plan's (or profile's) model
runs only when it is a zoo model, when the user names it with ``--model``, or
with ``--trust-model-code`` (:func:`umsearch.runtime.model_source.require_trusted`);
``--print-launch`` imports and builds nothing. Every failure is one line
(user text escaped for rich), exit code 1; SIGTERM, SIGHUP or Ctrl-C stop every
process of the run, remove its temporary files and exit with 128 + the signal's
number, as a shell reports it (SIGTERM 143, SIGHUP 129, Ctrl-C 130).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from umsearch.cli.console import abort as _fail
from umsearch.cli.console import console, debug_enabled, err_console, warn, write_output
from umsearch.cli.flags import rows, shared, take
from umsearch.cli.progress import Reporter
from umsearch.core.field_checks import MAX_INT
from umsearch.core.loader import LoadedPlan, load_plan_file
from umsearch.core.options import int_at_least, option
from umsearch.core.plan import Plan
from umsearch.core.profile import file_sha256
from umsearch.errors import PlanError, RuntimeExecutionError, UmsearchError
from umsearch.runtime.config import (
    FLAGS,
    ModelChoice,
    RunConfig,
    configs_from_values,
    to_argv,
)
from umsearch.runtime.launch import ENTRY_MODULE
from umsearch.runtime.placement import world_size
from umsearch.runtime.run_plan import check_writable

# ---------------------------------------------------------------------------
# Options from the flag table
# ---------------------------------------------------------------------------


def table_options(exclude: Sequence[str] = ()) -> Callable[[Any], Any]:
    """Decorator adding every run setting (but ``exclude``'s dests) as click options, with their defaults."""
    return take(row for row in FLAGS if row.dest not in exclude)


def split_values(values: dict[str, Any]) -> tuple[RunConfig, ModelChoice, dict[str, Any]]:
    """The configs in a command's keyword arguments, and the arguments that are not table flags."""
    dests = {row.dest for row in FLAGS}
    run, choice = configs_from_values({k: v for k, v in values.items() if k in dests})
    return run, choice, {k: v for k, v in values.items() if k not in dests}


# ---------------------------------------------------------------------------
# Failing in one line
# ---------------------------------------------------------------------------


def one_line_errors(f: Callable[..., None]) -> Callable[..., None]:
    """Run a command; a user error or a failed write is one red line (exit 1), a signal exit 128 + its
    number (SIGTERM 143, SIGINT 130)."""

    @functools.wraps(f)
    def run(*args: Any, **kwargs: Any) -> None:
        from umsearch.runtime.launch import LaunchInterrupted

        try:
            f(*args, **kwargs)
        except LaunchInterrupted as exc:
            import signal

            # The shell's convention: 128 + the signal's number (SIGTERM 143, SIGHUP 129, SIGINT 130).
            _fail(f"interrupted by {signal.Signals(exc.signum).name}: stopped torchrun and every rank, removed "
                  "the run's temporary files; nothing was written", 128 + exc.signum)  # fmt: skip
        except KeyboardInterrupt:
            _fail("interrupted; nothing was written", 130)
        except UmsearchError as exc:
            if debug_enabled():
                raise
            _fail(str(exc))

    return run


# ---------------------------------------------------------------------------
# Outputs
# ---------------------------------------------------------------------------


# ---------------------------------------------------------------------------
# Shared checks
# ---------------------------------------------------------------------------


def usable_cpus() -> int:
    """Cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def run_warnings(loaded: LoadedPlan, cfg: RunConfig, cpus: int | None = None) -> list[str]:
    """What makes measured times (or the prediction they are compared with) untrustworthy."""
    out = []
    recorded = loaded.document.meta.get("profile_sha256")
    prof = loaded.profile_path
    if prof is not None and isinstance(recorded, str) and file_sha256(prof) != recorded:
        out.append(f"the profile {prof} is not the one the plan was searched on (its sha256 differs from the "
                   "plan's profile_sha256); the prediction is for another measurement")  # fmt: skip
    from umsearch.runtime.config import optimizer_warning

    planned = optimizer_warning(cfg.optimizer, loaded.state_factor)
    if planned is not None:
        out.append(planned)
    lc = cfg.launch
    cpus = usable_cpus() if cpus is None else cpus
    ranks = world_size(loaded.plan)  # every rank of every replica is a process
    what = "ranks" if loaded.plan.data_parallel == 1 else f"processes ({loaded.plan.data_parallel} replicas)"
    if lc.backend == "gloo" and ranks * (lc.threads or 1) > cpus:
        out.append(f"{ranks} {what} x {lc.threads or 1} thread(s) need {ranks * (lc.threads or 1)} cores but "
                   f"{cpus} are available: ranks share cores, so measured times include contention the model "
                   "does not have")  # fmt: skip
    return out


def check_runnable(loaded: LoadedPlan) -> None:
    """Say the gate's notes and refuse (before anything starts, without running model code) a loaded plan
    whose model may not run (:func:`umsearch.runtime.model_source.require_trusted`) or is too large to build; the
    gate (:func:`umsearch.core.loader.load_plan_file`) refused a plan that deadlocks or does not fit its
    profile."""
    from umsearch.runtime.model_source import check_spec_size, require_trusted

    warn(*loaded.notes)
    check_spec_size(require_trusted(loaded))  # before anything is built, --print-launch included


def measured_on(loaded: LoadedPlan, cfg: RunConfig) -> tuple[RunConfig, Any]:
    """``cfg`` with the run's precision settled against the plan's profile (another one is refused), and
    the comparison (:func:`umsearch.runtime.preflight.check_measured_on`) with its warnings."""
    from dataclasses import replace

    from umsearch.runtime.preflight import backend_device_type, check_measured_on

    on = check_measured_on(loaded.profile, device_type=backend_device_type(cfg.launch.backend), precision=cfg.precision)
    return replace(cfg, precision=on.precision), on


def predicted_ms(loaded: LoadedPlan) -> float | None:
    """The simulator's iteration time under the plan's profile, else the plan file's own prediction."""
    if loaded.profile is not None:
        from umsearch.sim.reference import simulate

        return simulate(loaded.plan, loaded.cost()).iteration_ms
    value = (loaded.document.predicted or {}).get("iteration_ms")
    return float(value) if isinstance(value, (int, float)) else None


def run_state_factor(cfg: RunConfig) -> float:
    """The state factor of what the run steps: its optimizer's (``--optimizer``), not the plan's."""
    from umsearch.runtime.config import state_factor_of

    return state_factor_of(cfg.optimizer)


def predicted_peaks(loaded: LoadedPlan, cfg: RunConfig) -> tuple[float, ...] | None:
    """Per pipeline rank, the predicted peak memory (docs/model.md section 5) of what the run steps: the
    simulator's under the plan's profile with the run's optimizer's state factor, else the plan file's own
    ``predicted.peak_memory_bytes`` (its own state factor); None when neither says."""
    if loaded.profile is not None:
        from umsearch.core.cost import CostModel
        from umsearch.sim.reference import simulate

        cost = CostModel(loaded.profile, state_factor=run_state_factor(cfg))
        peaks = simulate(loaded.plan, cost).peak_memory_bytes
        return None if peaks is None else tuple(float(v) for v in peaks)
    raw = (loaded.document.predicted or {}).get("peak_memory_bytes")
    if isinstance(raw, list) and len(raw) == loaded.plan.ranks and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in raw):  # fmt: skip
        return tuple(float(v) for v in raw)
    return None


def _factor_text(loaded: LoadedPlan, cfg: RunConfig) -> str:
    if loaded.profile is None:
        return f"state_factor {loaded.state_factor:g} (the plan file's prediction)"
    return f"state_factor {run_state_factor(cfg):g} (--optimizer {cfg.optimizer})"


def process_devices(plan: Plan, backend: str) -> tuple[list[int], list[Any]]:
    """Per local process (world rank order) whose device this machine has: its pipeline rank and its
    memory (:class:`~umsearch.runtime.preflight.DeviceMemory`): under NCCL ``cuda:LOCAL_RANK``'s total
    memory, under gloo the host's available memory, which every rank shares."""
    from umsearch.runtime.placement import replica_worlds
    from umsearch.runtime.preflight import DeviceMemory

    rank_of = [0] * world_size(plan)
    for worlds in replica_worlds(plan):
        for r, w in enumerate(worlds):
            rank_of[w] = r
    if backend == "nccl":
        import torch

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        ranks, devices = [], []
        for w, r in enumerate(rank_of[:count]):  # a process without a GPU fails at launch, with its own message
            props = torch.cuda.get_device_properties(w)
            ranks.append(r)
            devices.append(DeviceMemory(name=f"cuda:{w} ({props.name})", bytes=float(props.total_memory)))
        return ranks, devices
    import torch

    from umsearch.measure.memory import available_bytes

    host = DeviceMemory(name="this host's available memory", bytes=available_bytes(torch.device("cpu")))
    return rank_of, [host] * len(rank_of)


def check_run_memory(loaded: LoadedPlan, cfg: RunConfig) -> None:
    """Refuse (one line, :func:`umsearch.runtime.preflight.check_memory`) a plan whose predicted peak on some
    rank does not fit its device; a plan without a prediction passes."""
    from umsearch.runtime.preflight import check_memory

    peaks = predicted_peaks(loaded, cfg)
    if peaks is None:
        return
    ranks, devices = process_devices(loaded.plan, cfg.launch.backend)
    check_memory([peaks[r] for r in ranks], devices, ranks)


# ---------------------------------------------------------------------------
# --print-launch
# ---------------------------------------------------------------------------


def entry_argv(plan_path: str, cfg: RunConfig, choice: ModelChoice | None = None) -> list[str]:
    """The entry point's arguments for ``plan_path``: the same locally and on a cluster."""
    return ["-m", ENTRY_MODULE, plan_path, *to_argv(cfg, choice)]


def _endpoint(text: str) -> str:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not re.fullmatch(r"[0-9]{1,5}", port, re.ASCII) or not 0 < int(port) < 65536:
        raise RuntimeExecutionError(f"--rdzv-endpoint {text!r} must be HOST:PORT, e.g. node0.cluster:29500")
    return text


def rendezvous_id(plan_path: str, argv: Sequence[str]) -> str:
    """A rendezvous id every node derives alike: from the plan file's bytes and the entry arguments."""
    digest = hashlib.sha256(Path(plan_path).read_bytes() + "\0".join(argv).encode()).hexdigest()
    return f"umsearch-{digest[:12]}"


def launch_text(plan_path: str, plan: Plan, cfg: RunConfig, choice: ModelChoice, *, nnodes: int = 1,
                nproc_per_node: int | None = None, rdzv_endpoint: str | None = None,
                node_rank: int | None = None) -> str:  # fmt: skip
    """The torchrun command (after ``#`` comments) that runs ``plan``: the same line on every node.

    A data-parallel plan needs ``R x D`` processes; with a ``cluster`` they must fit ``nnodes`` nodes
    of its ``gpus_per_node`` devices."""
    R, D = plan.ranks, plan.data_parallel
    world = world_size(plan)
    per_node = nproc_per_node or -(-world // nnodes)
    has = f"{R} rank(s)" if D == 1 else f"{R} rank(s) x {D} replicas = {world} processes"
    if nnodes * per_node != world:
        raise PlanError(f"the plan has {has}, which do not fill {nnodes} node(s) of {per_node} process(es); "
                        f"pick --nnodes and --nproc-per-node with nnodes x nproc-per-node = {world}")  # fmt: skip
    _check_cluster_fit(plan, nnodes, per_node)
    if node_rank is not None and not 0 <= node_rank < nnodes:
        raise PlanError(f"--node-rank {node_rank} is not a node of {nnodes}; give 0..{nnodes - 1}")
    argv = entry_argv(plan_path, cfg, choice)
    if nnodes == 1 and rdzv_endpoint is None:
        rdzv = ["--standalone", "--nnodes=1"]
    else:
        if rdzv_endpoint is None:
            raise PlanError(f"--nnodes {nnodes} needs --rdzv-endpoint HOST:PORT (a host every node can reach, "
                            "e.g. the first node's, and a free port)")  # fmt: skip
        rdzv = [f"--nnodes={nnodes}", "--rdzv-backend=c10d", f"--rdzv-endpoint={_endpoint(rdzv_endpoint)}",
                f"--rdzv-id={rendezvous_id(plan_path, argv)}"]  # fmt: skip
    env = [f"OMP_NUM_THREADS={cfg.launch.threads or 1}"] if cfg.launch.backend == "gloo" else []
    cmd = [*env, "torchrun", *rdzv, f"--nproc-per-node={per_node}", "--max-restarts=0", *argv]
    where = "GPU cuda:LOCAL_RANK" if cfg.launch.backend == "nccl" else "CPU"
    node = f" (this is node {node_rank})" if node_rank is not None else ""
    each = "one per rank" if D == 1 else f"one per rank of each replica (layout {plan.layout})"
    lines = [
        f"# {has}: {nnodes} node(s) x {per_node} process(es), {each}, each on its {where}.",
        f"# Run this same line on every node{node}, with the same plan file and umsearch installed;"
        + (" the c10d rendezvous gives each node its ranks as it joins." if nnodes > 1 or rdzv_endpoint else ""),
        " ".join(shlex.quote(word) for word in cmd),  # every word: the plan path and the endpoint are the user's
    ]
    return "\n".join(lines)


def _check_cluster_fit(plan: Plan, nnodes: int, per_node: int) -> None:
    """With the plan's cluster: its devices must hold the processes, and a node no more processes
    than it has devices (torchrun gives node k world ranks ``k * per_node ..``, as the plan's
    ``device // gpus_per_node`` assumes when ``per_node`` is ``gpus_per_node``)."""
    if plan.cluster is None:
        return
    G, world = plan.cluster.gpus_per_node, world_size(plan)
    if per_node > G or nnodes * G < world:
        need = -(-world // G)
        raise PlanError(f"the plan's {world} processes do not fit {nnodes} node(s) of its cluster's "
                        f"gpus_per_node = {G} (one process per device); use --nnodes {need} "
                        f"--nproc-per-node {min(G, world)}")  # fmt: skip


# ---------------------------------------------------------------------------
# umsearch run
# ---------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class RunFlags:
    """``run``'s own flags: what it prints and writes, and the cluster launch line it can print instead."""

    print_launch: bool = field(default=False, metadata=option(
        "Print the torchrun command for a cluster and exit (builds nothing).", kind="switch"))
    nnodes: int = field(default=1, metadata=option(
        "Nodes of the --print-launch command.", kind="int", bounds=(1, MAX_INT), parse=int_at_least(1, "--nnodes")))
    nproc_per_node: int | None = field(default=None, metadata=option(
        "Processes per node in the --print-launch command [default: ranks x replicas / nnodes].", kind="int",
        bounds=(1, MAX_INT), parse=int_at_least(1, "--nproc-per-node")))
    rdzv_endpoint: str | None = field(default=None, metadata=option(
        "c10d rendezvous of the --print-launch command (needed for --nnodes > 1).", kind="text",
        metavar="HOST:PORT"))
    node_rank: int | None = field(default=None, metadata=option(
        "Node the --print-launch command is for; the line is the same on every node.", kind="int",
        bounds=(0, MAX_INT), parse=int_at_least(0, "--node-rank")))
    force_memory: bool = field(default=False, metadata=option(
        "Run even when a rank's predicted peak memory exceeds its device's (refused by default).", kind="switch"))


@dataclass(frozen=True, kw_only=True)
class ValidateFlags:
    """``validate``'s own flags."""

    rounds: int = field(default=30, metadata=option(
        "Measured rounds per plan after warm-up; every round runs each plan once, in a rotated order.",
        kind="int", bounds=(1, MAX_INT), parse=int_at_least(1, "--rounds")))
    out_path: str | None = field(default=None, metadata=option(
        "Write the comparison JSON here.", kind="text", flag="--out", metavar="FILE"))


@click.command("run")
@click.argument("plan_path", metavar="PLAN.json", type=click.Path(dir_okay=False))
@table_options()
@shared("as_json", "progress")
@take(rows(RunFlags, "print_launch", "nnodes", "nproc_per_node", "rdzv_endpoint", "node_rank", "force_memory"))
@shared("trace")
@one_line_errors
def run_command(plan_path: str, **values: Any) -> None:
    """Train PLAN.json's model for a few iterations, one local torchrun process per rank (of every
    data-parallel replica), and time it."""
    cfg, choice, extra = split_values(values)
    if click.get_current_context().get_parameter_source("warmup_steps") is not ParameterSource.DEFAULT:
        cfg.check_warmup()  # with --print-launch too: the printed command would time nothing
    if not extra["print_launch"]:
        for name in ("nproc_per_node", "rdzv_endpoint", "node_rank"):
            if extra[name] is not None:
                flag = "--" + name.replace("_", "-")
                raise RuntimeExecutionError(f"{flag} only shapes the --print-launch command; a local run starts one "
                                            "process per rank of the plan: drop it or add --print-launch")  # fmt: skip
        if extra["nnodes"] != 1:
            raise RuntimeExecutionError("--nnodes only shapes the --print-launch command; drop it or add --print-launch")
    for flag, path in (("--out", cfg.out), ("--trace", extra["trace"])):
        if path is not None and not extra["print_launch"]:
            check_writable(path, flag, [plan_path])
    from umsearch.runtime.model_source import user_model

    loaded = load_plan_file(plan_path, profile=choice.profile, model=user_model(choice),
                            trust_model_code=choice.trust_model_code)  # fmt: skip
    check_runnable(loaded)
    cfg, on = measured_on(loaded, cfg)  # the ranks (and a printed launch line) get the precision explicitly
    warn(*on.warnings)
    if extra["print_launch"]:
        click.echo(launch_text(plan_path, loaded.plan, cfg, choice, nnodes=extra["nnodes"],
                               nproc_per_node=extra["nproc_per_node"], rdzv_endpoint=extra["rdzv_endpoint"],
                               node_rank=extra["node_rank"]))  # fmt: skip
        return
    _run_local(plan_path, loaded, cfg, choice, as_json=extra["as_json"], trace=extra["trace"],
               progress=extra["progress"], force_memory=extra["force_memory"])  # fmt: skip


def _run_local(plan_path: str, loaded: LoadedPlan, cfg: RunConfig, choice: ModelChoice, *, as_json: bool,
               trace: str | None, progress: str, force_memory: bool = False) -> None:  # fmt: skip
    from umsearch.runtime.model_source import spec_factory
    from umsearch.runtime.preflight import check_layers, count_layers
    from umsearch.runtime.run_plan import memory_report, run_document, run_plan_file

    spec = loaded.require_model()  # trusted: check_runnable said so
    check_layers(loaded.plan, count_layers(spec_factory(spec, cfg.seed)))
    if not force_memory:
        check_run_memory(loaded, cfg)
    warn(*run_warnings(loaded, cfg))
    processes = world_size(loaded.plan)
    # One step: torchrun reports nothing until every rank is done (no per-iteration hook in the launcher).
    with Reporter(progress, "run", quiet=as_json) as shown:
        shown.update(0, 1, f"launching {processes} processes (torchrun) for {cfg.steps} iterations")
        result = run_plan_file(plan_path, processes, cfg, choice)
        shown.update(1, 1, f"ran {cfg.steps} iterations on {processes} processes")
    median = result.median_step(cfg.warmup_steps)
    doc = run_document(result, cfg, meta={"plan": str(plan_path), "model": spec.to_json()})
    doc["predicted_iteration_ms"] = predicted_ms(loaded)
    doc["memory"] = memory_report(predicted_peaks(loaded, cfg), result.peak_memory_bytes(cfg.warmup_steps),
                                  ranks=loaded.plan.ranks, state_factor=_factor_text(loaded, cfg),
                                  tallied=result.tallied_peak_bytes)  # fmt: skip
    doc["trace"] = trace
    if trace:
        from umsearch.cli.pictures import write_chrome_trace

        meta = {"plan": str(plan_path), "iteration_ms": median.iteration_ms}
        write_output(trace, "--trace", lambda p: write_chrome_trace(median.records, p, source="measured", metadata=meta))
    if cfg.out:
        from umsearch.storage.jsonio import write_json

        write_output(cfg.out, "--out", lambda p: write_json(p, doc))
    if as_json:
        click.echo(json.dumps(doc))
        return
    _print_run(result, cfg.warmup_steps, doc["predicted_iteration_ms"], trace)
    _print_memory(doc["memory"])


def _print_memory(report: dict[str, Any], prefix: str = "") -> None:
    from rich.markup import escape

    from umsearch.runtime.run_plan import memory_lines

    for line in memory_lines(report):
        console.print(escape(prefix + line), soft_wrap=True)


def _print_run(result: Any, skip: int, predicted: float | None, trace: str | None) -> None:
    from rich.markup import escape
    from rich.table import Table

    table = Table(title="measured iterations", title_justify="left")
    for col in ("step", "iteration ms", "with optimizer ms", "loss"):
        table.add_column(col, justify="right")
    for i, s in enumerate(result.steps):
        loss = "-" if s.loss is None else f"{s.loss:.6f}"
        table.add_row(str(i), f"{s.iteration_ms:.3f}", f"{s.step_ms:.3f}", loss)
    console.print(table)
    median = result.median_iteration_ms(skip)
    q1, q3 = result.quartiles_ms(skip)
    line = (f"median iteration [bold]{median:.3f} ms[/], IQR {q1:.3f}-{q3:.3f} ms "
            f"(of the last {len(result.kept(skip))} step(s))")  # fmt: skip
    if predicted is not None:
        line += f"; predicted {predicted:.3f} ms ({(predicted - median) / median:+.1%})"
    console.print(line)
    if trace:
        console.print(f"Chrome trace of the median iteration: {escape(trace)} "
                      "(open in https://ui.perfetto.dev or chrome://tracing)")  # fmt: skip


# ---------------------------------------------------------------------------
# umsearch validate
# ---------------------------------------------------------------------------

_VALIDATE_EXCLUDE = ("steps", "out", "collect_grads")


@click.command("validate")
@click.argument("plan_paths", metavar="PLAN.json...", nargs=-1, required=True, type=click.Path(dir_okay=False))
@table_options(exclude=_VALIDATE_EXCLUDE)
@take(rows(ValidateFlags))
@shared("as_json")
@one_line_errors
def validate_command(plan_paths: tuple[str, ...], **values: Any) -> None:
    """Run PLAN.json files for real, side by side in one set of processes, against the simulator's prediction."""
    from umsearch.runtime.fidelity import (
        FidelityReport,
        contender,
        fidelity_document,
        fidelity_row,
        measure_rounds,
    )
    from umsearch.runtime.run_plan import measured_peaks, memory_report

    cfg, choice, extra = split_values(values)
    out = extra["out_path"]
    if out is not None:
        check_writable(out, "--out", plan_paths)
    contenders = []
    peaks: list[tuple[float, ...] | None] = []
    factors: list[str] = []
    other_device: list[str] = []  # plans whose profile was measured on another device type
    warned: set[str] = set()
    held_out: dict[str, float | None] = {}  # per profile: how far its predictions held on plans left out of its fit
    for path in plan_paths:
        from umsearch.runtime.model_source import user_model

        loaded = load_plan_file(path, profile=choice.profile, model=user_model(choice),
                                trust_model_code=choice.trust_model_code, require_profile=True)  # fmt: skip
        check_runnable(loaded)
        cfg, on = measured_on(loaded, cfg)  # one precision for all plans: the first profile's, unless --dtype
        if on.device_differs:
            other_device.append(path)
        fresh = [w for w in [*run_warnings(loaded, cfg), *on.warnings] if w not in warned]
        warn(*fresh)
        warned.update(fresh)
        contenders.append(contender(path, loaded, cfg.seed))
        peaks.append(predicted_peaks(loaded, cfg))
        factors.append(_factor_text(loaded, cfg))
        if loaded.profile is not None and str(loaded.profile_path) not in held_out:
            from umsearch.orchestrate.held_out import held_out_error, trust_line

            held_out[str(loaded.profile_path)] = held_out_error(loaded.profile)
            err_console.print(trust_line(loaded.profile, str(loaded.profile_path)), soft_wrap=True, markup=False)
    steps = measure_rounds(contenders, cfg, rounds=extra["rounds"])
    report = FidelityReport(rows=tuple(fidelity_row(c, s) for c, s in zip(contenders, steps, strict=True)),
                            rounds=extra["rounds"])  # fmt: skip
    memory = {c.name: memory_report(p, measured_peaks(s), ranks=c.plan.ranks, state_factor=f)
              for c, p, s, f in zip(contenders, peaks, steps, factors, strict=True)}  # fmt: skip
    doc = {**fidelity_document(report, cfg, cpus=usable_cpus()), "profile_held_out_mape_percent": held_out,
           "precision": cfg.precision, "profiled_on_other_device": other_device, "memory": memory}  # fmt: skip
    if out:
        from umsearch.storage.jsonio import write_json

        write_output(out, "--out", lambda p: write_json(p, doc))
    if extra["as_json"]:
        click.echo(json.dumps(doc))
        return
    _print_fidelity(report, out)
    for name, mem in memory.items():
        _print_memory(mem, prefix=f"{name}: " if len(memory) > 1 else "")
    if other_device:
        console.print(f"[yellow]not a model error:[/] the profile of {len(other_device)} plan(s) was measured on "
                      "another device type than this run's, so the error above compares devices; profile on this "
                      "device to validate the model")  # fmt: skip


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.1%}"


def _print_fidelity(report: Any, out: str | None) -> None:
    from rich.markup import escape
    from rich.table import Table

    table = Table(title="predicted vs measured", title_justify="left")
    for col in ("plan", "predicted ms", "measured ms", "95% CI ms", "error", "busy error"):
        table.add_column(col, justify="left" if col == "plan" else "right")
    for r in report.rows:
        lo, hi = r.measured_ci_ms
        table.add_row(escape(r.name), f"{r.predicted_ms:.3f}", f"{r.measured_ms:.3f}", f"{lo:.3f}-{hi:.3f}",
                      _pct(r.error), " ".join(_pct(e) for e in r.busy_error))  # fmt: skip
    console.print(table)
    console.print("busy error: per rank, predicted vs measured compute time (the cost model alone); the rest of "
                  "the iteration error is communication and waiting")  # fmt: skip
    console.print(f"measured: median of {report.rounds} rounds per plan (95% CI: bootstrap); IQR and every round "
                  "are in --out/--json")  # fmt: skip
    console.print(f"machine drift: {report.drift_text()}")
    console.print(f"MAPE [bold]{report.mape_percent:.1f}%[/]" + (f"; written to {escape(out)}" if out else ""))
