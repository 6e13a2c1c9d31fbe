"""The genome's rules and repair: any raw genes become a valid plan obeying the space."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.search.helpers import assert_obeys, rules_st
from umsearch.core.errors import SearchSpaceError
from umsearch.search.genome import (
    Rules,
    make_plan,
    repair,
    repair_cuts,
    repair_sequence,
    shaped_sequence,
)
from umsearch.search.space import build_space


def _rules(**kw: object) -> Rules:
    base: dict[str, object] = dict(num_layers=8, stages=3, batch=20, sizes=tuple(range(1, 9)), max_count=8,
                                   schedule="any", recompute=True)  # fmt: skip
    base.update(kw)
    return Rules(**base)  # type: ignore[arg-type]


sizes_st = st.lists(st.integers(-3, 90), max_size=30)


@settings(max_examples=300, deadline=None)
@given(rules_st(), st.data())
def test_any_genes_repair_to_a_valid_plan(rules: Rules, data: st.DataObject) -> None:
    S = rules.stages
    cuts = data.draw(st.lists(st.integers(-5, rules.num_layers + 5), min_size=S + 1, max_size=S + 1))
    fwd = [data.draw(sizes_st) for _ in range(S)]
    bwd = [data.draw(st.none() | sizes_st) for _ in range(S)]
    warm = data.draw(st.lists(st.integers(-3, 50), min_size=S, max_size=S))
    rec = data.draw(st.lists(st.booleans(), min_size=S, max_size=S))
    plan = make_plan(rules, cuts, fwd, bwd, warm, rec)
    assert_obeys(plan, rules)
    assert repair(plan, rules) == plan  # a valid plan is a fixed point


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
    r = _rules(num_layers=6, stages=4)
    assert repair_cuts([0, 3, 3, 3, 6], r) == (0, 3, 4, 5, 6)
    assert repair_cuts([0, 9, 9, -1, 6], r) == (0, 1, 4, 5, 6)
    assert repair_cuts([0, 1, 2, 5, 6], r) == (0, 1, 2, 5, 6)


def test_schedule_families_fix_warmup() -> None:
    fwd = [[5, 5, 6, 4]] * 3
    for family, expect in (("gpipe", [4, 4, 4]), ("1f1b", [3, 2, 1]), ("any", [1, 4, 2])):
        plan = make_plan(_rules(schedule=family), [0, 2, 4, 8], fwd, [None] * 3, [0, 7, 2], [False] * 3)
        assert [s.warmup for s in plan.stages] == expect


def test_backward_differs_only_when_recompute_is_allowed() -> None:
    args = ([0, 2, 4, 8], [[8, 8, 4]] * 3, [[4, 4, 4, 8]] * 3, [2] * 3, [True, False, True])
    on = make_plan(_rules(recompute=True), *args)
    assert [s.backward for s in on.stages] == [(4, 4, 4, 8), (8, 8, 4), (4, 4, 4, 8)]
    off = make_plan(_rules(recompute=False), *args)
    assert all(s.backward == s.forward and not s.recompute for s in off.stages)


def test_shaped_sequence_ramps() -> None:
    r = _rules(batch=64, sizes=tuple(range(1, 65)), max_count=64)
    # up 4, 8; down 10; the 42 samples between: 16, 16 and a remainder of 10
    assert shaped_sequence(r, 16, 4, 2, 4, 1) == (4, 8, 16, 16, 10, 10)
    assert shaped_sequence(r, 16, 2, 0, 16, 0) == (16, 16, 16, 16)
    assert sum(shaped_sequence(r, 64, 1, 3, 1, 3)) == 64


def test_rules_refuse_impossible_spaces() -> None:
    space = build_space({"profile": "p.json", "stages": 5, "global_batch": 16})
    with pytest.raises(SearchSpaceError, match="stages = 5 but the profile has only 4 layers"):
        Rules.of(space, 4)
    space = build_space({"profile": "p.json", "stages": 2, "global_batch": 64, "max_microbatch": 8, "max_microbatches": 4})
    with pytest.raises(SearchSpaceError, match="max_count = 4 microbatches of at most 8"):
        Rules.of(space, 4)
