"""NSGA-II's operators on genomes: sampling, crossover, mutation, repair, duplicate elimination.

Each overrides pymoo's ``_do`` and works on object arrays whose one column
holds a :class:`~umsearch.search.genome.Genome`. All randomness comes from the
``random_state`` pymoo passes in, so a seed fixes the whole search.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from pymoo.core.crossover import Crossover
from pymoo.core.duplicate import DuplicateElimination
from pymoo.core.mutation import Mutation
from pymoo.core.problem import Problem
from pymoo.core.repair import Repair
from pymoo.core.sampling import Sampling

from umsearch.core.samples import cumulative
from umsearch.search.genome import POLICY_COUNT, Genome, Rules, default_rank_caps, genome_of, repair
from umsearch.search.moves import Genes, cut_move, neighbour, random_shape

Anchors = Mapping[int, Sequence[tuple[int, ...]]]
"""Per chunks-per-rank count, good cut vectors to sample around."""


def _rng(kwargs: dict[str, Any]) -> random.Random:
    """A fast Python generator seeded from the numpy one pymoo passes (so the seed still fixes all)."""
    state = kwargs.get("random_state")
    if state is None:  # pymoo always passes one; this keeps direct calls deterministic too
        state = np.random.default_rng(0)
    return random.Random(int(state.integers(2**63)))


def _geometric(rng: random.Random, p: float) -> int:
    """Trials up to the first success (1, 2, ...), success chance ``p``."""
    n = 1
    while rng.random() >= p:
        n += 1
    return n


def _column(genomes: Sequence[Genome]) -> np.ndarray:
    X = np.empty((len(genomes), 1), dtype=object)
    for i, g in enumerate(genomes):
        X[i, 0] = g
    return X


def random_genome(rules: Rules, anchors: Anchors, rng: random.Random) -> Genome:
    """A random genome near good cuts: a random structure, usually one ramp-shaped list on every
    stage, random split and knobs around the 1F1B-like defaults."""
    v = int(rules.stages_per_rank[rng.randrange(len(rules.stages_per_rank))])
    kind = rules.placements[rng.randrange(len(rules.placements))]
    cuts_options = anchors[v]
    genes = Genes.of(genome_of(rules, v, kind, cuts_options[rng.randrange(len(cuts_options))],
                               [random_shape(rules, rng)] * (rules.ranks * v)))  # fmt: skip
    for _ in range(rng.randrange(0, 3)):
        cut_move(genes, rules, rng)
    shared = genes.forward[0]
    genes.fresh = None
    for j in range(len(genes.forward)):
        genes.recompute[j] = rules.recompute and rng.random() < 0.05
        genes.set_list(genes.forward, j, shared if rng.random() < 0.7 else random_shape(rules, rng))
        genes.backward[j] = genes.forward[j]
    genes.split = [rules.split and rng.random() < 0.5] * len(genes.split)
    genes.rank_cap = [max(1, int(c * rng.choice([0.5, 0.75, 1.0, 1.0, 1.5, 2.0])))
                      for c in default_rank_caps(rules, v, genes.forward)]  # fmt: skip
    genes.w_cap = [rng.randrange(1, 4) for _ in genes.w_cap]
    genes.policy = [rng.randrange(POLICY_COUNT)] * len(genes.policy)
    return genes.to_genome(rules)


class GenomeSampling(Sampling):
    """The seed genomes first (the first pass's best), then random genomes around good cuts."""

    def __init__(self, rules: Rules, seeds: Sequence[Genome], anchors: Anchors) -> None:
        super().__init__()
        self.rules, self.seeds, self.anchors = rules, [repair(g, rules) for g in seeds], anchors

    def _do(self, problem: Problem, n_samples: int, *args: Any, **kwargs: Any) -> np.ndarray:
        rng = _rng(kwargs)
        out = list(dict.fromkeys(self.seeds))[:n_samples]
        while len(out) < n_samples:
            out.append(random_genome(self.rules, self.anchors, rng))
        return _column(out)


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


class GenomeCrossover(Crossover):
    """Two parents, two children: stage-wise uniform, or a splice of every list at one sample.

    Parents of different structure (chunks per rank, placement) exchange only
    their rank knobs; parents of the same structure also mix whole stages and
    cuts, or join the head of one parent's lists to the tail of the other's.
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
            if (a.v, a.placement) != (b.v, b.placement):
                c, d = self._knobs(a, b, rng)
            elif rng.random() < 0.5:
                c, d = self._uniform(a, b, rng)
            else:
                c, d = self._splice(a, b, rng)
            Y[0, k, 0], Y[1, k, 0] = c.to_genome(self.rules), d.to_genome(self.rules)
        return Y

    @staticmethod
    def _knobs(a: Genes, b: Genes, rng: random.Random) -> tuple[Genes, Genes]:
        c, d = a.copy(), b.copy()
        for r in range(len(a.w_cap)):
            if rng.random() < 0.5:
                c.w_cap[r], d.w_cap[r] = b.w_cap[r], a.w_cap[r]
                c.rank_cap[r], d.rank_cap[r] = b.rank_cap[r], a.rank_cap[r]
                c.policy[r], d.policy[r] = b.policy[r], a.policy[r]
        return c, d

    def _uniform(self, a: Genes, b: Genes, rng: random.Random) -> tuple[Genes, Genes]:
        c, d = a.copy(), b.copy()
        for j in range(len(a.forward)):
            if rng.random() < 0.5:
                for name in ("forward", "backward", "recompute", "split", "cap"):
                    ca, cb = getattr(c, name), getattr(d, name)
                    ca[j], cb[j] = getattr(b, name)[j], getattr(a, name)[j]
        for i in range(1, len(a.cuts) - 1):
            if rng.random() < 0.5:
                c.cuts[i], d.cuts[i] = b.cuts[i], a.cuts[i]
        return c, d

    def _splice(self, a: Genes, b: Genes, rng: random.Random) -> tuple[Genes, Genes]:
        x = rng.randrange(1, self.rules.batch) if self.rules.batch > 1 else 1
        c, d = a.copy(), b.copy()
        c.fresh = d.fresh = None
        for j in range(len(a.forward)):
            c.forward[j], d.forward[j] = tuple(splice(a.forward[j], b.forward[j], x)), tuple(splice(b.forward[j], a.forward[j], x))
            c.backward[j], d.backward[j] = tuple(splice(a.backward[j], b.backward[j], x)), tuple(splice(b.backward[j], a.backward[j], x))
        return c, d


class GenomeMutation(Mutation):
    """One random move (sometimes two or three) from :mod:`umsearch.search.moves`."""

    def __init__(self, rules: Rules, prob: float = 0.9) -> None:
        super().__init__(prob=prob)
        self.rules = rules

    def _do(self, problem: Problem, X: np.ndarray, *args: Any, **kwargs: Any) -> np.ndarray:
        rng = _rng(kwargs)
        return _column([neighbour(row[0], self.rules, rng, moves=_geometric(rng, 0.6)) for row in X])


class GenomeRepair(Repair):
    """Every genome made valid under the space's rules (operators repair already; this guards the rest)."""

    def __init__(self, rules: Rules) -> None:
        super().__init__()
        self.rules = rules

    def _do(self, problem: Problem, X: np.ndarray, **kwargs: Any) -> np.ndarray:
        return _column([repair(row[0], self.rules) for row in X])


class GenomeDuplicates(DuplicateElimination):
    """Equal genomes are duplicates; found by hashing, linear in the population."""

    def _do(self, pop: Any, other: Any, is_duplicate: np.ndarray) -> np.ndarray:
        seen = {ind.X[0] for ind in other} if other is not None else set()
        for i, ind in enumerate(pop):
            if ind.X[0] in seen:
                is_duplicate[i] = True
            else:
                seen.add(ind.X[0])
        return is_duplicate
