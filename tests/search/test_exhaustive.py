"""The exhaustive optimum: every composition, every warmup; better than any equal split."""

from __future__ import annotations

from pathlib import Path

import pytest

from umsearch.core.cost import CostModel
from umsearch.core.errors import SearchSpaceError
from umsearch.core.profile import save_profile
from umsearch.measure.synthetic import simnet_profile
from umsearch.search.baselines import equal_baseline
from umsearch.search.bound import lower_bound
from umsearch.search.exhaustive import compositions, exhaustive_optimum
from umsearch.search.space import build_space


def test_compositions() -> None:
    assert sorted(compositions(4)) == sorted(
        [(4,), (1, 3), (3, 1), (2, 2), (1, 1, 2), (1, 2, 1), (2, 1, 1), (1, 1, 1, 1)]
    )
    assert len(list(compositions(9))) == 2**8


def test_optimum_respects_the_space_and_beats_equal_plans(tmp_path: Path) -> None:
    profile = simnet_profile(layers=4, seed=9)
    save_profile(profile, tmp_path / "p.json")
    space = build_space({"profile": str(tmp_path / "p.json"), "stages": 2, "global_batch": 6, "recompute": False})
    cost = CostModel(profile)
    best = exhaustive_optimum(cost, space)
    assert best is not None
    for family in ("gpipe", "1f1b"):
        eq = equal_baseline(cost, space, family)
        assert eq is not None and best.iteration_ms <= eq.iteration_ms
    assert lower_bound(cost, space) <= best.iteration_ms
    # This instance's optimum splits the batch differently on its two stages.
    assert best.plan.stages[0].forward != best.plan.stages[1].forward

    capped = build_space({"profile": str(tmp_path / "p.json"), "stages": 2, "global_batch": 6, "max_microbatch": 2,
                          "schedule": "1f1b", "recompute": False})  # fmt: skip
    best = exhaustive_optimum(cost, capped)
    assert best is not None
    assert all(max(s.forward) <= 2 for s in best.plan.stages)
    assert [s.warmup for s in best.plan.stages] == [2, 1]


def test_refuses_large_instances(tmp_path: Path) -> None:
    space = build_space({"profile": "p.json", "stages": 4, "global_batch": 16})
    with pytest.raises(SearchSpaceError, match="exhaustive search over"):
        exhaustive_optimum(CostModel(simnet_profile(layers=8, seed=0)), space)
