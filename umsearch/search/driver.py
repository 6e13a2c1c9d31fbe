"""Run one search: baselines, NSGA-II over plan genomes, local polish, the chosen plan and its front."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from pymoo.algorithms.moo.nsga2 import NSGA2

from umsearch.core.cost import CostModel
from umsearch.core.errors import NoFeasiblePlanError
from umsearch.core.plan import Plan
from umsearch.core.profile import Profile
from umsearch.search.baselines import bottleneck_cuts, equal_plans, greedy_baseline, range_costs
from umsearch.search.bound import lower_bound
from umsearch.search.genome import Rules, cuts_of
from umsearch.search.local import ClimbConfig, Step, iterated_climb
from umsearch.search.operators import (
    PlanCrossover,
    PlanDuplicates,
    PlanMutation,
    PlanRepair,
    PlanSampling,
)
from umsearch.search.problem import PlanProblem
from umsearch.search.scoring import Scored, Scorer
from umsearch.search.space import SearchSpace

POLISH = ClimbConfig()
"""The local search's effort (see :class:`~umsearch.search.local.ClimbConfig`)."""


@dataclass(frozen=True, kw_only=True)
class Progress:
    """What the search reports as it goes."""

    phase: str
    """``baselines``, ``nsga2`` or ``polish``."""
    generation: int
    """NSGA-II generations done."""
    best_ms: float
    """Fastest feasible iteration time so far (inf while none)."""
    feasible: int
    """Feasible plans in the current population."""
    evaluations: int
    """Plans scored so far."""
    elapsed_s: float


@dataclass(frozen=True, kw_only=True)
class SearchResult:
    best: Scored
    """Fastest feasible plan (never slower than a feasible baseline)."""
    pareto: list[Scored]
    """Non-dominated feasible plans, fastest first."""
    baselines: dict[str, Scored | None]
    """Each baseline, None where none fits the memory limit."""
    lower_bound_ms: float
    generations: int
    evaluations: int
    wall_s: float
    interrupted: bool
    """Ctrl-C stopped the search early."""
    budget_hit: bool
    """The time budget stopped the search early (the result then depends on machine speed)."""


def _front(items: list[Scored]) -> list[Scored]:
    """Non-dominated items (time, memory), fastest first; the first of equal plans kept."""
    items = sorted(items, key=lambda s: (s.iteration_ms, s.max_memory))
    out: list[Scored] = []
    for it in items:
        if not out or it.max_memory < out[-1].max_memory:
            out.append(it)
    return out


