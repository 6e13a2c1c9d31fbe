"""Predicted against measured: run plans for real and compare with the simulator.

For each plan: the simulator's iteration time and per-stage busy time under the
profile's cost model, and the runtime's median over the iterations after
warm-up. The busy-time error isolates the cost model (profile vs. real compute
in a pipeline process); the rest of the iteration error is communication and
scheduling the model does not capture.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from umsearch.core.cost import CostModel
from umsearch.core.errors import PlanError
from umsearch.core.plan import Plan
from umsearch.runtime.config import RunConfig
from umsearch.runtime.model import ModelFactory
from umsearch.runtime.preflight import preflight
from umsearch.runtime.run import RunResult, run_plan
from umsearch.sim.reference import simulate


@dataclass(frozen=True, kw_only=True)
class PlanFidelity:
    """One plan, predicted and measured."""

    name: str
    """Label of the plan (file name or description)."""
    plan: Plan
    """The plan."""
    predicted_ms: float
    """Simulated iteration time."""
    measured_ms: float
    """Median measured iteration time after warm-up (:meth:`RunResult.median_step`'s)."""
    measured_quartiles_ms: tuple[float, float]
    """First and third quartile of the measured iteration times after warm-up (the spread)."""
    measured_all_ms: tuple[float, ...]
    """Every measured iteration, warm-up included."""
    predicted_busy_ms: tuple[float, ...]
    """Simulated compute time per stage."""
    measured_busy_ms: tuple[float, ...]
    """Median measured compute time per stage (sum of its op durations)."""

    @property
    def error(self) -> float:
        """Signed relative error of the prediction: (predicted - measured) / measured."""
        return (self.predicted_ms - self.measured_ms) / self.measured_ms

    @property
    def busy_error(self) -> tuple[float | None, ...]:
        """Per stage, the signed relative error of the predicted compute time (None if none measured)."""
        return tuple(
            (p - m) / m if m > 0 else None for p, m in zip(self.predicted_busy_ms, self.measured_busy_ms, strict=True)
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "stages": [s.to_json() for s in self.plan.stages],
            "global_batch": self.plan.global_batch,
            "predicted_ms": self.predicted_ms,
            "measured_median_ms": self.measured_ms,
            "measured_quartiles_ms": list(self.measured_quartiles_ms),
            "measured_ms": list(self.measured_all_ms),
            "error": self.error,
            "predicted_busy_ms": list(self.predicted_busy_ms),
            "measured_busy_ms": list(self.measured_busy_ms),
            "busy_error": list(self.busy_error),
        }


def mape(rows: Sequence[PlanFidelity]) -> float:
    """Mean absolute percentage error of the iteration time, in percent."""
    return 100.0 * statistics.fmean(abs(r.error) for r in rows)


def measured_busy(result: RunResult, num_stages: int, skip: int) -> tuple[float, ...]:
    """Median (the lower middle, as for iterations) over the kept iterations of each stage's summed
    op durations."""
    per_stage: list[list[float]] = [[] for _ in range(num_stages)]
    for step in result.kept(skip):
        busy = [0.0] * num_stages
        for op in step.ops:
            busy[op.stage] += op.end_ms - op.start_ms
        for s in range(num_stages):
            per_stage[s].append(busy[s])
    return tuple(statistics.median_low(v) for v in per_stage)


def measure_plan(name: str, plan: Plan, cost: CostModel, factory: ModelFactory, cfg: RunConfig) -> PlanFidelity:
    """Simulate ``plan`` under ``cost`` once (that is also its check) and run it; leaves out
    ``cfg.warmup_steps`` leading iterations."""
    skip = cfg.warmup_steps
    if cfg.steps <= skip:
        raise PlanError(f"--steps {cfg.steps} leaves nothing after {skip} warm-up step(s); raise --steps")
    if cfg.check:
        sim = preflight(plan, factory, cost)
    else:
        sim = simulate(plan, cost)
        if sim.iteration_ms is None:
            raise PlanError(f"plan {name} deadlocks: " + "; ".join(sim.blocked))
    assert sim.iteration_ms is not None
    result = run_plan(plan, factory, cfg, cost, preflighted=True)
    return PlanFidelity(
        name=name, plan=plan, predicted_ms=sim.iteration_ms,
        measured_ms=result.median_iteration_ms(skip), measured_quartiles_ms=result.quartiles_ms(skip),
        measured_all_ms=tuple(s.iteration_ms for s in result.steps),
        predicted_busy_ms=tuple(sim.busy_ms),
        measured_busy_ms=measured_busy(result, plan.num_stages, skip),
    )  # fmt: skip
