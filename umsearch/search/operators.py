"""NSGA-II's operators on plan genomes: sampling, crossover, mutation, repair, duplicate elimination.

Each overrides pymoo's ``_do`` and works on object arrays whose one column
holds a :class:`~umsearch.core.plan.Plan`. All randomness comes from the
``random_state`` pymoo passes in, so a seed fixes the whole search.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from pymoo.core.crossover import Crossover
from pymoo.core.duplicate import DuplicateElimination
from pymoo.core.mutation import Mutation
from pymoo.core.problem import Problem
from pymoo.core.repair import Repair
from pymoo.core.sampling import Sampling

from umsearch.core.plan import Plan
from umsearch.core.samples import cumulative
from umsearch.search.genome import Rules, repair
from umsearch.search.moves import Genes, cut_move, neighbour, random_shape


def _rng(kwargs: dict[str, Any]) -> np.random.Generator:
    rng = kwargs.get("random_state")
    if rng is None:  # pymoo always passes one; this keeps direct calls deterministic too
        rng = np.random.default_rng(0)
    return rng


def _column(plans: Sequence[Plan]) -> np.ndarray:
    X = np.empty((len(plans), 1), dtype=object)
    for i, p in enumerate(plans):
        X[i, 0] = p
    return X


def random_plan(rules: Rules, anchors: Sequence[Sequence[int]], rng: np.random.Generator) -> Plan:
    """A random plan near one of the ``anchors`` (good cut vectors), usually one ramp on every stage."""
    g = Genes.of_cuts(list(anchors[int(rng.integers(len(anchors)))]), rules)
    for _ in range(int(rng.integers(0, 3))):
        cut_move(g, rules, rng)
    shared = random_shape(rules, rng)
    for s in range(rules.stages):
        g.forward[s] = list(shared if rng.random() < 0.7 else random_shape(rules, rng))
        g.backward[s] = list(g.forward[s])
        g.warmup[s] = rules.stages - s + int(rng.integers(0, 3))
        g.recompute[s] = rules.recompute and rng.random() < 0.1
    return g.to_plan(rules)


class PlanSampling(Sampling):
    """The seed plans (baselines) first, then random ramp-shaped plans around good cuts."""

    def __init__(self, rules: Rules, seeds: Sequence[Plan], anchors: Sequence[Sequence[int]]) -> None:
        super().__init__()
        self.rules, self.seeds, self.anchors = rules, [repair(p, rules) for p in seeds], anchors

    def _do(self, problem: Problem, n_samples: int, *args: Any, **kwargs: Any) -> np.ndarray:
        rng = _rng(kwargs)
        plans = self.seeds[:n_samples]
        while len(plans) < n_samples:
            plans.append(random_plan(self.rules, self.anchors, rng))
        return _column(plans)


def splice(a: Sequence[int], b: Sequence[int], x: int) -> list[int]:
    """``a``'s microbatches for samples ``[0, x)`` then ``b``'s for ``[x, B)``, cut at sample ``x``."""
    ca, cb = cumulative(a), cumulative(b)
    head = [v for v, end in zip(a, ca[1:], strict=True) if end <= x]
    done = sum(head)
    if done < x:
        head.append(x - done)
    tail = [v for v, start in zip(b, cb[:-1], strict=True) if start >= x]
    rest = (sum(b) - x) - sum(tail)
    return head + ([rest] if rest else []) + tail


class PlanCrossover(Crossover):
    """Two parents, two children: stage-wise uniform, or a splice of every list at one sample.

    The stage-wise form mixes whole stages (and each cut) of the parents; the
    splice form keeps one parent's cuts and warmups and joins the head of one
    parent's microbatch lists to the tail of the other's.
    """

    def __init__(self, rules: Rules, prob: float = 0.9) -> None:
        super().__init__(n_parents=2, n_offsprings=2, prob=prob)
        self.rules = rules

    def _do(self, problem: Problem, X: np.ndarray, *args: Any, **kwargs: Any) -> np.ndarray:
        rng = _rng(kwargs)
        _, n_matings, _ = X.shape
        Y = np.empty_like(X)
        for k in range(n_matings):
            a, b = Genes.of(X[0, k, 0]), Genes.of(X[1, k, 0])
            c, d = self._uniform(a, b, rng) if rng.random() < 0.5 else self._splice(a, b, rng)
            Y[0, k, 0], Y[1, k, 0] = c.to_plan(self.rules), d.to_plan(self.rules)
        return Y

    def _uniform(self, a: Genes, b: Genes, rng: np.random.Generator) -> tuple[Genes, Genes]:
        c, d = a.copy(), b.copy()
        for s in range(self.rules.stages):
            if rng.random() < 0.5:
                c.take_stage(b, s)
                d.take_stage(a, s)
        for i in range(1, len(a.cuts) - 1):
            if rng.random() < 0.5:
                c.cuts[i], d.cuts[i] = b.cuts[i], a.cuts[i]
        return c, d

    def _splice(self, a: Genes, b: Genes, rng: np.random.Generator) -> tuple[Genes, Genes]:
        x = int(rng.integers(1, self.rules.batch)) if self.rules.batch > 1 else 1
        c, d = a.copy(), b.copy()
        for s in range(self.rules.stages):
            c.forward[s], d.forward[s] = splice(a.forward[s], b.forward[s], x), splice(b.forward[s], a.forward[s], x)
            c.backward[s], d.backward[s] = splice(a.backward[s], b.backward[s], x), splice(b.backward[s], a.backward[s], x)
        return c, d


class PlanMutation(Mutation):
    """One random move (sometimes two or three) from :mod:`umsearch.search.moves`."""

    def __init__(self, rules: Rules, prob: float = 0.9) -> None:
        super().__init__(prob=prob)
        self.rules = rules

    def _do(self, problem: Problem, X: np.ndarray, *args: Any, **kwargs: Any) -> np.ndarray:
        rng = _rng(kwargs)
        Y = np.empty_like(X)
        for i in range(len(X)):
            Y[i, 0] = neighbour(X[i, 0], self.rules, rng, moves=int(rng.geometric(0.6)))
        return Y


class PlanRepair(Repair):
    """Every genome made valid under the space's rules (operators repair already; this guards the rest)."""

    def __init__(self, rules: Rules) -> None:
        super().__init__()
        self.rules = rules

    def _do(self, problem: Problem, X: np.ndarray, **kwargs: Any) -> np.ndarray:
        return _column([repair(row[0], self.rules) for row in X])


class PlanDuplicates(DuplicateElimination):
    """Equal plans are duplicates; found by hashing, linear in the population."""

    def _do(self, pop: Any, other: Any, is_duplicate: np.ndarray) -> np.ndarray:
        seen = {ind.X[0] for ind in other} if other is not None else set()
        for i, ind in enumerate(pop):
            if ind.X[0] in seen:
                is_duplicate[i] = True
            else:
                seen.add(ind.X[0])
        return is_duplicate
