"""The genome's rules and repair: any raw genes become a valid genome obeying the space."""

from __future__ import annotations

import dataclasses
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.search.helpers import assert_obeys, genomes, raw_genomes, rules_st
from tests.strategies import uniform_profile
from umsearch.errors import SearchSpaceError
from umsearch.search.genome import (
    Rules,
    default_rank_caps,
    repair,
    repair_cuts,
    repair_sequence,
    shaped_sequence,
)
from umsearch.search.moves import Genes, memory_move, moves_for, neighbour
from umsearch.search.space import build_space


def _rules(**kw: object) -> Rules:
    base: dict[str, object] = dict(num_layers=8, ranks=3, batch=20, sizes=tuple(range(1, 9)), max_count=8,
                                   stages_per_rank=(1, 2), placements=("loop", "vshape"), split=True,
                                   recompute=True)  # fmt: skip
    base.update(kw)
    return Rules(**base)  # type: ignore[arg-type]


@settings(max_examples=300, deadline=None)
@given(rules_st(), st.data())
def test_any_genes_repair_to_a_valid_genome(rules: Rules, data: st.DataObject) -> None:
    g = repair(data.draw(raw_genomes(rules)), rules)
    assert_obeys(g, rules)
    assert repair(g, rules) is g  # a valid genome is a fixed point, the same object


@settings(max_examples=200, deadline=None)
@given(rules_st(), st.data())
def test_fresh_repair_equals_full_repair(rules: Rules, data: st.DataObject) -> None:
    """Re-checking only the edited stages gives what checking everything gives."""
    g = data.draw(genomes(rules))
    j = data.draw(st.integers(0, g.stages - 1))
    edited = list(g.forward)
    edited[j] = tuple(data.draw(st.lists(st.integers(1, 30), min_size=1, max_size=10)))
    from dataclasses import replace

    raw = replace(g, forward=tuple(edited), backward=tuple(edited) if not any(g.recompute) else g.backward)
    if any(g.recompute):
        raw = replace(raw, backward=tuple(edited[i] if not g.recompute[i] else b for i, b in enumerate(g.backward)))
    assert repair(raw, rules, {j}) == repair(raw, rules)


@settings(max_examples=200, deadline=None)
@given(rules_st(), st.data())
def test_a_neighbour_of_a_valid_genome_needs_no_full_check(rules: Rules, data: st.DataObject) -> None:
    """Told that its genome is valid, ``neighbour`` checks only what its moves touched: the same genome, valid."""
    g = data.draw(genomes(rules))
    seed, moves = data.draw(st.integers(0, 2**32)), data.draw(st.integers(1, 5))
    trusted = neighbour(g, rules, random.Random(seed), moves, valid=True)
    assert trusted == neighbour(g, rules, random.Random(seed), moves)
    assert_obeys(trusted, rules)
    assert repair(trusted, rules) == trusted


def test_repair_sequence_examples() -> None:
    r = _rules(batch=20, sizes=(2, 4, 6, 8), max_count=8)
    assert repair_sequence([4, 4, 4, 4, 4], r) == (4, 4, 4, 4, 4)  # valid: unchanged
    assert repair_sequence([3, 5, 7], r) == (2, 4, 6, 8)  # snapped (ties go down), then filled
    assert repair_sequence([8, 8, 8], r) == (8, 8, 4)  # the overshoot is cut to the remainder
    assert repair_sequence([], r) == (8, 8, 4)
    assert repair_sequence([2] * 10, r) == (4, 4, 2, 2, 2, 2, 2, 2)  # smallest neighbours merged down to 8
    assert repair_sequence([4, 4, 4, 4, 3], r) == (4, 4, 4, 4, 2, 2)  # 3 snaps down to 2, 2 samples fill up
    assert repair_sequence([6, 6, 6, 2], r) == (6, 6, 6, 2)


def test_repair_cuts_keeps_order_and_room() -> None:
    assert repair_cuts([0, 3, 3, 3, 6], 4, 6) == (0, 3, 4, 5, 6)
    assert repair_cuts([0, 9, 9, -1, 6], 4, 6) == (0, 1, 4, 5, 6)
    assert repair_cuts([0, 1, 2, 5, 6], 4, 6) == (0, 1, 2, 5, 6)
    assert repair_cuts([0, 6], 3, 6) == (0, 1, 3, 6)  # too few cuts: the widest stage splits, twice


