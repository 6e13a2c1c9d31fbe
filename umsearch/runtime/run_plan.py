"""Run a plan for real on local torchrun processes (one per rank of every replica) and gather what every
rank measured."""

from __future__ import annotations

import os
import stat
import statistics
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from umsearch.core.actions import ActionRecord
from umsearch.core.cost import CostModel
from umsearch.core.plan import Plan
from umsearch.core.plan_rules import validate_plan
from umsearch.errors import OutputError
from umsearch.runtime.config import ModelChoice, RunConfig, to_argv
from umsearch.runtime.launch import launch, launch_entry
from umsearch.runtime.placement import world_size
from umsearch.storage.outputs import check_output_file

if TYPE_CHECKING:
    import torch

    from umsearch.runtime.model_source import ModelFactory
    from umsearch.runtime.worker import StageReport

RUN_SCHEMA = "umsearch.run/1"


@dataclass(frozen=True, kw_only=True)
class StepResult:
    """One iteration, all ranks together."""

    iteration_ms: float
    """Latest action end of any rank of any replica, or end of a gradient all-reduce, after the common
    start: what the simulator predicts."""
    step_ms: float
    """Slowest rank's wall time including its optimizer step."""
    loss: float | None
    """Full-batch mean loss (from the rank holding the last stage; with replicas, the sum of their shares)."""
    records: tuple[ActionRecord, ...]
    """Every action of every rank, by start time (with replicas: replica 0's, one record per action)."""
    peak_memory_bytes: tuple[int | None, ...] = ()
    """Per pipeline rank, the device's peak allocated memory in the iteration (CUDA's
    ``max_memory_allocated``; the largest of the rank's replicas), None where not measured (CPU)."""


