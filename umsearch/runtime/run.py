"""Run a plan for real on local processes and gather what every stage measured."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch

from umsearch.cost_model import CostModel
from umsearch.plan import Plan
from umsearch.runtime.config import RunConfig
from umsearch.runtime.executor import OpTiming
from umsearch.runtime.launch import launch
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

    def median_iteration_ms(self, skip: int = 1) -> float:
        """Median iteration time, leaving out the first ``skip`` (warm-up) iterations when possible."""
        times = [s.iteration_ms for s in self.steps]
        return statistics.median(times[skip:] if len(times) > skip else times)

    def median_step(self, skip: int = 1) -> StepResult:
        """The iteration whose time is the median (the lower middle one), after warm-up."""
        steps = list(self.steps[skip:] if len(self.steps) > skip else self.steps)
        return sorted(steps, key=lambda s: s.iteration_ms)[(len(steps) - 1) // 2]


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
    return RunResult(steps=tuple(steps), grads=grads)


def run_plan(plan: Plan, factory: ModelFactory, cfg: RunConfig | None = None,
             cost: CostModel | None = None, check: bool = True) -> RunResult:  # fmt: skip
    """Check ``plan`` against the model (and for deadlock), run it on one process per stage.

    ``factory`` must be picklable (a module-level function or a partial of
    one): every rank calls it to rebuild the same model.
    """
    cfg = cfg or RunConfig()
    if check:
        preflight(plan, factory(), cost)
    reports = launch(stage_worker, plan.num_stages, (plan.to_json(), factory, cfg), cfg.launch)
    return merge(reports)
