"""``[search] workers``: how many threads score candidates; the plan never depends on it."""

from __future__ import annotations

import os
import random
from dataclasses import replace
from pathlib import Path

import numba
import numpy as np

from tests.search.helpers import small_bimodal_space
from umsearch.core.cost import CostModel
from umsearch.search.driver import run_search
from umsearch.search.genome import Rules
from umsearch.search.operators import random_genome
from umsearch.search.partition import stage_cuts
from umsearch.search.scoring import Scorer
from umsearch.search.workers import available_cores, worker_count, workers


def test_the_default_is_every_core_this_process_may_use() -> None:
    pool = numba.config.NUMBA_NUM_THREADS  # type: ignore[attr-defined]
    assert available_cores() == len(os.sched_getaffinity(0))
    assert worker_count(0) == min(available_cores(), pool)
    assert worker_count(1) == 1 and worker_count(10**6) == pool


def test_workers_set_the_threads_inside_and_restore_them_after() -> None:
    before = numba.get_num_threads()
    with workers(1) as n:
        assert n == 1 == numba.get_num_threads()
    assert numba.get_num_threads() == before


def test_scores_do_not_depend_on_the_worker_count(tmp_path: Path) -> None:
    profile, space = small_bimodal_space(tmp_path)
    rules = Rules.of(space, profile)
    tables = CostModel(profile, state_factor=space.state_factor).tables(rules.largest)
    anchors = {v: [stage_cuts(tables, b, space.ranks * v) for b in (1, rules.largest)] for v in rules.stages_per_rank}
    rng = random.Random(0)
    population = [random_genome(rules, anchors, rng) for _ in range(64)]
    score = Scorer(rules, tables, space.memory_limit)
    with workers(1):
        one = score.genome_times(population)
    with workers(2):
        two = score.genome_times(population)
    assert np.array_equal(one[0], two[0]) and np.array_equal(one[1], two[1])


def test_same_seed_same_plan_for_any_worker_count(tmp_path: Path) -> None:
    profile, space = small_bimodal_space(tmp_path)
    one = run_search(replace(space, search=replace(space.search, workers=1)), profile)
    two = run_search(replace(space, search=replace(space.search, workers=2)), profile)
    assert two.best.plan == one.best.plan and two.best.iteration_ms == one.best.iteration_ms
    assert two.generations == one.generations and two.evaluations == one.evaluations