@dataclass(frozen=True, kw_only=True)
class RunResult:
    """A finished run."""

    steps: tuple[StepResult, ...]
    """One entry per iteration."""
    grads: dict[str, torch.Tensor] | None
    """Every parameter's gradient after the last iteration (``collect_grads`` only)."""
    cpus: tuple[tuple[int, ...] | None, ...] = ()
    """Per rank, the CPU cores its process could use."""
    tallied_peak_bytes: tuple[int | None, ...] = ()
    """Per pipeline rank, the first iteration's peak in the model's own terms (parameters, gradients,
    optimizer states and saved tensors, :mod:`umsearch.runtime.memory_tally`; the largest of its replicas)."""

    def kept(self, skip: int) -> tuple[StepResult, ...]:
        """The iterations after the first ``skip`` (warm-up); all of them when that would leave none."""
        return self.steps[skip:] if len(self.steps) > skip else self.steps

    def median_step(self, skip: int) -> StepResult:
        """The median iteration after warm-up: the lower middle one by iteration time.

        An actual iteration (never the mean of two), so the printed median and the
        trace of the median iteration are the same numbers.
        """
        steps = sorted(self.kept(skip), key=lambda s: s.iteration_ms)
        return steps[(len(steps) - 1) // 2]

    def median_iteration_ms(self, skip: int) -> float:
        """Iteration time of :meth:`median_step`."""
        return self.median_step(skip).iteration_ms

    def quartiles_ms(self, skip: int) -> tuple[float, float]:
        """First and third quartile of the iteration times after warm-up (the IQR's ends)."""
        return quartiles([s.iteration_ms for s in self.kept(skip)])

    def peak_memory_bytes(self, skip: int) -> tuple[int | None, ...]:
        """Per pipeline rank, the largest measured device peak of the iterations after warm-up (None: not
        measured, as on CPU ranks)."""
        return measured_peaks(self.kept(skip))


def measured_peaks(steps: Sequence[StepResult]) -> tuple[int | None, ...]:
    """Per pipeline rank, the largest device peak any of ``steps`` measured (None where none did)."""
    ranks = max((len(s.peak_memory_bytes) for s in steps), default=0)
    out: list[int | None] = []
    for r in range(ranks):
        seen = [s.peak_memory_bytes[r] for s in steps if r < len(s.peak_memory_bytes)]
        values = [v for v in seen if v is not None]
        out.append(max(values) if values else None)
    return tuple(out)


def quartiles(values: Sequence[float]) -> tuple[float, float]:
    """(Q1, Q3) of ``values``: Tukey's hinges about the lower median (one value is its own quartiles).

    The median reported is an actual iteration, the lower middle one
    (:meth:`RunResult.median_step`); Q1 is the median of the values up to and
    including it, Q3 of the values from it on, so ``Q1 <= median <= Q3`` for
    every sample. (Interpolated quartiles put Q1 above the lower median of two
    values: a median outside its own IQR.)
    """
    ordered = sorted(values)
    mid = (len(ordered) - 1) // 2
    return statistics.median(ordered[: mid + 1]), statistics.median(ordered[mid:])


def merge_step(per_rank: Sequence[Any]) -> StepResult:
    """One iteration from every process's stats of it (world rank order)."""
    ends = [a.end_ms for st in per_rank for a in st.actions]
    ends += [st.allreduce_end_ms for st in per_rank if getattr(st, "allreduce_end_ms", None) is not None]
    first = [st for st in per_rank if getattr(st, "replica", 0) == 0]
    records = sorted((a for st in first for a in st.actions), key=lambda a: (a.start_ms, a.rank))
    # Each replica's last stage reports its share of the full-batch loss (the whole of it without replicas).
    losses = [st.loss for st in per_rank if st.loss is not None]
    ranks = max((st.rank for st in per_rank), default=-1) + 1
    peaks: list[int | None] = []
    for r in range(ranks):
        values = [p for st in per_rank if st.rank == r and (p := getattr(st, "peak_memory_bytes", None)) is not None]
        peaks.append(max(values) if values else None)
    return StepResult(iteration_ms=max(ends, default=0.0), step_ms=max(st.step_ms for st in per_rank),
                      loss=sum(losses) if losses else None, records=tuple(records),
                      peak_memory_bytes=tuple(peaks))  # fmt: skip


def merge(reports: Sequence[StageReport]) -> RunResult:
    """Combine the per-process reports (world rank order) into one result per iteration; the gradients
    are replica 0's (after the all-reduce every replica holds the same)."""
    steps = [merge_step([r.stats[i] for r in reports]) for i in range(len(reports[0].stats))]
    grads = None
    first = [r for r in reports if r.replica == 0]
    if all(r.grads is not None for r in first):
        grads = {k: v for r in first for k, v in (r.grads or {}).items()}
    ranks = max((r.rank for r in reports), default=-1) + 1
    tallied = [max((r.tally.peak_bytes for r in reports if r.rank == k and r.tally is not None), default=None)
               for k in range(ranks)]  # fmt: skip
    return RunResult(steps=tuple(steps), grads=grads, cpus=tuple(r.cpus for r in reports),
                     tallied_peak_bytes=tuple(tallied))  # fmt: skip


def run_plan(plan: Plan, factory: ModelFactory, cfg: RunConfig | None = None, cost: CostModel | None = None,
             *, preflighted: bool = False) -> RunResult:  # fmt: skip
    """Check ``plan`` (:func:`~umsearch.core.plan_rules.validate_plan`, nothing again for a plan this process
    checked already; deadlock, profile, the model's layers) and run it on one torchrun process per rank
    and replica, each given the checked plan pickled.

    ``factory`` must be picklable (a module-level function or a partial of
    one): every rank calls it to rebuild the same model. ``preflighted``: the
    caller already ran :func:`~umsearch.runtime.preflight.preflight` on this
    plan (the ranks still check, unless ``cfg.check`` is off).
    """
    from umsearch.runtime.preflight import preflight
    from umsearch.runtime.worker import stage_worker

    validate_plan(plan)
    cfg = cfg or RunConfig()
    if cfg.check and not preflighted:
        preflight(plan, factory, cost)
    return merge(launch(stage_worker, world_size(plan), (plan, factory, cfg), cfg.launch))


def run_plan_file(plan_path: str | os.PathLike[str], processes: int, cfg: RunConfig,
                  choice: ModelChoice | None = None) -> RunResult:  # fmt: skip
    """Run a plan file the way a cluster does: torchrun with the entry point's command line, on
    ``processes`` local processes (the plan's ranks times its replicas).

    The ranks load the plan, resolve its model under the same trust rule and
    check it themselves; the caller checks before, to refuse a bad plan
    without starting anything.
    """
    return merge(launch_entry(processes, [str(plan_path), *to_argv(cfg, choice)], cfg.launch))


def check_writable(path: str, flag: str, inputs: Sequence[str] = ()) -> None:
    """Raise unless ``path`` can be written, so that a run is not wasted on an output that cannot be kept.

    :func:`umsearch.storage.outputs.check_output_file` first (no folder, FIFO,
    socket or block device, no file in the way); then, unless ``path`` is a
    character device (written through), tried rather than guessed: a probe file
    in the nearest existing folder, removed at once.
    """
    p = check_output_file(path, flag, inputs=inputs)
    if p.exists() and stat.S_ISCHR(p.stat().st_mode):
        return
    folder = p.absolute().parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise OutputError(f"{flag} {path!r} cannot be written: {exc.strerror} in {str(folder)!r}; "
                          "pick a folder you can write to") from None  # fmt: skip


def grads_json(grads: dict[str, torch.Tensor]) -> dict[str, Any]:
    """Gradients as ``{name: {"shape", "values"}}`` (float64 values; JSON round-trips them exactly)."""
    return {name: {"shape": list(g.shape), "values": g.detach().double().flatten().tolist()}
            for name, g in sorted(grads.items())}  # fmt: skip


def step_rows(result: RunResult) -> list[dict[str, Any]]:
    """One row per iteration: index, iteration time, time with the optimizer, loss."""
    return [{"step": i, "iteration_ms": s.iteration_ms, "step_ms": s.step_ms, "loss": s.loss}
            for i, s in enumerate(result.steps)]  # fmt: skip


MEASURED_BY_CUDA = "torch.cuda.max_memory_allocated of each rank, the largest iteration after warm-up"
MEASURED_BY_TALLY = ("the first iteration's tally of each rank in the model's terms: parameters, gradients, "
                     "optimizer states and saved activations, each storage once")  # fmt: skip
NOT_MEASURED_ON_CPU = ("not on CPU ranks (they have no allocator peak); `umsearch replay PLAN --all-ranks` tallies "
                       "each rank's parameters, gradients, optimizer states and saved activations alone")  # fmt: skip


def memory_report(predicted: Sequence[float] | None, measured: Sequence[int | None], *, ranks: int,
                  state_factor: str = "state_factor", tallied: Sequence[int | None] = ()) -> dict[str, Any]:  # fmt: skip
    """Per rank, the predicted peak memory (docs/model.md section 5, the simulator's) beside the measured
    one: ``{"measured_by", "ranks": [{"rank", "predicted_peak_bytes", "measured_peak_bytes", "ratio",
    "over_prediction"}]}``. ``measured`` holds the device's peaks (CUDA), None where not measured;
    ``state_factor`` says which factor the prediction's state used. ``tallied``: the ranks' tallies in the
    model's terms, the measured figure where the device has no peak of its own (CPU)."""
    by = MEASURED_BY_CUDA
    if not any(m is not None for m in measured) and any(t is not None for t in tallied):
        measured, by = tallied, MEASURED_BY_TALLY
    rows = []
    for r in range(ranks):
        p = float(predicted[r]) if predicted is not None and r < len(predicted) else None
        m = measured[r] if r < len(measured) else None
        rows.append({"rank": r, "predicted_peak_bytes": p, "measured_peak_bytes": m,
                     "ratio": m / p if m is not None and p else None,
                     "over_prediction": None if m is None or p is None else m > p})  # fmt: skip
    any_measured = any(row["measured_peak_bytes"] is not None for row in rows)
    return {"predicted_by": f"docs/model.md section 5: {state_factor} x parameters + peak stashed activations",
            "measured_by": by if any_measured else NOT_MEASURED_ON_CPU, "ranks": rows}  # fmt: skip


def memory_lines(report: dict[str, Any]) -> list[str]:
    """The memory report as text, one line per rank, then where the measured figure comes from."""
    from umsearch.core.units import format_bytes

    lines = []
    for row in report["ranks"]:
        p, m = row["predicted_peak_bytes"], row["measured_peak_bytes"]
        text = f"rank {row['rank']} peak memory: predicted {'-' if p is None else format_bytes(p)}, measured "
        text += "-" if m is None else format_bytes(m)
        if row["ratio"] is not None:
            text += f" ({row['ratio']:.2f}x{', over the prediction' if row['over_prediction'] else ''})"
        lines.append(text)
    lines.append(f"peak memory predicted by {report['predicted_by']}; measured: {report['measured_by']}")
    return lines


def run_document(result: RunResult, cfg: RunConfig, *, meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """The run's report (``umsearch.run/1``): every iteration, the median after warm-up and its IQR,
    and the gradients when they were collected."""
    median = result.median_step(cfg.warmup_steps)
    doc: dict[str, Any] = {
        "schema": RUN_SCHEMA, **(meta or {}), "backend": cfg.launch.backend, "threads": cfg.launch.threads,
        "steps": step_rows(result), "warmup_steps": cfg.warmup_steps,
        "median_iteration_ms": median.iteration_ms, "quartiles_ms": list(result.quartiles_ms(cfg.warmup_steps)),
    }  # fmt: skip
    if result.grads is not None:
        doc["grads"] = grads_json(result.grads)
    return doc
