"""``umsearch tune`` for real: a tiny zoo model on 2 gloo ranks, a tiny budget; plan.json is the contender
that measured fastest in tune.json (whatever the times were)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from umsearch.core.loader import load_plan_file


def _umsearch(*args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "umsearch", *args], capture_output=True, text=True, timeout=900,
                          check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.mark.slow
def test_tune_writes_the_plan_that_measured_fastest(tmp_path: Path) -> None:
    profile = tmp_path / "p.json"
    _umsearch("profile", "mlp", "--arg", "layers=4", "--arg", "width=32", "--sizes", "1,2,4,8", "--repeats", "3",
              "--out", str(profile))  # fmt: skip
    out = tmp_path / "tuned"
    done = _umsearch("tune", str(profile), "--batch", "8", "--k", "2", "--rounds", "2", "--measure-rounds", "3",
                     "--time-budget", "3", "--budget-min", "10", "--out", str(out), "--json")  # fmt: skip
    summary = json.loads(done.stdout)
    doc = json.loads((out / "tune.json").read_text())
    assert doc["schema"] == "umsearch.tune/1" and 1 <= len(doc["rounds"]) <= 2 and summary["out"] == str(out)
    last = doc["rounds"][-1]["contenders"]
    fastest = min(last, key=lambda c: c["measured_median_ms"])
    assert doc["winner"]["key"] == fastest["key"] and summary["winner"]["name"] == fastest["name"]
    assert {c["runtime"] for c in last} == {"umsearch", "torch"}
    # Every contender's peak measured on both ranks; the default limit (80 GiB) drops none of this tiny model's.
    assert all(len(c["measured_peak_bytes"]) == 2 and min(c["measured_peak_bytes"]) > 0 for c in last)
    assert doc["rounds"][-1]["over_memory_limit"] == []
    plan = load_plan_file(out / "plan.json").document
    assert plan.plan.to_json() == fastest["plan"]
    lo, hi = fastest["measured_ci95_ms"]
    assert f"[{lo:.3f}, {hi:.3f}]" in plan.meta["source"]
    assert (out / "report.md").is_file() and (out / "profile.json").is_file()
    assert json.loads((out / "profile.json").read_text())["runtime"]["calibration"]["held_out"] is not None
    assert ((out / "torchtitan.toml").is_file()) == (fastest["runtime"] == "torch")
