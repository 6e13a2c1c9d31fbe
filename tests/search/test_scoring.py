"""Scoring: deadlocks and plans over the limit are never chosen; ties keep the first."""

from __future__ import annotations

import math

from tests.strategies import uniform_profile
from umsearch.core.cost import CostModel
from umsearch.core.plan import Plan, StagePlan, uniform_plan
from umsearch.search.scoring import Scorer

# MODEL.md section 6: this two-stage recompute plan deadlocks.
DEADLOCK = Plan(global_batch=8, stages=(
    StagePlan(layers=(0, 2), forward=(1, 3, 4), backward=(2, 6), warmup=1, recompute=True),
    StagePlan(layers=(2, 4), forward=(4, 4), backward=(8,), warmup=2, recompute=True),
))  # fmt: skip


def test_scores_mark_deadlock_and_memory() -> None:
    score = Scorer(CostModel(uniform_profile()))
    gpipe, onef = uniform_plan([0, 2, 4], 8, 8, "gpipe"), uniform_plan([0, 2, 4], 8, 8, "1f1b")
    sc = score([DEADLOCK, gpipe, onef])
    assert score.count == 3
    assert sc.deadlock.tolist() == [True, False, False] and math.isinf(sc.time_ms[0])
    assert sc.time_ms[1] == sc.time_ms[2]  # same time; 1F1B holds fewer samples
    assert sc.max_memory[2] < sc.max_memory[1]
    assert sc.fastest(1e9) == 1  # the first of equals
    assert sc.fastest(float(sc.max_memory[2])) == 2  # GPipe no longer fits
    assert sc.fastest(1.0) is None
    assert [s.plan for s in score.feasible([DEADLOCK, gpipe, onef], float(sc.max_memory[2]))] == [onef]
    best = score.fastest([gpipe, onef], 1e9, "x", ["a", "b"])
    assert best is not None and best.plan == gpipe and best.method == "a"
