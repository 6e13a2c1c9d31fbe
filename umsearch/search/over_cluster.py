"""Search over a cluster: choose R x D, the layout and ZeRO-1, and within that everything else.

1. **Factorizations** (:mod:`~umsearch.search.factorize`): every R dividing the
   devices, both layouts where they differ; pruned before any search when R
   exceeds the layers, D does not divide B, the smallest possible stage does
   not fit (even with ZeRO-1) or the replica's batch breaks the space's
   microbatch rules.
2. **Screen**: each factorization gets an equal share of the baselines'
   budget for every peer schedule at its best count and partition (every
   replica runs it; the all-reduces included) and the first pass of the
   single-pipeline search, all scored exactly by the evaluator.
3. **Search**: the most promising factorizations (by the fastest plan
   screening found: the :data:`SEARCHED` fastest, and every other where
   memory binds within :data:`SEARCH_MARGIN` of the fastest) get NSGA-II and the polish, each an
   equal share of the time left.
4. ZeRO-1 stays only on plans that do not fit without it.

Deterministic for a seed unless the time budget cuts something short.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from umsearch.core.cost import CostModel, CostTables
from umsearch.core.profile import Profile
from umsearch.errors import NoFeasiblePlanError, SearchSpaceError
from umsearch.search.bound import lower_bound
from umsearch.search.factorize import (
    ClusterPlacement,
    Factorization,
    Memory,
    Pruned,
    factorizations,
)
from umsearch.search.genome import Rules
from umsearch.search.pipeline_search import (
    BASELINE_SHARE,
    CLUSTER_POLISH,
    Outcome,
    Progress,
    Run,
    SearchResult,
    pareto_front,
)
from umsearch.search.scoring import Scored
from umsearch.search.space import MAX_RANKS, SearchSpace
from umsearch.sim.population import encode, evaluate, pack

SEARCHED = 3
"""Factorizations that get NSGA-II and the polish after screening at least (the fastest screened ones)."""
SEARCH_MARGIN = 0.15
"""Every factorization where memory binds and screened within this fraction of the fastest screened one is
searched too. There the screen's equal microbatches must all fit the stage whose stash peaks, so it undersells
the factorizations that unequal lists free the most: on the 24-block H200 GPT at 16 GiB per GPU, R = 1 x D = 16
screened at 474.1 ms (11.5% behind the best screened, fourth) and, searched, reached 415.7 ms, faster than
every torch schedule that fits (425.2 ms). Where memory is free the margin bought nothing and cost time: the
128 x 8 example searched more factorizations for the same plan in 236 s instead of 76."""


def memory_of(space: SearchSpace, profile: Profile) -> Memory:
    """What pruning needs of the profile and the space."""
    return Memory(param_bytes=tuple(lay.param_bytes for lay in profile.layers),
                  stash_bytes=tuple(lay.stash_bytes for lay in profile.layers),
                  state_factor=space.state_factor, limit=space.memory_limit,
                  tied_bytes=sum((len(t.layers) - 1) * t.bytes for t in profile.tied_weights),
                  stash_fixed_bytes=tuple(lay.stash_fixed_bytes for lay in profile.layers))  # fmt: skip


def replica_space(space: SearchSpace, f: Factorization) -> SearchSpace:
    """The single-pipeline space of one replica: ``R`` ranks, ``B / D`` samples, no cluster."""
    return replace(space, ranks=f.ranks, global_batch=space.global_batch // f.replicas, cluster=None)


def plan_factorizations(space: SearchSpace, profile: Profile) -> tuple[list[Factorization], list[Pruned]]:
    """:func:`~umsearch.search.factorize.factorizations` for the space, plus those whose replica batch
    the space's microbatch rules cannot split (pruned with the rules' own message)."""
    c = space.cluster
    assert c is not None
    keep, pruned = factorizations(c.devices, space.global_batch, profile.num_layers, c.cluster,
                                  memory_of(space, profile), max_ranks=MAX_RANKS, ranks=space.ranks)  # fmt: skip
    ok = []
    for f in keep:
        try:
            Rules.of(replica_space(space, f), profile)
        except SearchSpaceError as exc:
            pruned.append(Pruned(factorization=f, reason=str(exc)))
            continue
        ok.append(f)
    return ok, pruned


def search_cluster(space: SearchSpace, profile: Profile,
                   on_progress: Callable[[Progress], None] | None = None) -> SearchResult:  # fmt: skip
    """Search every factorization of ``space.cluster`` worth it (see the module docstring)."""
    assert space.cluster is not None
    start = time.perf_counter()
    deadline = start + space.search.time_budget_s
    keep, pruned = plan_factorizations(space, profile)
    if not keep:
        why = "; ".join(f"{p.factorization.label}: {p.reason}" for p in pruned[:3])
        raise NoFeasiblePlanError(f"no factorization of the cluster's {space.cluster.devices} devices can hold the "
                                  f"model ({why}); raise memory_limit, add nodes or allow recompute")  # fmt: skip
    runs, bases = [], []
    searched: set[int] = set()
    interrupted = False
    share = space.search.time_budget_s * BASELINE_SHARE / len(keep)
    try:
        for i, f in enumerate(keep):
            run = Run(replica_space(space, f), profile, on_progress,
                      ClusterPlacement(factorization=f, cluster=space.cluster.cluster, batch=space.global_batch),
                      start=start, deadline=deadline, effort=CLUSTER_POLISH)  # fmt: skip
            base = run.baselines(time.perf_counter() + share)
            run = _widened(run, base, space, profile, on_progress, f, start, deadline)
            runs.append(run)
            bases.append(base)
            run.first_pass()
            run.report("screen", i + 1, len(keep))
        order = promising([_screened_ms(run, base) for run, base in zip(runs, bases, strict=True)],
                          [run.rules.memory_binds for run in runs])  # fmt: skip
        for k, i in enumerate(order):
            now = time.perf_counter()
            runs[i].deadline = now + max(0.0, deadline - now) / (len(order) - k)
            searched.add(i)
            if runs[i].evolve(bases[i]):
                interrupted = True
                break
    except KeyboardInterrupt:
        if not runs:  # nothing scored yet: as a search stopped during its baselines
            raise
        interrupted = True
    return _merge(space, profile, keep[: len(runs)], runs, bases, searched, pruned, start, interrupted)


def promising(screened_ms: Sequence[float], binds: Sequence[bool]) -> list[int]:
    """Indices of the factorizations to search, fastest screened first: the :data:`SEARCHED` fastest and every
    other where memory binds (``binds``) within :data:`SEARCH_MARGIN` of the fastest."""
    order = sorted(range(len(screened_ms)), key=lambda i: (screened_ms[i], i))
    if not order:
        return []
    near = screened_ms[order[0]] * (1 + SEARCH_MARGIN)
    return [i for k, i in enumerate(order) if k < SEARCHED or (binds[i] and screened_ms[i] <= near < math.inf)]


def peer_stage_counts(run: Run, base: dict[str, Scored | None]) -> tuple[int, ...]:
    """Stage counts per rank of the feasible peers that the run's space leaves out (the baselines cover
    every count torch accepts; where memory binds, the best peer often holds more chunks per rank)."""
    R = run.rules.ranks
    got = {b.plan.num_stages // R for n, b in base.items() if b is not None and b.plan.num_stages % R == 0}
    return tuple(sorted(got - set(run.rules.stages_per_rank)))


def _widened(run: Run, base: dict[str, Scored | None], space: SearchSpace, profile: Profile,
             on_progress: Callable[[Progress], None] | None, f: Factorization, start: float,
             deadline: float) -> Run:  # fmt: skip
    """``run``, or where a peer found its best plan at a stage count per rank the space leaves out, a run
    whose structures include it: the search starts from every peer's plan and may improve on it."""
    extra = peer_stage_counts(run, base)
    if not extra:
        return run
    rs = replica_space(space, f)
    spr = tuple(sorted({*rs.schedule.stages_per_rank, *extra}))
    wide = Run(replace(rs, schedule=replace(rs.schedule, stages_per_rank=spr)), profile, on_progress,
               run.placement, start=start, deadline=deadline, effort=run.effort)  # fmt: skip
    wide.best_ms, wide.cut = run.best_ms, run.cut
    wide.score.count += run.score.count
    return wide


