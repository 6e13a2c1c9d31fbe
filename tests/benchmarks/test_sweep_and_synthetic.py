"""The sweep summary and the synthetic workload generator."""

from __future__ import annotations

from pathlib import Path

from benchmarks.sweep import summarize
from umsearch.measure.synthetic import simnet_profile
from umsearch.storage.jsonio import write_json


def test_simnet_is_deterministic_and_heterogeneous() -> None:
    a, b = simnet_profile(layers=12, seed=5), simnet_profile(layers=12, seed=5)
    assert a == b
    assert simnet_profile(layers=12, seed=6) != a
    per_sample = [[t / s for t, s in zip(lay.fwd_ms, a.microbatch_sizes, strict=True)] for lay in a.layers]
    best_sizes = {min(range(len(r)), key=r.__getitem__) for r in per_sample}
    assert len(best_sizes) > 1  # layers disagree on their most efficient size


def test_summary_rows(tmp_path: Path) -> None:
    rows = [{"name": "umsearch", "iteration_ms": 90.0}, {"name": "gpipe", "iteration_ms": 110.0},
            {"name": "1f1b", "iteration_ms": 99.0}, {"name": "greedy", "iteration_ms": None}]  # fmt: skip
    write_json(tmp_path / "space_a" / "baselines.json", {"lower_bound_ms": 60.0, "rows": rows})
    text = summarize(tmp_path)
    assert "| space_a | 90.000 | 110.000 | 99.000 | - | 1.100x | 50.0% |" in text
