"""Run one search: baselines, a first pass over structures, NSGA-II over genomes, polish, the front.

1. Baselines (:mod:`~umsearch.search.baselines`): every peer schedule at its
   best microbatch count and partition, and the local greedy plan.
2. First pass: a fixed grid of structures (chunks per rank, placement, split
   or not, equal microbatch counts on balanced cuts, a few knob settings),
   scored by the order generator. It does not depend on the seed, so every
   seed starts from the same basins; every baseline's plan joins it as a
   genome.
3. NSGA-II (pymoo) seeded with the fastest genomes so far, objectives time
   and the fullest rank's memory, constraint the memory limit, until it
   converges (:mod:`~umsearch.search.convergence`; ``generations`` is a
   ceiling).
4. Iterated local search from the best genome of each of the fastest
   structures and from the best genomes made of the peers' plans.

``[search] workers`` threads score each batch of candidates
(:mod:`~umsearch.search.workers`); the plan does not depend on how many.

The result is the fastest feasible plan among everything scored, baselines
included, so it is never slower than a baseline. With a ``[cluster]`` the same
steps run per factorization R x D (:mod:`~umsearch.search.over_cluster`). Deterministic for a seed
unless the time budget cuts the search short (``budget_hit``); Ctrl-C keeps
what was found. The steps and their state are :class:`~umsearch.search.pipeline_search.Run`'s.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from umsearch.core.profile import Profile
from umsearch.errors import NoFeasiblePlanError, ProfileError
from umsearch.search.bound import lower_bound
from umsearch.search.over_cluster import search_cluster
from umsearch.search.pipeline_search import (
    BASELINE_SHARE,
    Progress,
    Run,
    SearchResult,
    pareto_front,
)
from umsearch.search.scoring import Scored
from umsearch.search.space import SearchSpace
from umsearch.search.workers import workers


def run_search(space: SearchSpace, profile: Profile, on_progress: Callable[[Progress], None] | None = None) -> SearchResult:
    """Search ``space``; Ctrl-C stops early and still returns the best found (see the module docstring).
    With a ``[cluster]``, :func:`umsearch.search.over_cluster.search_cluster` chooses R x D too."""
    if not any(t > 0 for lay in profile.layers for t in (*lay.fwd_ms, *lay.bwd_ms)):
        raise ProfileError(f"every layer of the profile ({profile.model}) takes 0 ms at every size: there is no "
                           "time to plan; profile the model again (umsearch profile)")  # fmt: skip
    with workers(space.search.workers):
        if space.cluster is not None:
            return search_cluster(space, profile, on_progress)
        return _search(space, profile, on_progress)


def _search(space: SearchSpace, profile: Profile, on_progress: Callable[[Progress], None] | None) -> SearchResult:
    run = Run(space, profile, on_progress)
    # The baselines get at most half of the budget: past it, their partitions are left unrefined
    # (only huge models get there), so the search itself still has time.
    base = run.baselines(run.start + space.search.time_budget_s * BASELINE_SHARE)
    interrupted = False
    try:
        run.first_pass()
    except KeyboardInterrupt:
        interrupted = True
    interrupted = interrupted or run.evolve(base)
    return _result(run, base, interrupted)


def _result(run: Run, base: dict[str, Scored | None], interrupted: bool) -> SearchResult:
    space, score = run.space, run.score
    budget_hit = run.over()
    items = [b for b in base.values() if b is not None] + run.front()
    ok = [s for s in items if np.isfinite(s.iteration_ms) and s.max_memory <= space.memory_limit]
    pareto = pareto_front(ok, key=lambda s: (s.iteration_ms, s.max_memory))
    if not pareto:
        raise NoFeasiblePlanError(
            f"no plan fits memory_limit = {space.memory_limit:.0f} bytes; raise the limit, add ranks or allow recompute"
        )
    return SearchResult(best=pareto[0], pareto=pareto, baselines=base, lower_bound_ms=lower_bound(run.tables, run.rules),
                        generations=run.generations, evaluations=score.count, wall_s=time.perf_counter() - run.start,
                        interrupted=interrupted, budget_hit=budget_hit)  # fmt: skip