def test_shaped_sequence_ramps() -> None:
    r = _rules(batch=64, sizes=tuple(range(1, 65)), max_count=64)
    # up 4, 8; down 10; the 42 samples between: 16, 16 and a remainder of 10
    assert shaped_sequence(r, 16, 4, 2, 4, 1) == (4, 8, 16, 16, 10, 10)
    assert shaped_sequence(r, 16, 2, 0, 16, 0) == (16, 16, 16, 16)
    assert sum(shaped_sequence(r, 64, 1, 3, 1, 3)) == 64


def test_default_rank_caps_follow_torchs_warmups() -> None:
    r = _rules(ranks=4, batch=64, sizes=tuple(range(1, 65)), max_count=64, num_layers=8)
    assert default_rank_caps(r, 1, [[4] * 16] * 4) == (16, 12, 8, 4)  # 1F1B: R - r microbatches
    assert default_rank_caps(r, 2, [[4] * 16] * 8) == (44, 36, 28, 20)  # (v-1)R + 2(R-1-r) + 1


def test_rules_refuse_impossible_spaces() -> None:
    space = build_space({"profile": "p.json", "ranks": 5, "global_batch": 16})
    with pytest.raises(SearchSpaceError, match="ranks = 5 but the profile has only 4 layers"):
        Rules.of(space, uniform_profile(4))
    space = build_space({"profile": "p.json", "ranks": 2, "global_batch": 64, "max_microbatch": 8, "max_microbatches": 4})
    with pytest.raises(SearchSpaceError, match="max_count = 4 microbatches of at most 8"):
        Rules.of(space, uniform_profile(4))
    space = build_space({"profile": "p.json", "ranks": 3, "global_batch": 8, "stages_per_rank": [2, 3]})
    with pytest.raises(SearchSpaceError, match="needs at least 6 layers"):
        Rules.of(space, uniform_profile(4))


def test_split_needs_the_profile_to_have_it() -> None:
    space = build_space({"profile": "p.json", "ranks": 2, "global_batch": 8})
    assert Rules.of(space, uniform_profile(4, split=True)).split
    assert not Rules.of(space, uniform_profile(4, split=False)).split


class _Roll(random.Random):
    """A generator whose ``random()`` is fixed: picks one branch of a move."""

    def __init__(self, value: float) -> None:
        super().__init__(0)
        self.value = value

    def random(self) -> float:
        return self.value


@settings(max_examples=200, deadline=None)
@given(rules_st(), st.data())
def test_the_memory_move_lowers_the_stage_whose_stash_peaks(rules: Rules, data: st.DataObject) -> None:
    """It recomputes, halves the held microbatches of, or holds back the stage with the largest
    stash times held microbatch; the structure stays and the result repairs to a valid genome."""
    stash = tuple(data.draw(st.lists(st.floats(0.0, 100.0), min_size=rules.num_layers, max_size=rules.num_layers)))
    rules = dataclasses.replace(rules, stash=stash, memory_binds=True, memory_limit=1.0)
    assert (memory_move in moves_for(rules)) == any(stash)
    g = data.draw(genomes(rules))
    per = rules.stage_stash(g.cuts)
    held = [g.backward[j] if g.recompute[j] else g.forward[j] for j in range(g.stages)]
    j = max(range(g.stages), key=lambda i: (per[i] * max(held[i]), -i))
    roll = data.draw(st.sampled_from([0.0, 0.5, 0.9]))
    genes = Genes.of(g)
    memory_move(genes, rules, _Roll(roll))
    if roll == 0.0 and rules.recompute and not g.recompute[j]:
        assert genes.recompute[j] and genes.backward[j] == g.forward[j]
    elif roll <= 0.5:
        now = genes.backward[j] if genes.recompute[j] else genes.forward[j]
        assert sum(now) == sum(held[j]) and max(now) == -(-max(held[j]) // 2)
    else:
        assert genes.cap[j] == max(1, g.cap[j] // 2)
    assert genes.cuts == list(g.cuts) and genes.v == g.v
    assert_obeys(genes.to_genome(rules), rules)