def _screened_ms(run: Run, base: dict[str, Scored | None]) -> float:
    return min([run.best_ms, *(b.iteration_ms for b in base.values() if b is not None)])


def unshard(s: Scored, tables: CostTables, limit: float) -> Scored:
    """``s`` without ZeRO-1 where it fits without (ZeRO-1 changes memory only, docs/model.md 9); ``tables``
    cover the plan's largest microbatch."""
    if not s.plan.zero1:
        return s
    plan = replace(s.plan, zero1=False)
    res = evaluate(pack([encode(plan)]), tables)
    if not res.max_memory_bytes[0] <= limit:
        return s
    return replace(s, plan=plan, peak_memory_bytes=tuple(float(v) for v in res.ranks_of(0, res.peak_memory_bytes)))


def _best_peers(fs: list[Factorization], bases: list[dict[str, Scored | None]]) -> dict[str, Scored | None]:
    """Each baseline's fastest plan over every factorization, its method naming the factorization."""
    out: dict[str, Scored | None] = {}
    for f, base in zip(fs, bases, strict=True):
        for name, b in base.items():
            old = out.get(name)
            if b is not None and (old is None or b.iteration_ms < old.iteration_ms):
                out[name] = replace(b, method=f"{f.label}: {b.method}")
            else:
                out.setdefault(name, None)
    return out


