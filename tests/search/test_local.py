"""The polish's local search: a memo of scores changes nothing but how many plans are scored; the list descent
ends where no one-step list edit is faster."""

from __future__ import annotations

import random

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from umsearch.core.cost import CostModel
from umsearch.measure.synthetic import bimodal_profile
from umsearch.search.genome import Rules, repair
from umsearch.search.local import ClimbConfig, Memo, Step, climb, descend, iterated_climb
from umsearch.search.moves import list_edits, list_neighbours, neighbour
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
    start = _start(rules, score)
    rng = random.Random(seed)
    g = neighbour(start.genome, rules, rng, moves=3, valid=True)
    t, m = score.genome_times([g])
    if not np.isfinite(t[0]):
        return
    end = descend(Step(genome=g, iteration_ms=float(t[0]), max_memory_bytes=float(m[0])), Memo(score), rules)
    assert end.iteration_ms <= t[0]
    assert score.genome_times([end.genome])[0][0] == end.iteration_ms
    around, _ = score.genome_times(list_neighbours(end.genome, rules))
    assert around.min() >= end.iteration_ms * (1 - 1e-12)
