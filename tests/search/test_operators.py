"""NSGA-II's operators and the moves under them: valid children, exact splices, real duplicates."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from pymoo.core.population import Population

from tests.search.helpers import assert_obeys, rules_st
from tests.strategies import partitions
from umsearch.core.plan import Plan, uniform_plan
from umsearch.search.genome import Rules
from umsearch.search.moves import neighbour
from umsearch.search.operators import (
    PlanCrossover,
    PlanDuplicates,
    PlanMutation,
    PlanRepair,
    PlanSampling,
    random_plan,
    splice,
)


def _rules() -> Rules:
    return Rules(num_layers=8, stages=3, batch=24, sizes=tuple(range(1, 13)), max_count=12, schedule="any",
                 recompute=True)  # fmt: skip


def _column(*plans: Plan) -> np.ndarray:
    X = np.empty((len(plans), 1), dtype=object)
    for i, p in enumerate(plans):
        X[i, 0] = p
    return X


def test_splice_examples() -> None:
    assert splice([4, 4, 4], [6, 6], 6) == [4, 2, 6]
    assert splice([4, 4, 4], [6, 6], 4) == [4, 2, 6]
    assert splice([4, 4, 4], [6, 6], 8) == [4, 4, 4]
    assert splice([1, 11], [12], 1) == [1, 11]


@settings(max_examples=200, deadline=None)
@given(st.integers(2, 30).flatmap(lambda b: st.tuples(partitions(b, 8), partitions(b, 8), st.integers(1, b - 1))))
def test_splice_keeps_each_side(args: tuple[tuple[int, ...], tuple[int, ...], int]) -> None:
    a, b, x = args
    out = splice(a, b, x)
    assert sum(out) == sum(a) and all(v >= 1 for v in out)
    bounds = set(np.cumsum(out).tolist())
    assert x in bounds  # cut exactly at x
    assert {c for c in np.cumsum(a).tolist() if c < x} <= bounds  # a's boundaries before x survive
    assert {c for c in np.cumsum(b).tolist() if c > x} <= bounds  # b's after x survive


@settings(max_examples=60, deadline=None)
@given(rules_st(), st.integers(0, 2**32 - 1))
def test_random_plans_and_neighbours_obey_the_rules(rules: Rules, seed: int) -> None:
    rng = np.random.default_rng(seed)
    anchors = [[0, *range(1, rules.stages), rules.num_layers]]
    plan = random_plan(rules, anchors, rng)
    assert_obeys(plan, rules)
    for _ in range(10):
        plan = neighbour(plan, rules, rng, moves=int(rng.integers(1, 4)))
        assert_obeys(plan, rules)


def test_crossover_mutation_repair_give_valid_children() -> None:
    rules = _rules()
    rng = np.random.default_rng(7)
    parents = [random_plan(rules, [[0, 2, 5, 8], [0, 3, 6, 8]], rng) for _ in range(40)]
    X = np.empty((2, 20, 1), dtype=object)
    for k in range(20):
        X[0, k, 0], X[1, k, 0] = parents[2 * k], parents[2 * k + 1]
    kids = PlanCrossover(rules)._do(None, X, random_state=rng)
    assert kids.shape == (2, 20, 1)
    mutated = PlanMutation(rules)._do(None, kids.reshape(-1, 1), random_state=rng)
    repaired = PlanRepair(rules)._do(None, mutated)
    for row in repaired:
        assert_obeys(row[0], rules)
    assert len({row[0] for row in mutated}) > 30  # the operators vary plans, not copy them


def test_uniform_crossover_takes_whole_stages() -> None:
    rules = Rules(num_layers=6, stages=2, batch=8, sizes=tuple(range(1, 9)), max_count=8, schedule="any",
                  recompute=False)  # fmt: skip
    a, b = uniform_plan([0, 2, 6], 8, 2, "1f1b"), uniform_plan([0, 4, 6], 8, 4, "gpipe")
    X = np.empty((2, 1, 1), dtype=object)
    X[0, 0, 0], X[1, 0, 0] = a, b
    seen = set()
    for seed in range(40):
        kids = PlanCrossover(rules)._do(None, X, random_state=np.random.default_rng(seed))
        for kid in kids[:, 0, 0]:
            assert_obeys(kid, rules)
            seen |= {(s, st_.forward) for s, st_ in enumerate(kid.stages)}
    # Either parent's whole stage turns up at either position, and so do splices of the two.
    assert {(0, (4, 4)), (0, (2, 2, 2, 2)), (1, (4, 4)), (1, (2, 2, 2, 2))} <= seen
    assert any(fwd not in ((4, 4), (2, 2, 2, 2)) for _, fwd in seen)


def test_sampling_starts_with_the_seeds_and_is_deterministic() -> None:
    rules = _rules()
    seed_plan = uniform_plan([0, 3, 5, 8], 24, 6, "1f1b")
    sampling = PlanSampling(rules, [seed_plan], [[0, 3, 5, 8]])
    a = sampling._do(None, 12, random_state=np.random.default_rng(3))
    b = sampling._do(None, 12, random_state=np.random.default_rng(3))
    assert a[0, 0] == seed_plan
    assert [r[0] for r in a] == [r[0] for r in b]
    for row in a:
        assert_obeys(row[0], rules)


def test_duplicates_are_found_within_and_against_others() -> None:
    p, q = uniform_plan([0, 4, 8], 8, 2, "gpipe"), uniform_plan([0, 4, 8], 8, 4, "gpipe")
    pop = Population.new("X", _column(p, q, p))
    other = Population.new("X", _column(q))
    dup = PlanDuplicates()._do(pop, None, np.zeros(3, dtype=bool))
    assert dup.tolist() == [False, False, True]
    dup = PlanDuplicates()._do(pop, other, np.zeros(3, dtype=bool))
    assert dup.tolist() == [False, True, True]
