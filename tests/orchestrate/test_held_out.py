"""What ``umsearch validate`` says about a profile: the held-out error its calibration measured."""

from __future__ import annotations

import dataclasses

from tests.strategies import uniform_profile
from umsearch.core.profile import RuntimeCosts
from umsearch.orchestrate.held_out import held_out_error, trust_line


def test_an_uncalibrated_profile_is_said_to_be_uncalibrated() -> None:
    p = uniform_profile()
    assert held_out_error(p) is None and "is not calibrated" in trust_line(p, "p.json")


def test_an_old_calibration_without_held_out_error_says_how_to_measure_it() -> None:
    p = dataclasses.replace(uniform_profile(), runtime=RuntimeCosts(op_overhead_ms=0.1, calibration={"rounds": 7}))
    assert held_out_error(p) is None and "umsearch calibrate" in trust_line(p)


def test_the_held_out_error_and_the_worst_plan_are_reported() -> None:
    record = {"held_out_mape_percent": 4.25, "held_out": [{"plan": "a", "error": 0.02}, {"plan": "b", "error": -0.065}]}
    p = dataclasses.replace(uniform_profile(), runtime=RuntimeCosts(calibration=record))
    assert held_out_error(p) == 4.25
    line = trust_line(p, "p.json")
    assert "off by 4.2% on average on 2 plan(s) left out" in line and "worst 6.5%" in line