def _merge(space: SearchSpace, profile: Profile, fs: list[Factorization], runs: list[Run],
           bases: list[dict[str, Scored | None]], searched: set[int], pruned: list[Pruned], start: float,
           interrupted: bool) -> SearchResult:  # fmt: skip
    tables = CostModel(profile, state_factor=space.state_factor).tables(max(r.rules.largest for r in runs))
    limit = space.memory_limit
    outcomes, items = [], []
    for i, (f, run, base) in enumerate(zip(fs, runs, bases, strict=True)):
        front = run.front()
        items += front
        best_peer = min((b for n, b in base.items() if b is not None and n != "local greedy"),
                        key=lambda b: b.iteration_ms, default=None)  # fmt: skip
        outcomes.append(Outcome(factorization=f, umsearch_ms=min((s.iteration_ms for s in front), default=math.inf),
                                peer=best_peer, searched=i in searched, evaluations=run.score.count))  # fmt: skip
    peers = {n: None if b is None else unshard(b, tables, limit) for n, b in _best_peers(fs, bases).items()}
    items += [b for b in peers.values() if b is not None]
    ok = [unshard(s, tables, limit) for s in items if np.isfinite(s.iteration_ms) and s.max_memory <= limit]
    pareto = pareto_front(ok, key=lambda s: (s.iteration_ms, s.max_memory))
    if not pareto:
        raise NoFeasiblePlanError(f"no plan fits memory_limit = {limit:.0f} bytes on any factorization of the "
                                  "cluster; raise the limit, add nodes or allow recompute")  # fmt: skip
    bound = min(lower_bound(run.score.placement.bound_tables(run.tables), run.rules)  # type: ignore[union-attr]
                for run in runs)  # fmt: skip
    return SearchResult(best=pareto[0], pareto=pareto, baselines=peers, lower_bound_ms=bound,
                        generations=sum(r.generations for r in runs), evaluations=sum(r.score.count for r in runs),
                        wall_s=time.perf_counter() - start, interrupted=interrupted,
                        budget_hit=any(r.cut for r in runs), factorizations=tuple(outcomes),
                        pruned=tuple(pruned))  # fmt: skip
