"""benchmarks.same_schedule: which contenders it takes from a tune run, and how it reads several launches."""

from __future__ import annotations

import pytest

from benchmarks.same_schedule import _between, _launch, _pick


def _section(*contenders: tuple[str, str, float]) -> dict:
    return {"tune": {"rounds": [{"contenders": []}, {"contenders": [
        {"name": n, "runtime": rt, "measured_median_ms": ms} for n, rt, ms in contenders]}]}}  # fmt: skip


def test_it_takes_the_last_rounds_fastest_plan_and_fastest_torch_schedule() -> None:
    got = _pick(_section(("plan 1", "umsearch", 12.0), ("plan 2", "umsearch", 10.0),
                         ("torch 1F1B", "torch", 11.0), ("torch GPipe", "torch", 13.0)))  # fmt: skip
    assert got is not None and (got[0]["name"], got[1]["name"]) == ("plan 2", "torch 1F1B")


def test_nothing_to_compare_when_a_torch_schedule_won() -> None:
    assert _pick(_section(("plan 1", "umsearch", 12.0), ("torch 1F1B", "torch", 11.0))) is None


def test_one_launch_pairs_rounds_and_places_the_prediction() -> None:
    tuned, peer_ours, peer_torch = [10.0] * 6, [11.0] * 6, [12.1] * 6
    names = [("plan", "umsearch"), ("peer", "umsearch"), ("peer", "torch")]
    got = _launch([tuned, peer_ours, peer_torch], names, predicted=1.1)
    assert (
        got["on_umsearch"]["median"] == pytest.approx(1.1)
        and got["on_umsearch"]["predicted_inside"]
    )
    assert (
        got["on_torch"]["median"] == pytest.approx(1.21) and not got["on_torch"]["predicted_inside"]
    )
    assert got["torch_over_umsearch"]["median"] == pytest.approx(1.1)
    assert "predicted_inside" not in got["torch_over_umsearch"]
    assert [c["drift"] for c in got["contenders"]] == [0.0, 0.0, 0.0]


def test_launch_medians_give_the_spread_and_whether_the_prediction_lies_in_it() -> None:
    launches = [
        {k: {"median": m} for k in ("on_umsearch", "on_torch", "torch_over_umsearch")}
        for m in (1.05, 1.09)
    ]
    got = _between(launches, predicted=1.07)
    assert got["on_torch"] == {
        "medians": [1.05, 1.09],
        "range": [1.05, 1.09],
        "predicted_inside_range": True,
    }
    assert _between(launches, predicted=1.10)["on_umsearch"]["predicted_inside_range"] is False
    assert "predicted_inside_range" not in got["torch_over_umsearch"]
