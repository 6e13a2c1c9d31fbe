"""The pymoo problem and operators: genomes in, (time, memory) out, the whole population per call."""

from __future__ import annotations

from typing import Any

import numpy as np
from pymoo.core.problem import Problem
from pymoo.core.sampling import Sampling

from umsearch.batch_eval import evaluate
from umsearch.cost_model import CostModel
from umsearch.search.encoding import Encoding, pack_genomes

# Deadlocked candidates get this time so they sort last; G marks them infeasible anyway.
_DEADLOCK_MS = 1e18


class PlanProblem(Problem):
    """Minimize iteration time and the fullest stage's memory; memory over the limit violates G."""

    def __init__(self, enc: Encoding, cost: CostModel, memory_limit: float) -> None:
        super().__init__(n_var=enc.length, n_obj=2, n_ieq_constr=2, xl=0.0, xu=1.0 - 1e-9)
        self.enc, self.cost, self.memory_limit = enc, cost, memory_limit

    def _evaluate(self, x: np.ndarray, out: dict[str, Any], *args: Any, **kwargs: Any) -> None:
        packed, _ = pack_genomes(self.enc, x)
        res = evaluate(packed, self.cost)
        mem = res.peak_memory_bytes.max(axis=1)
        time = np.where(res.deadlock, _DEADLOCK_MS, res.iteration_ms)
        out["F"] = np.column_stack([time, mem])
        out["G"] = np.column_stack([(mem - self.memory_limit) / self.memory_limit, res.deadlock.astype(float)])


class SeededSampling(Sampling):
    """Random genomes plus the baselines' genomes, so the search starts no worse than them."""

    def __init__(self, seeds: np.ndarray) -> None:
        super().__init__()
        self.seeds = seeds

    def _do(self, problem: Problem, n_samples: int, **kwargs: Any) -> np.ndarray:
        rng = kwargs.get("random_state") or np.random.default_rng(0)
        X = rng.random((n_samples, problem.n_var)) * (1.0 - 1e-9)
        k = min(len(self.seeds), n_samples)
        X[:k] = self.seeds[:k]
        return X
