"""The polish's local search: a memo of scores changes nothing but how many plans are scored; the list descent
ends where no one-step list edit is faster."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from umsearch.core.cost import CostModel
from umsearch.measure.synthetic import bimodal_profile
from umsearch.search.genome import Rules, repair
from umsearch.search.local import (
    ClimbConfig,
    Memo,
    Step,
    climb,
    descend,
    descend_all,
    iterated_climb,
    refine,
)
from umsearch.search.moves import cut_neighbours, list_edits, list_neighbours, neighbour
from umsearch.search.partition import stage_cuts
from umsearch.search.scoring import Scorer
from umsearch.search.space import build_space

_PROFILE = bimodal_profile(layers=6, seed=2)


def _setup(tmp_path_factory):  # type: ignore[no-untyped-def]
    from umsearch.core.profile import save_profile

    path = tmp_path_factory.mktemp("local") / "p.json"
    save_profile(_PROFILE, path)
    space = build_space({"profile": str(path), "ranks": 2, "global_batch": 16, "max_microbatch": 16})
    rules = Rules.of(space, _PROFILE)
    tables = CostModel(_PROFILE, state_factor=space.state_factor).tables(rules.largest)
    return rules, tables, space.memory_limit


def _start(rules: Rules, score: Scorer) -> Step:
    from umsearch.search.genome import genome_of

    cuts = stage_cuts(score.tables, 4, rules.ranks)
    g = genome_of(rules, 1, "loop", cuts, [(4, 4, 4, 4)] * rules.ranks)
    t, m = score.genome_times([g])
    return Step(genome=g, iteration_ms=float(t[0]), max_memory_bytes=float(m[0]))


def _jumps(rules: Rules, score: Scorer, rng: random.Random, n: int) -> list[Step]:
    """The feasible ones of ``n`` genomes three random moves from :func:`_start`'s, scored."""
    start = _start(rules, score)
    genomes = [neighbour(start.genome, rules, rng, moves=3, valid=True) for _ in range(n)]
    t, m = score.genome_times(genomes)
    return [Step(genome=g, iteration_ms=float(a), max_memory_bytes=float(b))
            for g, a, b in zip(genomes, t, m, strict=True) if np.isfinite(a)]  # fmt: skip


class _Plain(Memo):
    """Scores every genome it is handed, seen before or not (what the polish did before the memo)."""

    def genome_times(self, genomes):  # type: ignore[no-untyped-def]
        return self.score.genome_times(genomes)


def test_memo_answers_as_the_scorer_and_scores_each_genome_once(tmp_path_factory) -> None:  # type: ignore[no-untyped-def]
    rules, tables, limit = _setup(tmp_path_factory)
    score = Scorer(rules, tables, limit)
    start = _start(rules, score)
    rng = random.Random(0)
    genomes = [neighbour(start.genome, rules, rng, moves=1) for _ in range(40)]
    genomes += genomes[:15] + [start.genome]
    memo = Memo(Scorer(rules, tables, limit), size=25)  # small: it also forgets in between
    t1, m1 = memo.genome_times(genomes[:30])
    t2, m2 = memo.genome_times(genomes[30:])
    t, m = score.genome_times(genomes)
    np.testing.assert_array_equal(np.concatenate([t1, t2]), t)
    np.testing.assert_array_equal(np.concatenate([m1, m2]), m)
    assert memo.score.count <= len(set(genomes[:30])) + len(set(genomes[30:]))
    assert memo.genome_times([])[0].shape == (0,)


@settings(max_examples=4, deadline=None)
@given(seed=st.integers(0, 10_000), iterated=st.booleans())
def test_a_climb_with_the_memo_ends_where_one_without_it_does(seed: int, iterated: bool, tmp_path_factory) -> None:  # type: ignore[no-untyped-def]
    rules, tables, limit = _setup(tmp_path_factory)
    config = ClimbConfig(neighbours=24, patience=3, kicks=4, stall=2)
    ends, counts = [], []
    for kind in (Memo, _Plain):
        score = Scorer(rules, tables, limit)
        run = iterated_climb if iterated else climb
        ends.append(run(_start(rules, score), kind(score), rules, random.Random(seed), config))
        counts.append(score.count)
    assert ends[0] == ends[1]
    assert counts[0] <= counts[1]


