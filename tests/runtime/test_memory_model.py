"""docs/model.md section 5 against the replay's memory tally: the state part exactly, the activations where
the contract holds, and the known gap marked (results/curated/memory_model_notes.md)."""

from __future__ import annotations

import pytest

from benchmarks.replay import sharing
from tests.runtime.helpers import peer_plan
from umsearch.core.cost import CostModel
from umsearch.core.model_spec import ModelSpec
from umsearch.core.plan import Plan
from umsearch.core.profile import Link, Profile
from umsearch.runtime.config import RunConfig
from umsearch.runtime.factory import spec_factory
from umsearch.runtime.replay import predict, replay_rank

GPT = ModelSpec(source="gpt", args={"layers": 2, "width": 16, "heads": 2, "seq": 8, "vocab": 32})
"""Blocks end in a residual add (which saves nothing) and start with a LayerNorm (which saves its input):
no storage is saved on both sides of a layer boundary, so per-layer stash_bytes add up."""
MLP = ModelSpec(source="mlp", args={"layers": 3, "width": 64, "inputs": 8})
"""Linear+Tanh: Tanh saves its output, the next Linear saves the same storage as its input."""
GAP = ("per-layer stash_bytes count a storage saved on both sides of a layer boundary (Tanh's output = the next "
       "Linear's input) twice; a stage keeps it once: see results/curated/memory_model_notes.md")  # fmt: skip


_PROFILES: dict[str, Profile] = {}


def _profile(spec: ModelSpec) -> Profile:
    if spec.source in _PROFILES:
        return _PROFILES[spec.source]
    from umsearch.measure.profiler import ProfileConfig, profile_model
    from umsearch.nn.models import build_model

    cfg = ProfileConfig(sizes=(1, 2, 4), repeats=2, min_repeats=1, warmup_rounds=0, calibration_rounds=1)
    prof = profile_model(build_model(spec), spec, cfg, link=Link(latency_ms=0.01, bandwidth_gb_per_s=10.0))
    return _PROFILES.setdefault(spec.source, prof)


def _plan(spec: ModelSpec) -> Plan:
    return peer_plan("1F1B", 2, 1, 4, 8, _profile(spec).num_layers)


@pytest.mark.parametrize("optimizer,factor", [("sgd", 2.0), ("adam", 4.0)])
def test_state_is_exactly_the_state_factor_times_the_parameters(optimizer: str, factor: float) -> None:
    from umsearch.nn.models import build_model

    built = build_model(GPT)
    plan, cost = _plan(GPT), CostModel(_profile(GPT), state_factor=factor)
    preds = predict(plan, cost)
    for r in range(plan.ranks):
        tally = replay_rank(plan, spec_factory(GPT), r, cfg=RunConfig(optimizer=optimizer), steps=1).tally
        # Adam also keeps a float32 ``step`` counter per parameter tensor: 4 bytes each, outside the factor.
        tensors = sum(len(list(built.layers[i].parameters())) for j in plan.stages_of(r)
                      for i in range(plan.stages[j].lo, plan.stages[j].hi))  # fmt: skip
        steps = 4 * tensors if optimizer == "adam" else 0
        assert tally.state_bytes == preds[r].state_bytes + steps
        assert tally.grad_bytes == tally.param_bytes
        assert tally.optimizer_bytes == (factor - 2) * tally.param_bytes + steps


def _activations_agree_within_5_percent(spec: ModelSpec) -> None:
    """Every rank's tallied peak of saved activations is section 5's prediction within 5%."""
    plan, cost = _plan(spec), CostModel(_profile(spec), state_factor=2.0)
    preds = predict(plan, cost)
    for r in range(plan.ranks):
        tally = replay_rank(plan, spec_factory(spec), r, steps=1).tally
        assert tally.saved_peak_bytes == pytest.approx(preds[r].activation_bytes, rel=0.05)


def test_activations_agree_within_5_percent_where_no_storage_crosses_a_layer_boundary() -> None:
    _activations_agree_within_5_percent(GPT)


@pytest.mark.xfail(strict=True, reason=GAP)
def test_activations_agree_within_5_percent_on_an_mlp() -> None:
    _activations_agree_within_5_percent(MLP)


def test_the_mlp_gap_is_the_storages_counted_on_both_sides_of_a_boundary() -> None:
    """The last stage of 1F1B holds one microbatch at its peak; its stash counted once per storage is the
    profile's stash minus the interior boundaries' shared bytes (what the notes propose for the contract)."""
    profile = _profile(MLP)
    plan, cost = _plan(MLP), CostModel(profile, state_factor=2.0)
    last = plan.stages[-1]
    shared = sharing(MLP)["shared"]  # the benchmark's measurement of the boundaries
    assert all(s > 0 for s in shared[1:])  # every boundary: Tanh's output is the next layer's saved input
    n = max(last.forward)
    stash = cost.stash_bytes(last.lo, last.hi)
    once = stash - sum(shared[last.lo + 1:last.hi])
    tally = replay_rank(plan, spec_factory(MLP), plan.ranks - 1, steps=1).tally
    assert predict(plan, cost)[-1].activation_bytes == pytest.approx(stash * n)
    assert tally.saved_peak_bytes == pytest.approx(once * n, rel=0.05)
    assert tally.saved_peak_bytes < 0.9 * stash * n
