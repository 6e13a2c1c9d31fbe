"""The stopping rule on progress: stop once no structure that matters improved, or at the ceiling."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from umsearch.search.convergence import WINDOW, Convergence


def _rule(stall: int = 10, ceiling: int = 200) -> Convergence[str]:
    return Convergence(stall=stall, tolerance=0.001, ceiling=ceiling)


def test_goes_on_until_a_stall_window_has_passed() -> None:
    rule = _rule()
    for g in (5, 9, 10):
        rule.record(g, {"a": 100.0})
        assert not rule.done()  # no record 10 generations back yet
    rule.record(15, {"a": 100.0})
    assert rule.done()


def test_a_gain_above_the_tolerance_keeps_it_going_one_below_does_not() -> None:
    rule = _rule()
    rule.record(5, {"a": 100.0})
    rule.record(15, {"a": 99.8})  # 0.2% faster than 10 generations ago
    assert not rule.done()
    rule.record(25, {"a": 99.75})  # 0.05% faster than at 15
    assert rule.done()


def test_any_structure_near_the_fastest_improving_keeps_it_going() -> None:
    rule = _rule()
    rule.record(5, {"a": 100.0, "b": 101.5})
    rule.record(15, {"a": 100.0, "b": 101.0})
    assert not rule.done()


def test_a_structure_far_behind_does_not_keep_it_going() -> None:
    rule = _rule()
    rule.record(5, {"a": 100.0, "b": 100.0 * (1 + 4 * WINDOW)})
    rule.record(15, {"a": 100.0, "b": 100.0 * (1 + 2 * WINDOW)})  # much faster, still outside the window
    assert rule.done()


def test_a_new_structure_counts_as_progress() -> None:
    rule = _rule()
    rule.record(5, {"a": 100.0})
    rule.record(15, {"a": 100.0, "b": 100.5})
    assert not rule.done()


def test_the_ceiling_stops_it() -> None:
    rule = _rule(ceiling=20)
    rule.record(19, {"a": 1.0})
    assert not rule.done()
    rule.record(20, {"a": 1.0})
    assert rule.done()


@given(st.floats(1.0, 1e6), st.integers(1, 20), st.integers(1, 60))
def test_never_stops_while_the_best_keeps_falling_fast(start: float, stall: int, generations: int) -> None:
    """A structure 1% faster every generation never stalls before the ceiling."""
    rule = _rule(stall=stall, ceiling=10**6)
    t = start
    for g in range(1, generations + 1):
        t *= 0.99
        rule.record(g, {"a": t})
        assert not rule.done()


@given(st.integers(1, 30), st.integers(0, 30))
def test_stops_exactly_one_stall_after_the_last_gain(stall: int, gains: int) -> None:
    """Gains of 1% for ``gains`` generations, then none: it stops at generation gains + stall, not before."""
    rule = _rule(stall=stall, ceiling=10**6)
    t, g = 100.0, 0
    while True:
        g += 1
        t = t * 0.99 if g <= gains else t
        rule.record(g, {"a": t})
        if rule.done():
            break
    assert g == max(gains, 1) + stall  # the first record has nothing to compare with
