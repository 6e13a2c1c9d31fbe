"""``umsearch run`` and ``umsearch validate`` end to end on a small zoo MLP (two gloo processes)."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

from click.testing import CliRunner

from tests.runtime.helpers import zoo_two_stage_plan
from tests.strategies import uniform_profile
from umsearch.cost_model import CostModel
from umsearch.errors import PlanError
from umsearch.plan import load_plan, save_plan
from umsearch.profile import save_profile
from umsearch.runtime.command import run_command, validate_command
from umsearch.simulator import simulate
from umsearch.viz import chrome_trace_events


def _plan(tmp: Path, *, profile: str | None = None, deadlock: bool = False) -> Path:
    plan = zoo_two_stage_plan()
    if deadlock:
        # MODEL.md's deadlocking example, on the same layers.
        s0, s1 = plan.stages
        plan = replace(plan, stages=(
            replace(s0, forward=(1, 3, 4), backward=(2, 6), warmup=1, recompute=True),
            replace(s1, forward=(4, 4), backward=(8,), warmup=2, recompute=True),
        ))  # fmt: skip
    path = tmp / "plan.json"
    save_plan(replace(plan, profile=profile), path)
    return path


def _layers() -> int:
    return zoo_two_stage_plan().stages[-1].hi


def test_run_json_and_trace(tmp_path: Path) -> None:
    trace = tmp_path / "trace.json"
    res = CliRunner().invoke(run_command, [str(_plan(tmp_path)), "--steps", "2", "--json", "--trace", str(trace)])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert [s["step"] for s in doc["steps"]] == [0, 1]
    assert all(math.isfinite(s["loss"]) and s["iteration_ms"] > 0 for s in doc["steps"])
    assert doc["predicted_iteration_ms"] is None  # the plan names no profile
    events = json.loads(trace.read_text())["traceEvents"]
    ops = [e for e in events if e["ph"] == "X"]
    assert len(ops) == 8  # 2 stages x (2 forwards + 2 backwards)
    assert {e["tid"] for e in ops} == {0, 1}
    # Same shape as the predicted trace: identical keys on every event.
    sample = chrome_trace_events(simulate(load_plan(tmp_path / "plan.json"), CostModel(uniform_profile(layers=_layers()))).ops)
    assert {tuple(sorted(e)) for e in events} == {tuple(sorted(e)) for e in sample}


def test_print_launch(tmp_path: Path) -> None:
    res = CliRunner().invoke(run_command, [str(_plan(tmp_path)), "--print-launch", "--backend", "nccl"])
    assert res.exit_code == 0, res.output
    assert "torchrun --nnodes=2 --nproc-per-node=1" in res.output
    assert "-m umsearch.runtime.worker" in res.output and "--backend=nccl" in res.output


def test_deadlocking_plan_is_refused(tmp_path: Path) -> None:
    res = CliRunner().invoke(run_command, [str(_plan(tmp_path, deadlock=True))])
    assert res.exit_code != 0 and isinstance(res.exception, PlanError)
    assert "deadlocks" in str(res.exception)


def test_validate_reports_prediction_and_error(tmp_path: Path) -> None:
    save_profile(uniform_profile(layers=_layers(), fwd=0.5, bwd=1.0), tmp_path / "prof.json")
    plan_path = _plan(tmp_path, profile="prof.json")
    out = tmp_path / "fid.json"
    res = CliRunner().invoke(validate_command, [str(plan_path), "--steps", "3", "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert doc == json.loads(res.output)
    row = doc["plans"][0]
    want = simulate(load_plan(plan_path), CostModel(uniform_profile(layers=_layers(), fwd=0.5, bwd=1.0))).iteration_ms
    assert row["predicted_ms"] == want
    assert len(row["measured_ms"]) == 3
    assert row["error"] == (row["predicted_ms"] - row["measured_median_ms"]) / row["measured_median_ms"]
    assert doc["mape_percent"] == abs(row["error"]) * 100
