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
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import TypeVar

import numpy as np
from pymoo.algorithms.moo.nsga2 import NSGA2

from umsearch.core.cost import CostModel, CostTables
from umsearch.core.plan import equal_split
from umsearch.core.profile import Profile
from umsearch.search.baselines import baselines, counts
from umsearch.search.chains import Chain, ChainPool, chain_seed
from umsearch.search.convergence import Convergence
from umsearch.search.factorize import ClusterPlacement, Factorization, Pruned
from umsearch.search.genome import POLICY_COUNT, Genome, Rules, genome_of, repair
from umsearch.search.local import ClimbConfig, Memo, Step, refine
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
from umsearch.search.workers import worker_count


@dataclass(frozen=True, kw_only=True)
class Effort:
    """How hard the polish works after NSGA-II."""

    climb: ClimbConfig
    """Each climb's effort (see :class:`~umsearch.search.local.ClimbConfig`)."""
    peer_starts: int
    """The fastest genomes made of the peers' plans that the first round also climbs from."""
    refine_share: float = 0.0
    """The polish ends with :func:`~umsearch.search.local.refine` from the best genome, scoring at most this
    share of the plans the search scored before it (0: no refine)."""


KICKS_PER_STALL = 5
"""A climb jumps at most this many times its stall (``[search] polish_stall``) in all."""


REFINE_SHARE = 0.15
""":attr:`Effort.refine_share` of a single pipeline's polish: on simnet1 (about 500k plans a search) the refines
that gained found their plan within 35k-52k plans; on the two-regime profile and gpt24_h200 (seeds 0-9) no refine
gained, and each ran to its budget."""


def polish_effort(stall: int) -> Effort:
    """The polish on one pipeline: a climb jumps until ``stall`` jumps in a row found nothing (on gpt_cpu 12 left
    4 of seeds 0-9 over 0.5% behind the best, 40 none), the peers' plans are starts of their own, and the best
    genome is refined."""
    climb = ClimbConfig(kicks=KICKS_PER_STALL * stall, stall=stall)
    return Effort(climb=climb, peer_starts=2, refine_share=REFINE_SHARE)


CLUSTER_POLISH = Effort(climb=ClimbConfig(descent_margin=-1.0), peer_starts=0)
"""The polish on each factorization a cluster search searches: the lighter one (each candidate is scored on
every replica, and three factorizations are polished), its jumps' climbs without list descents (only each chain's
first climb descends: with the default margin the 128 x 8 example of 96 blocks ran into the 120 s budget and
returned a slower plan, 522.7 ms against 505.9)."""
T = TypeVar("T")
FIRST_PASS_COUNTS = 12
"""Equal microbatch counts per structure in the first pass (spread over the allowed ones)."""
Structure = tuple[int, str]
"""(chunks per rank, placement): the basins the stopping rule and the polish tell apart."""


def structure(g: Genome) -> Structure:
    """``g``'s structure (the placement only matters with several chunks per rank)."""
    return (g.v, g.placement if g.v > 1 else "loop")


@dataclass(frozen=True, kw_only=True)
class Progress:
    """What the search reports as it goes."""

    phase: str
    """``baselines``, ``first pass``, ``nsga2``, ``polish`` or ``refine`` (on a cluster also ``screen``:
    factorizations screened)."""
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


