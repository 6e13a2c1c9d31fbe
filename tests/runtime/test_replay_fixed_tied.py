"""``umsearch replay``'s prediction splits a rank's peak by docs/model.md 5 (version 2.3): a weight tied between
two stages of one rank is state once, and a stage's fixed stash per microbatch is activation."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.contract import EXAMPLE3, unit_profile
from umsearch.core.cost import CostModel
from umsearch.core.profile import TiedWeight
from umsearch.runtime.replay import predict
from umsearch.sim.reference import rank_state_bytes, simulate


@pytest.mark.parametrize("state_factor", [1.0, 4.0])
def test_a_tied_weight_is_state_once_and_the_fixed_stash_activation(state_factor: float) -> None:
    """Section 8's example 3 (stages 0 and 2 on rank 0, 1 and 3 on rank 1, 100 parameter bytes a layer), layers
    0 and 2 tying 40 bytes, every layer saving 3 bytes per microbatch: rank 0 holds 200 - 40 parameter bytes,
    rank 1 all 200; the tie moves no byte of activation, the fixed stash moves none of state."""
    base = unit_profile(4)
    tied = replace(base, layers=tuple(replace(x, stash_fixed_bytes=3.0) for x in base.layers),
                   tied_weights=(TiedWeight(layers=(0, 2), bytes=40.0),))  # fmt: skip
    fixed_only = replace(tied, tied_weights=())
    cost, plain = CostModel(tied, state_factor), CostModel(fixed_only, state_factor)
    got, untied = predict(EXAMPLE3, cost), predict(EXAMPLE3, plain)
    peaks = simulate(EXAMPLE3, cost).peak_memory_bytes
    assert peaks is not None
    assert [p.state_bytes for p in got] == [state_factor * 160.0, state_factor * 200.0]
    for r, p in enumerate(got):
        assert p.state_bytes == rank_state_bytes(EXAMPLE3, cost, r) and p.peak_bytes == peaks[r]
        assert p.activation_bytes == pytest.approx(untied[r].activation_bytes)
    assert [p.state_bytes for p in untied] == [state_factor * 200.0] * 2
    bare = predict(EXAMPLE3, CostModel(base, state_factor))
    assert all(p.activation_bytes > b.activation_bytes for p, b in zip(got, bare, strict=True))