def test_list_edits_are_every_one_step_edit() -> None:
    # Across 2|1: a sample leftwards ([3, 0] has an empty microbatch: left out), rightwards, the merge;
    # the same across 1|3; then each microbatch over 1 halved.
    assert list_edits([2, 1, 3]) == [[1, 2, 3], [3, 3], [2, 2, 2], [2, 4], [1, 1, 1, 3], [2, 1, 1, 2]]
    assert list_edits([5]) == [[2, 3]]
    assert list_edits([1]) == []


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), moves=st.integers(0, 6))
def test_list_neighbours_are_valid_distinct_and_one_edit_away(seed: int, moves: int) -> None:
    rules = Rules(num_layers=8, ranks=2, batch=16, sizes=tuple(range(1, 9)), max_count=8, stages_per_rank=(1, 2),
                  placements=("loop", "vshape"), split=True, recompute=True)  # fmt: skip
    from umsearch.search.genome import genome_of

    g = genome_of(rules, 2, "loop", (0, 2, 4, 6, 8), [(4, 4, 4, 4)] * 4)
    rng = random.Random(seed)
    for _ in range(moves):
        g = neighbour(g, rules, rng, valid=True)
    out = list_neighbours(g, rules)
    assert g not in out and len(set(out)) == len(out)
    for n in out:
        assert repair(n, rules) == n
        changed = [j for j in range(g.stages) if n.forward[j] != g.forward[j]]
        assert changed and len({n.forward[j] for j in changed}) == 1  # one edit, on one stage or a shared list
        assert (n.cuts, n.cap, n.rank_cap, n.policy, n.split) == (g.cuts, g.cap, g.rank_cap, g.policy, g.split)


@settings(max_examples=4, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_descend_ends_where_no_list_edit_is_faster(seed: int, tmp_path_factory) -> None:  # type: ignore[no-untyped-def]
    rules, tables, limit = _setup(tmp_path_factory)
    score = Scorer(rules, tables, limit)
    [jump] = _jumps(rules, score, random.Random(seed), 1) or [None]
    if jump is None:
        return
    end = descend(jump, Memo(score), rules)
    assert end.iteration_ms <= jump.iteration_ms
    assert score.genome_times([end.genome])[0][0] == end.iteration_ms
    around, _ = score.genome_times(list_neighbours(end.genome, rules))
    assert around.min() >= end.iteration_ms * (1 - 1e-12)


def test_cut_neighbours_move_each_boundary_or_pair_by_one_layer() -> None:
    rules = Rules(num_layers=5, ranks=3, batch=4, sizes=(1, 2, 4), max_count=4, stages_per_rank=(1,),
                  placements=("loop",), split=False, recompute=False)  # fmt: skip
    from umsearch.search.genome import genome_of

    g = genome_of(rules, 1, "loop", (0, 1, 3, 5), [(2, 2)] * 3)
    # One boundary: 1 cannot go to 0 (an empty stage); 3 to 2 or 4. Two: both, where they stay apart.
    assert [n.cuts for n in cut_neighbours(g, rules, 1)] == [(0, 2, 3, 5), (0, 1, 2, 5), (0, 1, 4, 5)]
    assert [n.cuts for n in cut_neighbours(g, rules, 2)] == [(0, 2, 4, 5)]
    assert all(replace(n, cuts=g.cuts) == g for n in cut_neighbours(g, rules, 1))


@settings(max_examples=3, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_descents_in_lockstep_end_where_each_alone_does(seed: int, tmp_path_factory) -> None:  # type: ignore[no-untyped-def]
    rules, tables, limit = _setup(tmp_path_factory)
    score = Scorer(rules, tables, limit)
    starts = _jumps(rules, score, random.Random(seed), 4)
    assert descend_all(starts, Memo(score), rules) == [descend(s, Memo(score), rules) for s in starts]


def test_refine_ends_where_no_boundary_move_and_list_descent_is_faster(tmp_path_factory) -> None:  # type: ignore[no-untyped-def]
    rules, tables, limit = _setup(tmp_path_factory)
    score = Scorer(rules, tables, limit)
    start = _start(rules, score)
    memo = Memo(score)
    seen: list[Step] = []
    end = refine(start, memo, rules, budget=math.inf, on_step=seen.append)
    assert end.iteration_ms <= descend(start, memo, rules).iteration_ms
    assert score.genome_times([end.genome])[0][0] == end.iteration_ms
    assert all(a.iteration_ms > b.iteration_ms for a, b in zip(seen, seen[1:], strict=False))
    for moved in (1, 2):
        around = cut_neighbours(end.genome, rules, moved)
        t, m = score.genome_times(around)
        finished = descend_all([Step(genome=g, iteration_ms=float(a), max_memory_bytes=float(b))
                                for g, a, b in zip(around, t, m, strict=True) if np.isfinite(a)], memo, rules)  # fmt: skip
        assert min((s.iteration_ms for s in finished), default=math.inf) >= end.iteration_ms * (1 - 1e-12)


def test_refine_stops_at_its_budget(tmp_path_factory) -> None:  # type: ignore[no-untyped-def]
    rules, tables, limit = _setup(tmp_path_factory)
    score = Scorer(rules, tables, limit)
    start = _start(rules, score)
    free = Scorer(rules, tables, limit)
    refine(start, Memo(free), rules, budget=math.inf)
    before = score.count
    refine(start, Memo(score), rules, budget=50)
    # The first list descent runs whole; after it, at most one batch runs past the budget.
    assert score.count - before < free.count
