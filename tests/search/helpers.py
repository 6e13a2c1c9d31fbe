"""Strategies and checks shared by the search tests."""

from __future__ import annotations

from pathlib import Path

from hypothesis import strategies as st

from tests.strategies import partitions
from umsearch.core.plan import Plan
from umsearch.core.plan_rules import validate_plan
from umsearch.core.profile import Profile, save_profile
from umsearch.measure.synthetic import bimodal_profile
from umsearch.search.genome import POLICY_COUNT, Genome, Rules, repair
from umsearch.search.space import SearchSpace, build_space


@st.composite
def rules_st(draw: st.DrawFn, max_layers: int = 10, max_batch: int = 24) -> Rules:
    """Random consistent rules: layers, ranks, batch, sizes (with multiples), counts, structures."""
    L = draw(st.integers(1, max_layers))
    R = draw(st.integers(1, min(L, 4)))
    B = draw(st.integers(1, max_batch))
    lo, mult = draw(st.integers(1, 4)), draw(st.integers(1, 3))
    hi = draw(st.integers(lo, B + 4))
    sizes = tuple(b for b in range(lo, min(hi, B) + 1) if b % mult == 0) or (B,)
    need = -(-B // sizes[-1])
    spr = tuple(sorted(draw(st.sets(st.sampled_from([v for v in (1, 2, 3) if R * v <= L]), min_size=1))))
    return Rules(num_layers=L, ranks=R, batch=B, sizes=sizes, max_count=draw(st.integers(need, max(need, 12))),
                 stages_per_rank=spr, placements=tuple(draw(st.sampled_from([("loop",), ("vshape",), ("loop", "vshape")]))),
                 split=draw(st.booleans()), recompute=draw(st.booleans()))  # fmt: skip


sizes_st = st.lists(st.integers(-3, 40), max_size=20)


@st.composite
def raw_genomes(draw: st.DrawFn, rules: Rules) -> Genome:
    """Genomes with arbitrary (mostly invalid) genes: what operators may produce before repair."""
    v = draw(st.integers(0, 4))
    S = draw(st.integers(0, 3 * rules.ranks + 2))
    ints = lambda n, lo, hi: tuple(draw(st.lists(st.integers(lo, hi), min_size=n, max_size=n)))  # noqa: E731
    return Genome(
        v=v, placement=draw(st.sampled_from(["loop", "vshape", "zigzag"])),
        cuts=ints(draw(st.integers(0, S + 2)), -3, rules.num_layers + 3),
        forward=tuple(tuple(draw(sizes_st)) for _ in range(S)), backward=tuple(tuple(draw(sizes_st)) for _ in range(S)),
        recompute=tuple(draw(st.lists(st.booleans(), min_size=S, max_size=S))),
        split=tuple(draw(st.lists(st.booleans(), min_size=S, max_size=S))),
        cap=ints(S, -5, 3 * rules.batch), rank_cap=ints(rules.ranks, -5, 4 * rules.batch),
        w_cap=ints(rules.ranks, -2, 6), policy=ints(rules.ranks, -1, POLICY_COUNT + 2),
    )  # fmt: skip


@st.composite
def genomes(draw: st.DrawFn, rules: Rules) -> Genome:
    """Valid genomes: random structure, lists, splits, recompute and knobs, repaired."""
    v = draw(st.sampled_from(rules.stages_per_rank))
    S, L, B = rules.ranks * v, rules.num_layers, rules.batch
    inner = sorted(draw(st.sets(st.integers(1, L - 1), min_size=S - 1, max_size=S - 1))) if S > 1 else []
    fwd = tuple(draw(partitions(B)) for _ in range(S))
    rec = tuple(draw(st.booleans()) for _ in range(S))
    g = Genome(v=v, placement=draw(st.sampled_from(rules.placements)), cuts=(0, *inner, L), forward=fwd,
               backward=tuple(draw(partitions(B)) if r else f for f, r in zip(fwd, rec, strict=True)), recompute=rec,
               split=tuple(draw(st.booleans()) for _ in range(S)), cap=tuple(draw(st.integers(1, B)) for _ in range(S)),
               rank_cap=tuple(draw(st.integers(1, 3 * B)) for _ in range(rules.ranks)),
               w_cap=tuple(draw(st.integers(1, 4)) for _ in range(rules.ranks)),
               policy=tuple(draw(st.integers(0, POLICY_COUNT - 1)) for _ in range(rules.ranks)))  # fmt: skip
    return repair(g, rules)


def assert_obeys(g: Genome, rules: Rules) -> None:
    """``g`` is within the space's rules."""
    assert g.v in rules.stages_per_rank and g.stages == rules.ranks * g.v
    assert g.cuts[0] == 0 and g.cuts[-1] == rules.num_layers and all(a < b for a, b in zip(g.cuts, g.cuts[1:], strict=False))
    for j in range(g.stages):
        for seq in (g.forward[j], g.backward[j]):
            assert sum(seq) == rules.batch and len(seq) <= rules.max_count
            assert all(v in rules.sizes for v in seq[:-1]) and 1 <= seq[-1] <= rules.largest
        assert g.recompute[j] or g.backward[j] == g.forward[j]
        assert rules.recompute or not g.recompute[j]
        assert rules.split or not g.split[j]


def assert_plan_obeys(plan: Plan, rules: Rules) -> None:
    """A generated plan is docs/model.md-valid and within the space."""
    validate_plan(plan, rules.num_layers)
    assert plan.ranks == rules.ranks and plan.global_batch == rules.batch


def small_bimodal_space(tmp_path: Path, **kw: object) -> tuple[Profile, SearchSpace]:
    """A 6-layer two-regime profile on 2 ranks, B = 16, a short search (seed 3): fast whole searches."""
    profile = bimodal_profile(layers=6, seed=2)
    path = tmp_path / "p.json"
    save_profile(profile, path)
    values = {"profile": str(path), "ranks": 2, "global_batch": 16, "max_microbatch": 16, "population": 16,
              "generations": 4, "seed": 3, "time_budget_s": 600, "polish_stall": 4, **kw}  # fmt: skip
    return profile, build_space(values)
