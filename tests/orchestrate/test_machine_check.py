"""Calibration and tune fit runtime costs on this machine's CPU: a profile of another device is refused."""

from __future__ import annotations

import dataclasses

import pytest

from tests.contract import unit_profile
from umsearch.errors import PlanError
from umsearch.orchestrate.calibration import require_this_machine


def test_a_gpu_profile_is_refused_before_any_probe_runs() -> None:
    gpu = dataclasses.replace(unit_profile(4), device="cuda: NVIDIA H200")
    with pytest.raises(PlanError, match="calibrate runs its plans on this machine's CPU, but the profile was "
                                        "measured on cuda: NVIDIA H200"):  # fmt: skip
        require_this_machine(gpu, "calibrate")


def test_a_cpu_profile_passes() -> None:
    require_this_machine(dataclasses.replace(unit_profile(4), device="cpu: 1 thread"), "tune")
