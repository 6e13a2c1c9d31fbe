"""benchmarks/replay.py's memory rows: the model's own prediction (docs/model.md 5, version 2.3) against the
replay's tally, on the quick mlp and every plan shape of the benchmark."""

from __future__ import annotations

import pytest

from benchmarks.replay import QUICK_MODELS, memory_rows, plans, profile_of
from umsearch.core.cost import CostModel
from umsearch.sim.reference import rank_peak_memory


def test_memory_rows_are_the_models_prediction_and_match_the_tally() -> None:
    """Per plan and rank the predicted activations are the reference simulator's peak less the state (what
    section 5 predicts, hand-offs included), and the mlp's tally agrees within 2% on every plan shape
    (results/curated/memory_model_notes.md: 1.000 on the mlp)."""
    spec, profile = profile_of("mlp", QUICK_MODELS["mlp"], repeats=1)
    plan_set = plans(profile.num_layers)
    rows = memory_rows(spec, profile, plan_set)
    cost = CostModel(profile, state_factor=2.0)
    assert len(rows) == sum(p.ranks for p in plan_set.values())
    for row in rows:
        plan = plan_set[row["plan"]]
        predicted = rank_peak_memory(plan, cost, row["rank"]) - row["predicted_state_bytes"]
        assert row["predicted_activation_bytes"] == pytest.approx(predicted, rel=1e-12)
        assert row["activation_ratio"] == pytest.approx(1.0, abs=0.02), row