def _anchors(cost: CostModel, space: SearchSpace, baselines: dict[str, Scored | None]) -> list[list[int]]:
    """Cut vectors to sample around: the baselines' and the balanced cuts at a few microbatch sizes."""
    out = [cuts_of(b.plan) for b in baselines.values() if b is not None]
    B = space.global_batch
    for b in sorted({space.microbatch_sizes[0], space.microbatch_sizes[len(space.microbatch_sizes) // 2],
                     space.microbatch_sizes[-1]}):  # fmt: skip
        out.append(bottleneck_cuts(cost, space.stages, range_costs(cost, b, B / b)))
    unique: list[list[int]] = []
    for c in out:
        if c not in unique:
            unique.append(c)
    return unique


def _no_fit(plans: list[Plan], score: Scorer, limit: float) -> NoFeasiblePlanError:
    """The error for a search where nothing fits, naming the least memory seen and its stage."""
    where = ""
    if plans:
        sc = score(plans)
        live = np.flatnonzero(~sc.deadlock)
        if len(live):
            i = int(live[np.argmin(sc.max_memory[live])])
            where = f"; the smallest peak memory found is {sc.max_memory[i]:.0f} bytes, on stage {int(np.argmax(sc.memory[i]))}"
    return NoFeasiblePlanError(f"no plan fits memory_limit = {limit:.0f} bytes{where}; "
                               "raise the limit, add stages or allow recompute")  # fmt: skip


def _baselines(cost: CostModel, space: SearchSpace) -> tuple[dict[str, Scored | None], list[Plan]]:
    """The baselines, and the plans to seed NSGA-II with.

    Seeds are the baselines of the allowed families, then the fastest equal
    plans of other microbatch counts: distinct basins for the search to start from.
    """
    equal = {name: equal_plans(cost, space, name) for name in ("gpipe", "1f1b")}
    baselines: dict[str, Scored | None] = {
        name: min(plans, key=lambda s: s.iteration_ms, default=None) for name, plans in equal.items()
    }
    ref = baselines["gpipe"] or baselines["1f1b"]
    cuts = cuts_of(ref.plan) if ref else list(np.linspace(0, cost.num_layers, space.stages + 1).astype(int))
    baselines["greedy"] = greedy_baseline(cost, space, cuts)
    seeds = [b.plan for name, b in baselines.items() if b is not None and space.schedule in ("any", name)]
    others = sorted((s for name, ps in equal.items() if space.schedule in ("any", name) for s in ps),
                    key=lambda s: s.iteration_ms)  # fmt: skip
    seeds += [s.plan for s in others if s.plan not in seeds][: max(0, space.population // 4 - len(seeds))]
    return baselines, seeds


def _climb_starts(plans: list[Plan], score: Scorer, limit: float) -> list[Scored]:
    """The fastest distinct feasible plans, at most ``POLISH.starts``."""
    starts: list[Scored] = []
    for s in sorted(score.feasible(plans, limit), key=lambda s: (s.iteration_ms, s.max_memory)):
        if len(starts) < POLISH.starts and all(s.plan != t.plan for t in starts):
            starts.append(s)
    return starts


def run_search(space: SearchSpace, profile: Profile, on_progress: Callable[[Progress], None] | None = None) -> SearchResult:
    """Search ``space``; Ctrl-C stops early and still returns the best found.

    Baselines, then NSGA-II from a population seeded with them, then an
    iterated local search from the fastest distinct plans found. Deterministic
    for a seed unless the time budget cuts the search short (``budget_hit``).
    """
    start = time.perf_counter()
    deadline = start + space.time_budget_s
    rules = Rules.of(space, profile.num_layers)
    cost = CostModel(profile, state_factor=space.state_factor, b_max=space.global_batch)
    limit = space.memory_limit
    score = Scorer(cost)
    gen = 0
    best_ms = math.inf

    def report(phase: str, feasible: int = 0) -> None:
        if on_progress is not None:
            on_progress(Progress(phase=phase, generation=gen, best_ms=best_ms, feasible=feasible,
                                 evaluations=score.count, elapsed_s=time.perf_counter() - start))  # fmt: skip

    report("baselines")
    baselines, seeds = _baselines(cost, space)
    algo = NSGA2(pop_size=space.population, sampling=PlanSampling(rules, seeds, _anchors(cost, space, baselines)),
                 crossover=PlanCrossover(rules), mutation=PlanMutation(rules), repair=PlanRepair(rules),
                 eliminate_duplicates=PlanDuplicates())  # fmt: skip
    algo.setup(PlanProblem(score, limit), termination=("n_gen", space.generations), seed=space.seed, verbose=False)
    found: list[Plan] = []
    interrupted = budget_hit = False
    try:
        while gen < space.generations:
            if budget_hit := time.perf_counter() > deadline:
                break
            algo.next()
            gen += 1
            F, G = algo.pop.get("F"), algo.pop.get("G")
            ok = np.all(G <= 0, axis=1)
            best_ms = float(F[ok, 0].min()) if ok.any() else math.inf
            report("nsga2", int(ok.sum()))
        found = [row[0] for row in algo.pop.get("X")]
        rng = np.random.default_rng(space.seed)

        def accepted(step: Step) -> None:
            nonlocal best_ms
            found.append(step.plan)  # kept at once, so Ctrl-C during the polish loses nothing
            best_ms = min(best_ms, step.iteration_ms)
            report("polish")

        for s in _climb_starts(found, score, limit):
            iterated_climb(Step(plan=s.plan, iteration_ms=s.iteration_ms, peak_memory_bytes=s.peak_memory_bytes),
                           score, rules, limit, rng, POLISH, deadline, accepted)  # fmt: skip
        budget_hit = time.perf_counter() > deadline  # climbs stop at the deadline too
    except KeyboardInterrupt:
        interrupted = True
        if not found and algo.pop is not None:
            found = [row[0] for row in algo.pop.get("X")]
    scored = score.feasible(found, limit)
    scored += [Scored(name="umsearch", plan=b.plan, iteration_ms=b.iteration_ms, peak_memory_bytes=b.peak_memory_bytes)
               for b in baselines.values() if b is not None]  # fmt: skip
    pareto = _front(scored)
    if not pareto:
        raise _no_fit(found or seeds, score, limit)
    return SearchResult(best=pareto[0], pareto=pareto, baselines=baselines, lower_bound_ms=lower_bound(cost, space),
                        generations=gen, evaluations=score.count, wall_s=time.perf_counter() - start,
                        interrupted=interrupted, budget_hit=budget_hit)  # fmt: skip
