"""Baselines: torch's own orders, at their best count and partition, honest about how they were found."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.strategies import uniform_profile
from umsearch.core.cluster import Cluster
from umsearch.core.cost import CostModel
from umsearch.core.profile import Link
from umsearch.core.schedules import PEER_SCHEDULES
from umsearch.measure.synthetic import bimodal_profile
from umsearch.search.baselines import EXACT_LIMIT, baselines, counts, shapes, stage_counts
from umsearch.search.factorize import ClusterPlacement, Factorization
from umsearch.search.genome import Rules
from umsearch.search.partition import (
    all_cuts,
    balanced_cuts,
    count_cuts,
    descend,
    neighbours,
    stage_cuts,
    stage_work,
)
from umsearch.search.scoring import Scorer
from umsearch.search.space import build_space
from umsearch.sim.population import encode


def _setup(profile, **kw):  # type: ignore[no-untyped-def]
    values = {"profile": "p.json", "ranks": 2, "global_batch": 8, **kw}
    space = build_space(values)
    rules = Rules.of(space, profile)
    tables = CostModel(profile, space.state_factor).tables(rules.largest)
    return space, rules, Scorer(rules, tables, space.memory_limit), tables


def test_each_peer_runs_torchs_order_at_its_best_choice() -> None:
    """Small enough for the exact search: every baseline is the fastest of all its choices."""
    profile = bimodal_profile(layers=6)
    space, rules, score, tables = _setup(profile, stages_per_rank=[1, 2])
    base = baselines(space, rules, score, tables)
    for name, peer in PEER_SCHEDULES.items():
        b = base[name]
        assert b is not None and "best of all" in b.method
        brute = min(
            float(score.plans([s.on(c)])[0][0])
            for s in shapes(peer, rules) for c in all_cuts(rules.num_layers, rules.ranks * s.v)
        )  # fmt: skip
        assert b.iteration_ms == pytest.approx(brute, rel=1e-12)
        v = b.plan.num_stages // rules.ranks
        m = len(b.plan.stages[0].forward)
        assert b.plan.actions == peer.generate(rules.ranks, v, m)


def test_counts_respect_the_space() -> None:
    rules = Rules(num_layers=4, ranks=2, batch=20, sizes=tuple(range(3, 9)), max_count=5, stages_per_rank=(1,),
                  placements=("loop",), split=False, recompute=False)  # fmt: skip
    assert counts(rules) == [4, 5]  # 20/4 = 5, 20/5 = 4; 20/2 = 10 is too large; 3 does not divide 20


def test_zero_bubble_needs_the_split() -> None:
    space, rules, score, tables = _setup(uniform_profile(4, split=False), stages_per_rank=[1, 2])
    base = baselines(space, rules, score, tables)
    assert base["ZBVZeroBubble"] is None and base["InterleavedZeroBubble"] is None
    assert base["1F1B"] is not None


def _bottleneck(work: np.ndarray, cuts: tuple[int, ...]) -> float:
    return max(float(work[b] - work[a]) for a, b in itertools.pairwise(cuts))


def test_balanced_cuts_is_the_exact_bottleneck() -> None:
    profile = bimodal_profile(layers=7)
    tables = CostModel(profile).tables(8)
    work = stage_work(tables, 4)
    for S in (1, 2, 3, 4, 7):
        dp = balanced_cuts(work, S)
        brute = min(all_cuts(7, S), key=lambda c: _bottleneck(work, c))
        assert len(dp) == S + 1 and dp[0] == 0 and dp[-1] == 7 and all(a < b for a, b in itertools.pairwise(dp))
        assert _bottleneck(work, dp) == pytest.approx(_bottleneck(work, brute))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.5, 10.0]), min_size=1, max_size=9), st.integers(1, 9))
def test_balanced_cuts_matches_brute_force(weights: list[float], stages: int) -> None:
    stages = min(stages, len(weights))
    work = np.concatenate([[0.0], np.cumsum(weights)])
    dp = balanced_cuts(work, stages)
    brute = min(all_cuts(len(weights), stages), key=lambda c: _bottleneck(work, c))
    assert all(a < b for a, b in itertools.pairwise(dp)) and len(dp) == stages + 1
    assert _bottleneck(work, dp) == pytest.approx(_bottleneck(work, brute))


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_stage_cuts_is_the_exact_scaled_bottleneck(data: st.DataObject) -> None:
    """With docs/model.md (version 2.1)'s stage scale and ranges, the DP's bottleneck equals brute force's."""
    import dataclasses

    from tests.strategies import v21_terms
    from umsearch.core.profile import RuntimeCosts

    profile = bimodal_profile(layers=data.draw(st.integers(2, 8)))
    L = profile.num_layers
    profile = dataclasses.replace(profile, runtime=RuntimeCosts(**data.draw(v21_terms(L))))
    tables = CostModel(profile).tables(4)
    stages = data.draw(st.integers(1, L))
    work = stage_work(tables, 4)

    def scaled(cuts: tuple[int, ...]) -> float:
        return max(float((work[b] - work[a]) * tables.stage_scale(a, b)[0]) for a, b in itertools.pairwise(cuts))

    dp = stage_cuts(tables, 4, stages)
    assert len(dp) == stages + 1 and dp[0] == 0 and dp[-1] == L and all(a < b for a, b in itertools.pairwise(dp))
    assert scaled(dp) == pytest.approx(min(scaled(c) for c in all_cuts(L, stages)))


