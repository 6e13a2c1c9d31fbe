"""Run one search: baselines, NSGA-II, the chosen plan and its Pareto front."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from pymoo.algorithms.moo.nsga2 import NSGA2
from pymoo.core.problem import Problem
from pymoo.operators.crossover.sbx import SBX
from pymoo.operators.mutation.pm import PM

from umsearch.cost_model import CostModel
from umsearch.profile import Profile
from umsearch.search.baselines import Scored, equal_baseline, greedy_baseline, lower_bound, score
from umsearch.search.encoding import GENES_PER_STAGE, Encoding
from umsearch.search.problem import PlanProblem, SeededSampling
from umsearch.search.space import SearchSpace

MUTATION_PROB = 0.2
MUTATION_ETA = 15.0


@dataclass(frozen=True, kw_only=True)
class Progress:
    generation: int
    best_ms: float
    feasible: int
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
    wall_s: float
    interrupted: bool
    smallest_memory: tuple[float, int] | None
    """When nothing fits: the least peak memory seen and the stage holding it."""


def _front(items: list[Scored]) -> list[Scored]:
    items = sorted(items, key=lambda s: (s.iteration_ms, s.max_memory))
    out: list[Scored] = []
    for it in items:
        if not out or it.max_memory < out[-1].max_memory:
            out.append(it)
    return out


def _best_feasible(problem: Problem, X: np.ndarray) -> tuple[int, float]:
    out = problem.evaluate(X, return_as_dictionary=True)
    t = np.where(np.all(out["G"] <= 0, axis=1), out["F"][:, 0], np.inf)
    i = int(np.argmin(t))
    return i, float(t[i])


def polish(problem: Problem, enc: Encoding, X: np.ndarray, sweeps: int = 3) -> np.ndarray:
    """Coordinate descent on the fastest feasible genome, one stage's genes at a time.

    NSGA-II finds the region; this tries, per stage, every microbatch size with a
    few head sizes and warmups (one batch evaluation per stage), keeping any gain.
    """
    i, best_t = _best_feasible(problem, X)
    if not np.isfinite(best_t):
        return X[:0]
    x = X[i].copy()
    grid = (np.arange(len(enc.sizes)) + 0.5) / len(enc.sizes)
    heads = np.array([0.25, 0.5, 0.75, 1.0 - 1e-9])
    warms = np.array([0.0, 0.5, 1.0 - 1e-9])
    for _ in range(sweeps):
        improved = False
        for s in range(enc.stages):
            o = enc.stages - 1 + GENES_PER_STAGE * s
            combos = np.array(np.meshgrid(grid, heads, warms, indexing="ij")).reshape(3, -1).T
            cand = np.repeat(x[None, :], len(combos), axis=0)
            cand[:, o : o + 3] = combos
            j, t = _best_feasible(problem, cand)
            if t < best_t * (1 - 1e-12):
                x, best_t, improved = cand[j], t, True
        if not improved:
            break
    return x[None, :]


def run_search(space: SearchSpace, profile: Profile, on_progress: Callable[[Progress], None] | None = None) -> SearchResult:
    """Search ``space``; Ctrl-C stops early and still returns the best found."""
    start = time.perf_counter()
    cost = CostModel(profile, state_factor=space.state_factor, b_max=space.global_batch)
    if space.stages > profile.num_layers:
        from umsearch.errors import SearchSpaceError

        raise SearchSpaceError(f"stages = {space.stages} but the profile has only {profile.num_layers} layers; use at most {profile.num_layers}")
    baselines: dict[str, Scored | None] = {
        "gpipe": equal_baseline(cost, space, "gpipe"),
        "1f1b": equal_baseline(cost, space, "1f1b"),
    }
    ref = baselines["gpipe"] or baselines["1f1b"]
    cuts = [st.lo for st in ref.plan.stages] + [profile.num_layers] if ref else list(np.linspace(0, profile.num_layers, space.stages + 1).astype(int))
    baselines["greedy"] = greedy_baseline(cost, space, cuts)
    enc = Encoding(num_layers=profile.num_layers, stages=space.stages, batch=space.global_batch,
                   sizes=tuple(space.microbatch_sizes), max_count=space.max_microbatches,
                   schedule=space.schedule, recompute=space.recompute)  # fmt: skip
    seeds = []
    for name in ("gpipe", "1f1b"):
        b = baselines[name]
        if b is not None and space.schedule in ("any", name):
            seeds.append(enc.encode_uniform([st.lo for st in b.plan.stages] + [profile.num_layers], b.plan.stages[0].forward[0], name))
    problem: Problem = PlanProblem(enc, cost, space.memory_limit)
    algo = NSGA2(pop_size=space.population, sampling=SeededSampling(np.array(seeds).reshape(len(seeds), enc.length)),
                 crossover=SBX(prob=0.9, eta=10), mutation=PM(prob=MUTATION_PROB, eta=MUTATION_ETA), eliminate_duplicates=True)  # fmt: skip
    algo.setup(problem, termination=("n_gen", space.generations), seed=space.seed, verbose=False)
    interrupted = False
    gen = 0
    try:
        while algo.has_next() and gen < space.generations:
            algo.next()
            gen += 1
            F, G = algo.pop.get("F"), algo.pop.get("G")
            ok = np.all(G <= 0, axis=1)
            if on_progress is not None:
                on_progress(Progress(generation=gen, best_ms=float(F[ok, 0].min()) if ok.any() else math.inf,
                                     feasible=int(ok.sum()), elapsed_s=time.perf_counter() - start))  # fmt: skip
            if time.perf_counter() - start > space.time_budget_s:
                break
    except KeyboardInterrupt:
        interrupted = True
    X = algo.pop.get("X") if algo.pop is not None else np.empty((0, enc.length))
    if len(X) and not interrupted:
        X = np.vstack([X, polish(problem, enc, X)])
    candidates = [enc.decode(x) for x in X]
    scored = []
    least: tuple[float, int] | None = None
    if candidates:
        for plan, (t, mem) in zip(candidates, score(candidates, cost), strict=True):
            if math.isfinite(t):
                if least is None or max(mem) < least[0]:
                    least = (max(mem), int(np.argmax(mem)))
                if max(mem) <= space.memory_limit:
                    scored.append(Scored(name="umsearch", plan=plan, iteration_ms=t, peak_memory_bytes=mem))
    scored += [Scored(name="umsearch", plan=b.plan, iteration_ms=b.iteration_ms, peak_memory_bytes=b.peak_memory_bytes)
               for b in baselines.values() if b is not None]  # fmt: skip
    pareto = _front(scored)
    if not pareto:
        from umsearch.errors import NoFeasiblePlanError

        where = f"; the smallest peak memory found is {least[0]:.0f} bytes, on stage {least[1]}" if least else ""
        raise NoFeasiblePlanError(f"no plan fits memory_limit = {space.memory_limit:.0f} bytes{where}; raise the limit, add stages or allow recompute")
    return SearchResult(best=pareto[0], pareto=pareto, baselines=baselines, lower_bound_ms=lower_bound(cost, space),
                        generations=gen, wall_s=time.perf_counter() - start, interrupted=interrupted,
                        smallest_memory=least)  # fmt: skip
