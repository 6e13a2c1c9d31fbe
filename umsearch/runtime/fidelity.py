"""Predicted against measured: run several plans side by side and compare with the simulator.

Contenders share one set of rank processes (one launch per rank count):
after warm-up, every *round* runs each plan once, in an order rotated by one
every round, so that no plan always runs first (cold) or last (after the
others warmed the caches), and a machine that speeds up or slows down during
the session moves every contender alike. For each plan: the simulator's
iteration time and per-rank busy time under its profile's cost model, and the
median of the measured rounds with a bootstrap 95% confidence interval. The
busy-time error isolates the cost model; the rest of the iteration error is
communication and scheduling the model does not capture. The machine's drift
is the change of every plan's times from the first half of the rounds to the
second, relative to its median.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from umsearch.core.cost import CostModel
from umsearch.core.loader import LoadedPlan
from umsearch.core.plan import Plan
from umsearch.errors import PlanError
from umsearch.runtime.config import RunConfig
from umsearch.runtime.model_source import ModelFactory
from umsearch.runtime.placement import world_size
from umsearch.runtime.run_plan import StepResult, merge_step

FIDELITY_SCHEMA = "umsearch.fidelity/2"
BOOTSTRAP_RESAMPLES = 4000
"""Resamples of the bootstrap confidence interval (seeded: the same rounds give the same interval)."""


@dataclass(frozen=True, kw_only=True)
class Contender:
    """One plan of a validation, with the cost model that predicts it and the model it runs."""

    name: str
    """Label (the plan's path, or a description)."""
    plan: Plan
    """The plan."""
    cost: CostModel
    """The profile's cost model (the prediction)."""
    factory: ModelFactory
    """Builds the model in every rank (picklable; a trusted spec, see :func:`contender`)."""


def contender(name: str, loaded: LoadedPlan, seed: int) -> Contender:
    """A contender of a plan file loaded by :func:`umsearch.runtime.model_source.resolve_plan` (its model
    already checked to be trusted)."""
    from umsearch.runtime.model_source import spec_factory

    return Contender(name=name, plan=loaded.plan, cost=loaded.cost(), factory=spec_factory(loaded.require_model(), seed))


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
    """Median of the measured rounds."""
    measured_ci_ms: tuple[float, float]
    """Bootstrap 95% confidence interval of that median."""
    measured_quartiles_ms: tuple[float, float]
    """First and third quartile of the measured rounds (the spread)."""
    measured_all_ms: tuple[float, ...]
    """Every measured round, in round order."""
    predicted_busy_ms: tuple[float, ...]
    """Simulated compute time per rank."""
    measured_busy_ms: tuple[float, ...]
    """Median measured compute time per rank (sum of its action durations)."""

    @property
    def error(self) -> float:
        """Signed relative error of the prediction: (predicted - measured) / measured."""
        return (self.predicted_ms - self.measured_ms) / self.measured_ms

    @property
    def busy_error(self) -> tuple[float | None, ...]:
        """Per rank, the signed relative error of the predicted compute time (None if none measured)."""
        return tuple((p - m) / m if m > 0 else None
                     for p, m in zip(self.predicted_busy_ms, self.measured_busy_ms, strict=True))  # fmt: skip

    @property
    def drift(self) -> float:
        """Median of the second half of the rounds over the first half's, minus 1."""
        return drift(self.measured_all_ms)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name, "plan": self.plan.to_json(),
            "predicted_ms": self.predicted_ms, "measured_median_ms": self.measured_ms,
            "measured_ci95_ms": list(self.measured_ci_ms),
            "measured_quartiles_ms": list(self.measured_quartiles_ms), "measured_ms": list(self.measured_all_ms),
            "error": self.error, "predicted_busy_ms": list(self.predicted_busy_ms),
            "measured_busy_ms": list(self.measured_busy_ms), "busy_error": list(self.busy_error),
            "drift": self.drift,
        }  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class FidelityReport:
    """A validation: every contender, and how the machine drifted meanwhile."""

    rows: tuple[PlanFidelity, ...]
    """One per plan, in the order given."""
    rounds: int
    """Measured rounds per plan."""

    @property
    def mape_percent(self) -> float:
        """Mean absolute percentage error of the iteration time."""
        return mape(self.rows)

    @property
    def drift(self) -> float:
        """Mean over plans of their drift (second half of the rounds vs the first)."""
        return statistics.fmean(r.drift for r in self.rows)

    def drift_text(self) -> str:
        return (f"{self.drift:+.1%} from the first half of the {self.rounds} rounds to the second "
                f"(per plan {', '.join(f'{r.drift:+.1%}' for r in self.rows)})")  # fmt: skip


def mape(rows: Sequence[PlanFidelity]) -> float:
    """Mean absolute percentage error of the iteration time, in percent."""
    return 100.0 * statistics.fmean(abs(r.error) for r in rows)


