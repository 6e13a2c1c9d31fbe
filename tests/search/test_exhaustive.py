"""On tiny instances the exact optimum (every structure, every action order) is what the search finds."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from tests.strategies import uniform_profile
from umsearch.core.cost import CostModel
from umsearch.core.profile import TiedWeight, save_profile
from umsearch.measure.synthetic import bimodal_profile, simnet_profile
from umsearch.search.driver import run_search
from umsearch.search.exhaustive import compositions, exhaustive_optimum
from umsearch.search.genome import Rules
from umsearch.search.space import build_space
from umsearch.sim.reference import simulate


def test_compositions() -> None:
    assert sorted(compositions(4, 2)) == [(1, 3), (2, 2), (3, 1), (4,)]
    assert len(list(compositions(5, 5))) == 2**4


def test_two_stage_1f1b_is_optimal_for_uniform_layers() -> None:
    """Equal layers linear in the batch, one stage per rank: microbatches of one are best, and nothing
    beats 1F1B's (M + S - 1)(f + b)."""
    rules = Rules(num_layers=2, ranks=2, batch=3, sizes=(1, 2, 3), max_count=3, stages_per_rank=(1,),
                  placements=("loop",), split=False, recompute=False)  # fmt: skip
    base = uniform_profile(2)
    linear = replace(base, layers=tuple(replace(lay, fwd_ms=(1.0, 2.0), bwd_ms=(2.0, 4.0)) for lay in base.layers))
    found = exhaustive_optimum(CostModel(linear), rules, math.inf, max_parts=3)
    assert found is not None and found[1] == pytest.approx(4 * 3.0)
    assert all(st.forward == (1, 1, 1) for st in found[0].stages)


@pytest.mark.slow
@pytest.mark.parametrize("make,seed", [(bimodal_profile, 0), (simnet_profile, 3)])
def test_search_finds_the_exact_optimum(tmp_path: Path, make, seed) -> None:  # type: ignore[no-untyped-def]
    """2 ranks, up to 4 stages (loop and V placements), B = 4, every split, every valid order."""
    profile = make(layers=4, seed=seed)
    save_profile(profile, tmp_path / "p.json")
    space = build_space({"profile": str(tmp_path / "p.json"), "ranks": 2, "global_batch": 4, "stages_per_rank": [1, 2],
                         "recompute": False, "population": 32, "generations": 20, "seed": 0, "time_budget_s": 600})  # fmt: skip
    found = run_search(space, profile)
    cost = CostModel(profile, space.state_factor)
    # The search's plan is the incumbent: the exact search proves nothing is more than 1% faster.
    exact = exhaustive_optimum(cost, Rules.of(space, profile), space.memory_limit, max_parts=2,
                               incumbent=found.best.iteration_ms / 1.01)  # fmt: skip
    assert exact is None, f"exact optimum {exact[1] if exact else None} beats the search's {found.best.iteration_ms}"


@pytest.mark.parametrize("weight_stash", [None, 3.0])
def test_the_memory_limit_is_the_models(weight_stash: float | None) -> None:
    """docs/model.md 5 (version 2.3): a V on 2 ranks whose middle stages share a rank and a forward list
    (a boundary handed on) and whose layers share boundaries and free part of their stash at ``I``. The
    unconstrained optimum fits its own peak, so under that limit the search finds the same time, and every
    plan it returns fits its limit by the reference simulator."""
    rules = Rules(num_layers=4, ranks=2, batch=2, sizes=(1, 2), max_count=2, stages_per_rank=(2,),
                  placements=("vshape",), split=True, recompute=False)  # fmt: skip
    base = uniform_profile(4, out_bytes=1.0)
    cost = CostModel(replace(base, layers=tuple(
        replace(lay, stash_bytes=30.0 if i in (1, 2) else 10.0, boundary_shared_bytes=12.0 if i else 0.0,
                input_saved_bytes=5.0, weight_stash_bytes=weight_stash)
        for i, lay in enumerate(base.layers))))  # fmt: skip
    _limits_respected(cost, rules)


@pytest.mark.parametrize("fixed,tie", [(4.0, 0.0), (0.0, 60.0), (4.0, 60.0)])
def test_the_memory_limit_counts_fixed_stashes_and_ties(fixed: float, tie: float) -> None:
    """docs/model.md 5 (version 2.3): a V on 2 ranks whose middle stages (both on rank 1, the fuller one) tie a
    weight and whose layers save ``fixed`` bytes per microbatch. The search's memory is the reference simulator's: the
    unconstrained optimum fits its own peak, and every plan found under a tighter limit fits it."""
    rules = Rules(num_layers=4, ranks=2, batch=2, sizes=(1, 2), max_count=2, stages_per_rank=(2,),
                  placements=("vshape",), split=True, recompute=False)  # fmt: skip
    base = uniform_profile(4, out_bytes=1.0)
    layers = tuple(replace(lay, stash_bytes=30.0 if i in (1, 2) else 10.0, stash_fixed_bytes=fixed * (i + 1))
                   for i, lay in enumerate(base.layers))  # fmt: skip
    ties = (TiedWeight(layers=(1, 2), bytes=tie),) if tie else ()
    cost = CostModel(replace(base, layers=layers, tied_weights=ties))
    _limits_respected(cost, rules)


def _limits_respected(cost: CostModel, rules: Rules) -> None:
    """The unconstrained optimum fits its own peak, and what is found under that peak or a byte less fits it
    by the reference simulator."""
    free = exhaustive_optimum(cost, rules, math.inf, max_parts=2)
    assert free is not None
    peak = max(simulate(free[0], cost).peak_memory_bytes or ())
    at_peak = exhaustive_optimum(cost, rules, peak, max_parts=2)
    assert at_peak is not None and at_peak[1] == pytest.approx(free[1])
    for limit in (peak, peak - 1):
        found = exhaustive_optimum(cost, rules, limit, max_parts=2)
        assert found is not None and max(simulate(found[0], cost).peak_memory_bytes or ()) <= limit
