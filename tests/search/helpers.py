"""Strategies and checks shared by the search tests."""

from __future__ import annotations

from hypothesis import strategies as st

from umsearch.core.plan import Plan, validate_plan
from umsearch.search.genome import Rules


@st.composite
def rules_st(draw: st.DrawFn) -> Rules:
    L = draw(st.integers(1, 10))
    S = draw(st.integers(1, L))
    B = draw(st.integers(1, 40))
    lo = draw(st.integers(1, 6))
    mult = draw(st.integers(1, 4))
    hi = draw(st.integers(lo, B + 6))
    sizes = tuple(b for b in range(lo, min(hi, B) + 1) if b % mult == 0) or (B,)
    max_count = draw(st.integers(-(-B // sizes[-1]), 12).filter(lambda c: c >= 1)) if -(-B // sizes[-1]) <= 12 else -(-B // sizes[-1])
    return Rules(num_layers=L, stages=S, batch=B, sizes=sizes, max_count=max_count,
                 schedule=draw(st.sampled_from(["any", "gpipe", "1f1b"])), recompute=draw(st.booleans()))  # fmt: skip


def assert_obeys(plan: Plan, rules: Rules) -> None:
    """``plan`` is MODEL.md-valid and within the space's rules."""
    validate_plan(plan, rules.num_layers)
    assert plan.num_stages == rules.stages and plan.global_batch == rules.batch
    for s, st_ in enumerate(plan.stages):
        for seq in (st_.forward, st_.backward):
            assert len(seq) <= rules.max_count
            assert all(v in rules.sizes for v in seq[:-1]), seq
            assert seq[-1] <= rules.largest
        assert st_.warmup == rules.warmup(s, len(st_.forward), st_.warmup)
        assert rules.recompute or not st_.recompute