def bootstrap_median_ci(values: Sequence[float], resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0,
                        level: float = 0.95) -> tuple[float, float]:  # fmt: skip
    """Percentile bootstrap interval of the median of ``values``."""
    data = np.asarray(values, dtype=np.float64)
    if data.size < 2:
        return float(data[0]), float(data[0])
    rng = np.random.default_rng(seed)
    medians = np.median(data[rng.integers(0, data.size, size=(resamples, data.size))], axis=1)
    lo, hi = np.quantile(medians, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def drift(values: Sequence[float]) -> float:
    """Median of the second half of ``values`` over the first half's, minus 1 (0 for fewer than 2)."""
    if len(values) < 2:
        return 0.0
    half = len(values) // 2
    return statistics.median(values[-half:]) / statistics.median(values[:half]) - 1.0


def rotation(n: int, round_index: int) -> list[int]:
    """The order of ``n`` contenders in round ``round_index``: each round starts one further."""
    return [(round_index + i) % n for i in range(n)]


def rounds_worker(rank: int, world_size: int, jobs: Sequence[tuple[Plan, Any]], cfg: RunConfig,
                  rounds: int) -> list[list[Any]]:  # fmt: skip
    """Launch target: ``rounds`` rounds of every ``(plan, model factory)`` job in rotated order (a
    :class:`Plan` the launcher checked, pickled); per round, per job (in job order), this rank's stats of
    the measured iteration.

    Each job runs ``cfg.warmup_steps`` iterations before the one measured, so
    every measurement comes warm whatever ran before it.
    """
    from umsearch.runtime.worker import RankSession

    comms: dict[Any, Any] = {}
    sessions = [RankSession(rank, world_size, plan, factory, cfg, comms) for plan, factory in jobs]
    out: list[list[Any]] = []
    for r in range(rounds):
        measured: list[Any] = [None] * len(jobs)
        for j in rotation(len(jobs), r):
            for step in range(cfg.warmup_steps):
                sessions[j].step(step)
            measured[j] = sessions[j].step(cfg.warmup_steps)
        out.append(measured)
    return out


def _busy(steps: Sequence[StepResult], ranks: int) -> tuple[float, ...]:
    per_rank: list[list[float]] = [[] for _ in range(ranks)]
    for step in steps:
        busy = [0.0] * ranks
        for a in step.records:
            busy[a.rank] += a.end_ms - a.start_ms
        for r in range(ranks):
            per_rank[r].append(busy[r])
    return tuple(statistics.median(v) for v in per_rank)


def fidelity_row(c: Contender, steps: Sequence[StepResult]) -> PlanFidelity:
    """Compare one contender's measured rounds with its simulation."""
    from umsearch.runtime.run_plan import quartiles
    from umsearch.sim.reference import simulate

    sim = simulate(c.plan, c.cost)
    if sim.iteration_ms is None or sim.busy_ms is None:
        raise PlanError(f"plan {c.name} deadlocks: " + "; ".join(sim.blocked))
    times = [s.iteration_ms for s in steps]
    return PlanFidelity(
        name=c.name, plan=c.plan, predicted_ms=sim.iteration_ms, measured_ms=statistics.median(times),
        measured_ci_ms=bootstrap_median_ci(times), measured_quartiles_ms=quartiles(times),
        measured_all_ms=tuple(times), predicted_busy_ms=tuple(sim.busy_ms),
        measured_busy_ms=_busy(steps, c.plan.ranks),
    )  # fmt: skip


def measure_rounds(contenders: Sequence[Contender], cfg: RunConfig, *, rounds: int = 30) -> list[list[StepResult]]:
    """Run every contender ``rounds`` times, side by side, one launch per process count; per contender,
    the measured iteration of every round (all ranks' action records merged)."""
    from umsearch.runtime.launch import launch

    if rounds < 1:
        raise PlanError(f"--rounds {rounds}: give at least one measured round")
    by_world: dict[int, list[int]] = {}
    for i, c in enumerate(contenders):
        by_world.setdefault(world_size(c.plan), []).append(i)
    steps: dict[int, list[StepResult]] = {}
    for world, members in by_world.items():
        jobs = [(contenders[i].plan, contenders[i].factory) for i in members]  # checked Plans, pickled
        per_rank = launch(rounds_worker, world, (jobs, cfg, rounds), cfg.launch)
        for pos, i in enumerate(members):
            steps[i] = [merge_step([per_rank[rk][r][pos] for rk in range(world)]) for r in range(rounds)]
    return [steps[i] for i in range(len(contenders))]


def measure_contenders(contenders: Sequence[Contender], cfg: RunConfig, *, rounds: int = 30) -> FidelityReport:
    """:func:`measure_rounds`, each contender compared with its simulation."""
    steps = measure_rounds(contenders, cfg, rounds=rounds)
    rows = tuple(fidelity_row(c, s) for c, s in zip(contenders, steps, strict=True))
    return FidelityReport(rows=rows, rounds=rounds)


def fidelity_document(report: FidelityReport, cfg: RunConfig, *, cpus: int) -> dict[str, Any]:
    """The validation's JSON (``umsearch.fidelity/2``)."""
    return {
        "schema": FIDELITY_SCHEMA, "mape_percent": report.mape_percent, "rounds": report.rounds,
        "warmup_steps": cfg.warmup_steps, "backend": cfg.launch.backend, "threads": cfg.launch.threads,
        "cpus": cpus, "drift": report.drift, "order": "rotated by one each round",
        "plans": [r.to_json() for r in report.rows],
    }  # fmt: skip
