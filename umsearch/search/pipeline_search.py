"""One pipeline's search and what a search reports: the state both drivers share.

:class:`Run` is one search over one pipeline's space: the baselines, the first
pass over a fixed grid of structures, NSGA-II and the polish, and every
feasible genome it scored. :mod:`~umsearch.search.driver` runs one for a
single pipeline; :mod:`~umsearch.search.over_cluster` runs one per R x D
factorization. Both report :class:`Progress`, keep the non-dominated plans
(:func:`pareto_front`) and return a :class:`SearchResult`. What they share lives
here so that the driver may hand a cluster to ``over_cluster`` without
``over_cluster`` importing the driver back.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TypeVar

import numpy as np
from pymoo.algorithms.moo.nsga2 import NSGA2

from umsearch.core.cost import CostModel, CostTables
from umsearch.core.plan import equal_split
from umsearch.core.profile import Profile
from umsearch.search.baselines import baselines, counts
from umsearch.search.factorize import Factorization, Placement, Pruned
from umsearch.search.genome import POLICY_COUNT, Genome, Rules, genome_of, repair
from umsearch.search.local import ClimbConfig, Step, iterated_climb
from umsearch.search.operators import (
    Anchors,
    GenomeCrossover,
    GenomeDuplicates,
    GenomeMutation,
    GenomeRepair,
    GenomeSampling,
)
from umsearch.search.partition import stage_cuts
from umsearch.search.problem import GenomeProblem
from umsearch.search.scoring import Scored, Scorer
from umsearch.search.space import SearchSpace

POLISH = ClimbConfig()
"""The local search's effort (see :class:`~umsearch.search.local.ClimbConfig`)."""
T = TypeVar("T")
FIRST_PASS_COUNTS = 12
"""Equal microbatch counts per structure in the first pass (spread over the allowed ones)."""


@dataclass(frozen=True, kw_only=True)
class Progress:
    """What the search reports as it goes."""

    phase: str
    """``baselines``, ``first pass``, ``nsga2`` or ``polish`` (on a cluster also ``screen``: factorizations
    screened)."""
    done: int
    """Steps of the phase done: baselines scored, generations run, climbs finished."""
    total: int
    """Steps of the phase in all."""
    best_ms: float
    """Fastest feasible iteration time so far (inf while none)."""
    evaluations: int
    """Candidates scored so far."""
    elapsed_s: float
    """Seconds since the search began."""


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """What the search found for one factorization."""

    factorization: Factorization
    umsearch_ms: float
    """Fastest feasible searched plan (inf: none)."""
    peer: Scored | None
    """Fastest feasible torch schedule on it (None: none fits)."""
    searched: bool
    """Whether it got NSGA-II and the polish (else screening only)."""
    evaluations: int
    """Candidates it scored."""


@dataclass(frozen=True, kw_only=True)
class SearchResult:
    """What a search found."""

    best: Scored
    """Fastest feasible plan (never slower than a feasible baseline)."""
    pareto: list[Scored]
    """Non-dominated feasible plans (time, fullest rank's memory), fastest first."""
    baselines: dict[str, Scored | None]
    """Each baseline, None where none fits the memory limit."""
    lower_bound_ms: float
    """No plan of the space is faster than this."""
    generations: int
    """NSGA-II generations run."""
    evaluations: int
    """Candidates scored."""
    wall_s: float
    """Seconds the search took."""
    interrupted: bool
    """Ctrl-C stopped the search early."""
    budget_hit: bool
    """The time budget stopped the search early (the result then depends on machine speed)."""
    factorizations: tuple[Outcome, ...] = ()
    """On a cluster: what each factorization searched found (empty without a cluster)."""
    pruned: tuple[Pruned, ...] = ()
    """On a cluster: the factorizations left out before searching, and why."""


def _spread(values: list[int], n: int) -> list[int]:
    """At most ``n`` of ``values`` (ascending), evenly spread, ends included."""
    if len(values) <= n:
        return values
    return sorted({values[round(i * (len(values) - 1) / (n - 1))] for i in range(n)})


