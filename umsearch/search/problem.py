"""The pymoo problem: plans in, (iteration time, peak memory) out, a whole population per call."""

from __future__ import annotations

from typing import Any

import numpy as np
from pymoo.core.problem import Problem

from umsearch.search.scoring import Scorer

# Deadlocked candidates get this time so they sort last; G marks them infeasible anyway
# (an infinite objective would turn NSGA-II's crowding distances into NaN).
DEADLOCK_MS = 1e18


class PlanProblem(Problem):
    """Minimize iteration time and the fullest stage's memory.

    A genome is one :class:`~umsearch.core.plan.Plan` (``X`` has one object column).
    ``G[0]`` is the memory over the limit (relative), ``G[1]`` is 1 on deadlock.
    """

    def __init__(self, score: Scorer, memory_limit: float) -> None:
        super().__init__(n_var=1, n_obj=2, n_ieq_constr=2, vtype=object)
        self.score, self.memory_limit = score, memory_limit

    def _evaluate(self, x: np.ndarray, out: dict[str, Any], *args: Any, **kwargs: Any) -> None:
        sc = self.score([row[0] for row in x])
        mem = sc.max_memory
        out["F"] = np.column_stack([np.where(sc.deadlock, DEADLOCK_MS, sc.time_ms), mem])
        out["G"] = np.column_stack([(mem - self.memory_limit) / self.memory_limit, sc.deadlock.astype(float)])