def test_descent_reaches_a_local_optimum() -> None:
    target = (0, 2, 5, 9)
    score = lambda cs: np.array([sum(abs(a - b) for a, b in zip(c, target, strict=False)) for c in cs], dtype=float)  # noqa: E731
    cuts, t = descend([(0, 1, 2, 9)], score)
    assert cuts == target and t == 0.0
    assert all(score([n])[0] >= t for n in neighbours(cuts))


def test_large_spaces_say_their_partition_is_a_local_optimum() -> None:
    profile = bimodal_profile(layers=32)
    space, rules, score, tables = _setup(profile, ranks=4, global_batch=32, stages_per_rank=[2], peers=["Interleaved1F1B"])
    assert count_cuts(32, 8) > EXACT_LIMIT
    b = baselines(space, rules, score, tables)["Interleaved1F1B"]
    assert b is not None and "local optimum" in b.method and "fastest counts" in b.method
    encode(b.plan)  # a valid plan


def test_a_spent_budget_stops_refining_and_every_peer_is_reported() -> None:
    profile = bimodal_profile(layers=32)
    space, rules, score, tables = _setup(profile, ranks=4, global_batch=32, stages_per_rank=[2],
                                         peers=["Interleaved1F1B", "LoopedBFS"])  # fmt: skip
    asked: list[int] = []
    ticks: list[tuple[int, int]] = []

    def stop() -> bool:
        asked.append(1)
        return True

    out = baselines(space, rules, score, tables, stop=stop, tick=lambda d, t: ticks.append((d, t)))
    assert asked and ticks == [(1, 3), (2, 3), (3, 3)]
    for name in ("Interleaved1F1B", "LoopedBFS"):
        b = out[name]
        assert b is not None and "cut short by the time budget" in b.method
        encode(b.plan)
    # Cut short, a baseline is never better than the refined one.
    full = baselines(space, rules, score, tables)["Interleaved1F1B"]
    assert full is not None and full.iteration_ms <= out["Interleaved1F1B"].iteration_ms  # type: ignore[union-attr]


