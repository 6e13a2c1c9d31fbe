"""The pure parts of benchmarks.runtime (the benchmark itself runs with `python -m`)."""

from __future__ import annotations

import dataclasses

from benchmarks.runtime import BATCH, balanced_cut, fidelity_plans, profile_drift
from tests.strategies import uniform_profile
from umsearch.core.cost import CostModel
from umsearch.core.plan import validate_plan
from umsearch.core.profile import LayerProfile
from umsearch.runtime.preflight import structural_cost
from umsearch.sim.reference import simulate


def test_fidelity_plans_are_valid_and_run() -> None:
    plans = fidelity_plans(3, 8)
    assert len({name for name, _ in plans}) == len(plans)
    for _, plan in plans:
        validate_plan(plan, 8)
        assert plan.global_batch == BATCH
        assert not simulate(plan, structural_cost(8)).deadlock
    assert any(st.recompute and st.backward != st.forward for _, p in plans for st in p.stages)
    assert any(p.stages[0].forward != p.stages[1].forward for _, p in plans)


def test_balanced_cut_splits_uniform_layers_in_half() -> None:
    assert balanced_cut(CostModel(uniform_profile(layers=6)), 4) == 3


def test_profile_drift() -> None:
    a = uniform_profile(layers=2, fwd=1.0, bwd=3.0)
    assert profile_drift(a, a) == 0.0
    slower = dataclasses.replace(a, layers=tuple(
        LayerProfile(name=lay.name, fwd_ms=(2.0, 2.0), bwd_ms=(4.0, 4.0), out_bytes=0.0, stash_bytes=0.0,
                     param_bytes=0.0) for lay in a.layers))  # fmt: skip
    assert profile_drift(a, slower) == 50.0  # (6 - 4) / 4