def _anchors(rules: Rules, tables: CostTables, base: dict[str, Scored | None]) -> Anchors:
    """Per chunks-per-rank count: the baselines' cuts and the balanced cuts at a few sizes."""
    out: dict[int, list[tuple[int, ...]]] = {}
    sizes = sorted({rules.sizes[0], rules.sizes[len(rules.sizes) // 2], rules.largest})
    for v in rules.stages_per_rank:
        S = rules.ranks * v
        cuts = [(0, *[st.lo for st in b.plan.stages[1:]], rules.num_layers) for b in base.values()
                if b is not None and b.plan.num_stages == S]  # fmt: skip
        cuts += [stage_cuts(tables, b, S) for b in sizes]
        out[v] = list(dict.fromkeys(cuts))
    return out


def first_pass(rules: Rules, tables: CostTables) -> list[Genome]:
    """The fixed grid of structures (see the module docstring), repaired."""
    out = []
    for v in rules.stages_per_rank:
        for kind in rules.placements if v > 1 else ("loop",):
            for m in _spread(counts(rules), FIRST_PASS_COUNTS):
                lists = [equal_split(rules.batch, m)] * (rules.ranks * v)
                cuts = stage_cuts(tables, -(-rules.batch // m), rules.ranks * v)
                for split in (False, True) if rules.split else (False,):
                    g = genome_of(rules, v, kind, cuts, lists, split=split)
                    out += [_scaled(g, f, rules, p) for f in (1.0, 1.5) for p in range(POLICY_COUNT)]
    return list(dict.fromkeys(out))


def _scaled(g: Genome, factor: float, rules: Rules, policy: int) -> Genome:
    return repair(replace(g, rank_cap=tuple(max(1, int(c * factor)) for c in g.rank_cap),
                          policy=(policy,) * rules.ranks), rules)  # fmt: skip


def pareto_front(items: list[T], key: Callable[[T], tuple[float, float]]) -> list[T]:
    """Non-dominated items by ``key`` (time, memory), fastest first; the first of equal ones kept."""
    out: list[T] = []
    for it in sorted(items, key=key):
        if not out or key(it)[1] < key(out[-1])[1]:
            out.append(it)
    return out


BASELINE_SHARE = 0.5
"""Share of the time budget the baselines may use before they stop refining partitions."""


class Run:
    """One search's state: what it scored and found, and how it reports.

    On a cluster there is one per factorization: ``space`` is then one replica's (its ranks and
    ``B / D``), ``placement`` makes its candidates data-parallel plans, and ``start`` / ``deadline``
    are the factorization's share of the time budget."""

    def __init__(self, space: SearchSpace, profile: Profile, on_progress: Callable[[Progress], None] | None,
                 placement: Placement | None = None, start: float | None = None,
                 deadline: float | None = None) -> None:  # fmt: skip
        self.space, self.on_progress, self.placement = space, on_progress, placement
        self.start = time.perf_counter() if start is None else start
        self.deadline = self.start + space.search.time_budget_s if deadline is None else deadline
        self.rules = Rules.of(space, profile)
        self.tables = CostModel(profile, state_factor=space.state_factor).tables(self.rules.largest)
        self.score = Scorer(self.rules, self.tables, space.memory_limit, placement)
        self.found: dict[Genome, tuple[float, float]] = {}  # feasible genome -> (time, memory)
        self.best_ms = math.inf
        self.generations = 0
        self.cut = False
        """Whether the time budget stopped some of its work (set by :meth:`over` and :meth:`baselines`)."""

    def report(self, phase: str, done: int, total: int) -> None:
        if self.on_progress is not None:
            self.on_progress(Progress(phase=phase, done=done, total=total, best_ms=self.best_ms,
                                      evaluations=self.score.count, elapsed_s=time.perf_counter() - self.start))  # fmt: skip

    def keep(self, genomes: list[Genome], times: np.ndarray, mems: np.ndarray) -> None:
        for g, t, m in zip(genomes, times, mems, strict=True):
            if np.isfinite(t) and m <= self.space.memory_limit:
                self.found[g] = (float(t), float(m))
                self.best_ms = min(self.best_ms, float(t))

    def over(self) -> bool:
        if time.perf_counter() > self.deadline:
            self.cut = True
            return True
        return False

    def baselines(self, until: float) -> dict[str, Scored | None]:
        """Every peer's best plan and the local greedy one; partitions are left unrefined past ``until``."""
        space = self.space
        self.report("baselines", 0, len(space.schedule.peers) + 1)

        def stop() -> bool:
            if time.perf_counter() > until:
                self.cut = True
            return time.perf_counter() > until

        base = baselines(space, self.rules, self.score, self.tables, stop=stop,
                         tick=lambda done, total: self.report("baselines", done, total))  # fmt: skip
        for b in base.values():
            if b is not None:
                self.best_ms = min(self.best_ms, b.iteration_ms)
        return base

    def first_pass(self) -> None:
        """Score the fixed grid of structures (:func:`first_pass`)."""
        grid = first_pass(self.rules, self.tables)
        self.report("first pass", 0, 1)
        t, m = self.score.genome_times(grid)
        self.keep(grid, t, m)
        self.report("first pass", 1, 1)

    def evolve(self, base: dict[str, Scored | None]) -> bool:
        """NSGA-II, then the polish rounds; True if Ctrl-C stopped it."""
        space, rules, score = self.space, self.rules, self.score
        try:
            if not self.over():
                _nsga2(self, _anchors(rules, self.tables, base))
            rng = random.Random(space.search.seed)
            for _ in range(space.search.polish_rounds):
                # Another round from the (new) best of each structure, while a round still improves.
                before = self.best_ms
                starts = self.starts(POLISH.starts)
                for i, g in enumerate(starts):
                    if self.over():
                        break
                    t0, m0 = self.found[g]
                    iterated_climb(Step(genome=g, iteration_ms=t0, max_memory_bytes=m0), score, rules, rng, POLISH,
                                   self.deadline, lambda s: self.keep([s.genome], np.array([s.iteration_ms]),
                                                                      np.array([s.max_memory_bytes])))  # fmt: skip
                    self.report("polish", i + 1, len(starts))
                if self.over() or not self.best_ms < before * (1 - 1e-9):
                    break
        except KeyboardInterrupt:
            return True
        return False

    def front(self) -> list[Scored]:
        """The non-dominated genomes found, as plans (fastest first)."""
        return [self.score.scored_genome(g, "umsearch", "order generator")
                for g in pareto_front(list(self.found), key=lambda g: self.found[g])]  # fmt: skip

    def fastest(self, n: int) -> list[Genome]:
        return [g for g, _ in sorted(self.found.items(), key=lambda kv: kv[1])[:n]]

    def starts(self, n: int) -> list[Genome]:
        """The fastest genome of each structure (chunks per rank, placement), fastest first, at most
        ``n``: the polish explores different basins rather than one basin twice."""
        out: dict[tuple[int, str], Genome] = {}
        for g, _ in sorted(self.found.items(), key=lambda kv: kv[1]):
            out.setdefault((g.v, g.placement if g.v > 1 else "loop"), g)
        return list(out.values())[:n]


def _nsga2(run: Run, anchors: Anchors) -> None:
    space, rules, score = run.space, run.rules, run.score
    seeds = run.fastest(max(1, space.search.population // 3))
    algo = NSGA2(pop_size=space.search.population, sampling=GenomeSampling(rules, seeds, anchors),
                 crossover=GenomeCrossover(rules), mutation=GenomeMutation(rules), repair=GenomeRepair(rules),
                 eliminate_duplicates=GenomeDuplicates())  # fmt: skip
    algo.setup(GenomeProblem(score), termination=("n_gen", space.search.generations), seed=space.search.seed, verbose=False)
    try:
        while run.generations < space.search.generations and not run.over():
            algo.next()
            run.generations += 1
            X, F = algo.pop.get("X"), algo.pop.get("F")
            run.keep([row[0] for row in X], F[:, 0], F[:, 1])
            run.report("nsga2", run.generations, space.search.generations)
    finally:
        if algo.pop is not None:
            X, F = algo.pop.get("X"), algo.pop.get("F")
            if len(F):
                run.keep([row[0] for row in X], F[:, 0], F[:, 1])