def test_looped_peers_run_every_stage_count_torch_accepts() -> None:
    """Not only the space's stage counts: every v with R * v <= L, and where the bubble is what costs
    (free messages, no overheads), Interleaved1F1B's best uses more than 2 stages per rank."""
    base = uniform_profile(8, stash=0.0)
    linear = tuple(replace(lay, fwd_ms=(1.0, 2.0), bwd_ms=(2.0, 4.0), bwd_input_ms=(1.0, 2.0), bwd_weight_ms=(1.0, 2.0))
                   for lay in base.layers)  # fmt: skip
    profile = replace(base, layers=linear)  # time per sample: only the bubble differs between shapes
    space, rules, score, tables = _setup(profile, stages_per_rank=[1, 2], peers=["Interleaved1F1B", "LoopedBFS"])
    assert stage_counts(PEER_SCHEDULES["Interleaved1F1B"], rules) == [1, 2, 3, 4]
    assert stage_counts(PEER_SCHEDULES["ZBVZeroBubble"], rules) == [2]
    assert stage_counts(PEER_SCHEDULES["1F1B"], rules) == [1]
    b = baselines(space, rules, score, tables)["Interleaved1F1B"]
    assert b is not None and b.plan.num_stages // rules.ranks > 2
    brute = min(float(score.plans([s.on(c)])[0][0]) for s in shapes(PEER_SCHEDULES["Interleaved1F1B"], rules)
                for c in all_cuts(rules.num_layers, rules.ranks * s.v))  # fmt: skip
    assert b.iteration_ms == pytest.approx(brute, rel=1e-12)


def test_peer_stage_counts_space_keeps_the_looped_peers_to_the_spaces_own_counts() -> None:
    """``[schedule] peer_stage_counts = "space"``: the cheaper screen a ~100-layer model may want."""
    _, rules, _, _ = _setup(uniform_profile(8), stages_per_rank=[1, 2], peer_stage_counts="space")
    assert stage_counts(PEER_SCHEDULES["Interleaved1F1B"], rules) == [1, 2]
    assert stage_counts(PEER_SCHEDULES["ZBVZeroBubble"], rules) == [2]


def _least_memory(score: Scorer, peer_name: str, rules: Rules, recompute: bool) -> float:
    out = np.inf
    for s in shapes(PEER_SCHEDULES[peer_name], rules, recompute=recompute):
        mems = score.plans([s.on(c) for c in all_cuts(rules.num_layers, rules.ranks * s.v)])[1]
        out = min(out, float(mems.min()))
    return out


@pytest.mark.parametrize("peer", ["1F1B", "Interleaved1F1B", "ZBVZeroBubble"])
def test_where_only_full_checkpointing_fits_the_peer_checkpoints_every_stage(peer: str) -> None:
    profile = uniform_profile(6, stash=1000.0, params=10.0)
    space, rules, score, tables = _setup(profile, ranks=2, global_batch=8, stages_per_rank=[1, 2], peers=[peer])
    plain, full = _least_memory(score, peer, rules, False), _least_memory(score, peer, rules, True)
    assert full < plain  # a limit between the two: only checkpointing fits
    limit = (full + plain) / 2
    tight = Scorer(rules, tables, limit)
    b = baselines(replace(space, memory_limit=limit), rules, tight, tables)[peer]
    assert b is not None and all(st.recompute for st in b.plan.stages) and "full activation checkpointing" in b.method
    assert b.max_memory <= limit
    free = baselines(space, rules, score, tables)[peer]
    assert free is not None and not any(st.recompute for st in free.plan.stages)


def test_zero1_baselines_fit_where_unsharded_ones_do_not() -> None:
    """On a replica of a data-parallel factorization with ZeRO-1, the peers shard their optimizer
    states: a limit that no unsharded peer plan meets is met."""
    profile = uniform_profile(4, stash=1.0, params=1000.0)
    space, rules, _, tables = _setup(profile, ranks=2, global_batch=8, stages_per_rank=[1, 2], peers=["1F1B"])
    cluster = Cluster(gpus_per_node=2, intra=Link(latency_ms=0.0, bandwidth_gb_per_s=100.0),
                      inter=Link(latency_ms=0.0, bandwidth_gb_per_s=10.0))  # fmt: skip

    def peer(zero1: bool, limit: float):  # type: ignore[no-untyped-def]
        f = Factorization(ranks=2, replicas=4, layout="dp_inner", zero1=zero1)
        where = ClusterPlacement(factorization=f, cluster=cluster, batch=32)
        score = Scorer(rules, tables, limit, where)
        return baselines(replace(space, memory_limit=limit), rules, score, tables)["1F1B"]

    sharded = peer(True, 1e12)
    assert sharded is not None and sharded.plan.zero1
    limit = sharded.max_memory * 1.01
    assert peer(False, limit) is None
    got = peer(True, limit)
    assert got is not None and got.plan.zero1 and got.max_memory <= limit
