"""The GPU check's steps work together: its CPU rehearsal passes every step and records its figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.mark.slow
def test_the_cpu_rehearsal_passes_every_step(tmp_path: Path) -> None:
    from benchmarks.gpu_check import main

    assert main(["--cpu", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "gpu_check_cpu.json").read_text())
    names = [c["name"] for c in doc["checks"]]
    assert names == ["profile gpt layers=4 fp32", "2 x 2 cluster plan", "replay --all-ranks", "calibrate --replay",
                     "1-rank run, memory"]  # fmt: skip
    assert all(c["ok"] for c in doc["checks"]), doc["checks"]
    replay = doc["checks"][2]["figures"]
    assert replay["busy_measured_over_predicted"] and all(r > 0 for r in replay["tally_over_predicted_peak"])
    assert doc["checks"][4]["figures"]["measured_over_predicted_peak"][0] > 0