def baseline_genomes(rules: Rules, base: dict[str, Scored | None]) -> list[Genome]:
    """Every feasible baseline's plan as a genome (its structure, cuts, lists, recompute and split) with each
    order policy, where the space's rules allow its structure: the search starts from every peer's plan."""
    out: list[Genome] = []
    for b in base.values():
        if b is None or b.plan.num_stages % rules.ranks:
            continue
        plan, v = b.plan, b.plan.num_stages // rules.ranks
        ranks = tuple(st.rank for st in plan.stages)
        kind = next((k for k in ("loop", "vshape") if rules.placement_of(v, k) == ranks), None)
        if kind is None or v not in rules.stages_per_rank or (v > 1 and kind not in rules.placements):
            continue
        cuts = (*(st.lo for st in plan.stages), plan.stages[-1].hi)
        g = genome_of(rules, v, kind, cuts, [st.forward for st in plan.stages], split=rules.split and any(plan.uses_split),
                      recompute=[st.recompute and rules.recompute for st in plan.stages],
                      backward=[st.backward for st in plan.stages])  # fmt: skip
        out += [_scaled(g, 1.0, rules, p) for p in range(POLICY_COUNT)]
    return list(dict.fromkeys(out))


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
                 placement: ClusterPlacement | None = None, start: float | None = None,
                 deadline: float | None = None, effort: Effort | None = None) -> None:  # fmt: skip
        self.space, self.on_progress, self.placement = space, on_progress, placement
        self.effort = polish_effort(space.search.polish_stall) if effort is None else effort
        self.start = time.perf_counter() if start is None else start
        self.deadline = self.start + space.search.time_budget_s if deadline is None else deadline
        self.rules = Rules.of(space, profile)
        self.tables = CostModel(profile, state_factor=space.state_factor).tables(self.rules.largest)
        self.score = Scorer(self.rules, self.tables, space.memory_limit, placement)
        self.found: dict[Genome, tuple[float, float]] = {}  # feasible genome -> (time, memory)
        self.best_ms = math.inf
        self.by_structure: dict[Structure, float] = {}
        """The fastest feasible time found of each structure."""
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
                k = structure(g)
                self.by_structure[k] = min(float(t), self.by_structure.get(k, math.inf))

    def step(self, g: Genome) -> Step:
        """A genome found (feasible) as a local search's step."""
        return Step(genome=g, iteration_ms=self.found[g][0], max_memory_bytes=self.found[g][1])

    def keep_steps(self, steps: Sequence[Step]) -> None:
        """:meth:`keep` of a local search's steps."""
        self.keep([st.genome for st in steps], np.array([st.iteration_ms for st in steps]),
                  np.array([st.max_memory_bytes for st in steps]))  # fmt: skip

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
        """NSGA-II until it converges, then the polish rounds; True if Ctrl-C stopped it."""
        try:
            seeds = baseline_genomes(self.rules, base)
            if seeds:
                self.keep(seeds, *self.score.genome_times(seeds))
            peers = sorted((g for g in seeds if g in self.found), key=lambda g: self.found[g])
            if not self.over():
                _nsga2(self, _anchors(self.rules, self.tables, base))
            self.polish(peers[: self.effort.peer_starts])
        except KeyboardInterrupt:
            return True
        return False

    def polish(self, extra: list[Genome]) -> None:
        """Rounds of iterated local search from the best genome of each of the fastest structures (the first
        round also from ``extra``), while a round improves; each round's chains run side by side
        (:mod:`umsearch.search.chains`), each on its own random stream."""
        cfg = self.space.search
        with ChainPool(self.score, self.rules, self.effort.climb, worker_count(cfg.workers)) as pool:
            for r in range(cfg.polish_rounds):
                before = self.best_ms
                starts = self.starts(self.effort.climb.starts)
                if r == 0:  # the peers' plans are basins of their own, often next to the best one
                    starts = list(dict.fromkeys(starts + extra))
                if self.over():
                    break
                chains = [Chain(start=self.step(g), seed=chain_seed(cfg.seed, r, i)) for i, g in enumerate(starts)]
                results = pool.run(chains, self.deadline, partial(self.report, "polish", total=len(chains)))
                for res in results:
                    self.keep_steps(res.steps)
                if self.over() or not self.best_ms < before * (1 - 1e-9):
                    break
        if self.effort.refine_share > 0 and self.found and not self.over():
            self.refine(self.effort.refine_share * self.score.count)

    def refine(self, budget: float) -> None:
        """:func:`~umsearch.search.local.refine` from the fastest genome found, scoring at most ``budget`` plans."""
        g = self.fastest(1)[0]
        self.report("refine", 0, 1)
        steps: list[Step] = []
        try:
            refine(self.step(g), Memo(self.score), self.rules, budget, self.deadline, steps.append)
        finally:  # what it found before a Ctrl-C is kept
            self.keep_steps(steps)
        self.report("refine", 1, 1)

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
            out.setdefault(structure(g), g)
        return list(out.values())[:n]


def _nsga2(run: Run, anchors: Anchors) -> None:
    """NSGA-II from the fastest genomes found so far until :class:`Convergence` says it has converged."""
    space, rules, score = run.space, run.rules, run.score
    cfg = space.search
    seeds = run.fastest(max(1, cfg.population // 3))
    algo = NSGA2(pop_size=cfg.population, sampling=GenomeSampling(rules, seeds, anchors),
                 crossover=GenomeCrossover(rules), mutation=GenomeMutation(rules), repair=GenomeRepair(rules),
                 eliminate_duplicates=GenomeDuplicates())  # fmt: skip
    algo.setup(GenomeProblem(score), termination=("n_gen", cfg.generations), seed=cfg.seed, verbose=False)
    rule: Convergence[Structure] = Convergence(stall=cfg.stall_generations, tolerance=cfg.tolerance, ceiling=cfg.generations)
    try:
        while not rule.done() and not run.over():
            algo.next()
            run.generations += 1
            X, F = algo.pop.get("X"), algo.pop.get("F")
            run.keep([row[0] for row in X], F[:, 0], F[:, 1])
            rule.record(run.generations, run.by_structure)
            run.report("nsga2", run.generations, cfg.generations)
    finally:
        if algo.pop is not None:
            X, F = algo.pop.get("X"), algo.pop.get("F")
            if len(F):
                run.keep([row[0] for row in X], F[:, 0], F[:, 1])
