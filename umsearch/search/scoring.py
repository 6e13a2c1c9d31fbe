"""Scoring plans with the batch evaluator: the one place the search turns plans into numbers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from umsearch.core.cost import CostModel
from umsearch.core.plan import Plan
from umsearch.sim.batch import evaluate, pack_plans


@dataclass(frozen=True, kw_only=True)
class Scored:
    """A plan with its simulated cost."""

    name: str
    """Who produced it: ``umsearch`` or a baseline's name."""
    plan: Plan
    iteration_ms: float
    peak_memory_bytes: tuple[float, ...]
    """Per stage."""
    method: str = ""
    """How it was found, for reports."""

    @property
    def max_memory(self) -> float:
        return max(self.peak_memory_bytes)


@dataclass(frozen=True, kw_only=True)
class Scores:
    """Scores of a list of plans, row i for plan i."""

    time_ms: npt.NDArray[np.float64]
    """Iteration time; ``inf`` where the plan deadlocks."""
    memory: npt.NDArray[np.float64]
    """(n, S) peak memory per stage."""
    deadlock: npt.NDArray[np.bool_]

    @property
    def max_memory(self) -> npt.NDArray[np.float64]:
        return self.memory.max(axis=1)

    def feasible(self, memory_limit: float) -> npt.NDArray[np.bool_]:
        return ~self.deadlock & (self.max_memory <= memory_limit)

    def fastest(self, memory_limit: float) -> int | None:
        """Index of the fastest feasible plan (the first on a tie), None when none is."""
        t = np.where(self.feasible(memory_limit), self.time_ms, np.inf)
        i = int(np.argmin(t))
        return i if np.isfinite(t[i]) else None

    def scored(self, plans: Sequence[Plan], i: int, name: str, method: str = "") -> Scored:
        return Scored(name=name, plan=plans[i], iteration_ms=float(self.time_ms[i]),
                      peak_memory_bytes=tuple(float(m) for m in self.memory[i]), method=method)  # fmt: skip


class Scorer:
    """Scores plans sharing S and B in one batch-evaluator call, and counts them."""

    def __init__(self, cost: CostModel) -> None:
        self.cost = cost
        self.count = 0
        """Plans scored so far."""

    def __call__(self, plans: Sequence[Plan]) -> Scores:
        res = evaluate(pack_plans(plans), self.cost)
        self.count += len(plans)
        return Scores(time_ms=res.iteration_ms, memory=res.peak_memory_bytes, deadlock=res.deadlock)

    def fastest(self, plans: Sequence[Plan], memory_limit: float, name: str, method: str | Sequence[str] = "") -> Scored | None:
        """The fastest of ``plans`` that fits (``method`` may be one per plan), None when none does."""
        sc = self(plans)
        i = sc.fastest(memory_limit)
        if i is None:
            return None
        return sc.scored(plans, i, name, method if isinstance(method, str) else method[i])

    def feasible(self, plans: Sequence[Plan], memory_limit: float, name: str = "umsearch") -> list[Scored]:
        """The plans that fit and do not deadlock, scored, in input order."""
        if not plans:
            return []
        sc = self(plans)
        return [sc.scored(plans, int(i), name) for i in np.flatnonzero(sc.feasible(memory_limit))]
