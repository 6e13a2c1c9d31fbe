"""Run a plan for real on local torchrun processes and gather what every stage measured."""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass

import torch

from umsearch.core.cost import CostModel
from umsearch.core.plan import Plan
from umsearch.runtime.config import RunConfig
from umsearch.runtime.executor import OpTiming
from umsearch.runtime.launch import launch, launch_entry
from umsearch.runtime.model import ModelFactory
from umsearch.runtime.preflight import preflight
from umsearch.runtime.worker import StageReport, stage_worker


@dataclass(frozen=True, kw_only=True)
class StepResult:
    """One iteration, all stages together."""

    iteration_ms: float
    """Latest op end of any stage after the barrier: what the simulator predicts."""
    step_ms: float
    """Slowest stage's wall time including its optimizer step."""
    loss: float | None
    """Full-batch mean loss (from the last stage)."""
    ops: tuple[OpTiming, ...]
    """Every op of every stage, by start time."""


@dataclass(frozen=True, kw_only=True)
class RunResult:
    """A finished run."""

    steps: tuple[StepResult, ...]
    """One entry per iteration."""
    grads: dict[str, torch.Tensor] | None
    """Every parameter's gradient after the last iteration (``collect_grads`` only)."""
    cpus: tuple[tuple[int, ...] | None, ...] = ()
    """Per stage, the CPU cores its process could use."""

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


def quartiles(values: list[float]) -> tuple[float, float]:
    """(Q1, Q3) of ``values`` (inclusive method; one value is its own quartiles)."""
    if len(values) < 2:
        return values[0], values[0]
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q3


def merge(reports: list[StageReport]) -> RunResult:
    """Combine the per-stage reports into one result per iteration."""
    steps = []
    for i in range(len(reports[0].stats)):
        per_stage = [r.stats[i] for r in reports]
        ops = sorted((op for st in per_stage for op in st.ops), key=lambda o: (o.start_ms, o.stage))
        steps.append(StepResult(
            iteration_ms=max(st.pipeline_ms for st in per_stage),
            step_ms=max(st.step_ms for st in per_stage),
            loss=per_stage[-1].loss, ops=tuple(ops),
        ))  # fmt: skip
    grads = None
    if all(r.grads is not None for r in reports):
        grads = {k: v for r in reports for k, v in (r.grads or {}).items()}
    return RunResult(steps=tuple(steps), grads=grads, cpus=tuple(r.cpus for r in reports))


def run_plan(plan: Plan, factory: ModelFactory, cfg: RunConfig | None = None, cost: CostModel | None = None,
             *, preflighted: bool = False) -> RunResult:  # fmt: skip
    """Check ``plan`` against the model and for deadlock, then run it on one torchrun rank per stage.

    ``factory`` must be picklable (a module-level function or a partial of
    one): every rank calls it to rebuild the same model. ``preflighted``: the
    caller already ran :func:`~umsearch.runtime.preflight.preflight` on this
    plan, so it is not repeated here (the ranks still check, unless
    ``cfg.check`` is off).
    """
    cfg = cfg or RunConfig()
    if cfg.check and not preflighted:
        preflight(plan, factory, cost)
    reports = launch(stage_worker, plan.num_stages, (plan.to_json(), factory, cfg), cfg.launch)
    return merge(reports)


def run_plan_file(plan_path: str | os.PathLike[str], num_stages: int, cfg: RunConfig) -> RunResult:
    """Run a plan file the way a cluster does: torchrun with the entry point's command line.

    The ranks load the plan, build its model and check it themselves; the
    caller checks before, to refuse a bad plan without starting anything.
    """
    reports = launch_entry(num_stages, [str(plan_path), *cfg.to_argv()], cfg.launch)
    return merge(reports)
