"""The pymoo problem: genomes in, (iteration time, fullest rank's memory) out, a population per call."""

from __future__ import annotations

from typing import Any

import numpy as np
from pymoo.core.problem import Problem

from umsearch.search.scoring import Scorer

INFEASIBLE_MS = 1e18
"""Time given to candidates that do not fit, so they sort last; G marks them infeasible anyway (an
infinite objective would turn NSGA-II's crowding distances into NaN)."""


class GenomeProblem(Problem):
    """Minimize iteration time and the fullest rank's memory; ``G[0]`` is memory over the limit
    (relative). A genome is one object in ``X``'s single column."""

    def __init__(self, score: Scorer) -> None:
        super().__init__(n_var=1, n_obj=2, n_ieq_constr=1, vtype=object)
        self.score = score

    def _evaluate(self, x: np.ndarray, out: dict[str, Any], *args: Any, **kwargs: Any) -> None:
        t, mem = self.score.genome_objectives([row[0] for row in x])
        limit = self.score.memory_limit
        mem = np.minimum(mem, INFEASIBLE_MS)
        out["F"] = np.column_stack([np.minimum(t, INFEASIBLE_MS), mem])
        out["G"] = ((mem - limit) / limit)[:, None]
