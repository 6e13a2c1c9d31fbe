"""``umsearch run`` and ``umsearch validate`` on a small zoo MLP; refusals before any process starts."""

from __future__ import annotations

import json
import math
import shlex
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from tests.runtime.helpers import zoo_two_stage_plan
from tests.strategies import uniform_profile
from umsearch.cli.pictures import chrome_trace_events
from umsearch.cli.run import (
    entry_argv,
    plan_cost,
    run_command,
    run_warnings,
    validate_command,
)
from umsearch.core.cost import CostModel
from umsearch.core.errors import PlanError, RuntimeExecutionError
from umsearch.core.plan import load_plan, save_plan
from umsearch.core.profile import file_sha256, save_profile
from umsearch.runtime.config import LaunchConfig, RunConfig
from umsearch.sim.reference import simulate


def _plan(tmp: Path, *, profile: str | None = None, deadlock: bool = False,
          meta: dict[str, Any] | None = None) -> Path:  # fmt: skip
    plan = zoo_two_stage_plan()
    if deadlock:
        # MODEL.md's deadlocking example, on the same layers.
        s0, s1 = plan.stages
        plan = replace(plan, stages=(
            replace(s0, forward=(1, 3, 4), backward=(2, 6), warmup=1, recompute=True),
            replace(s1, forward=(4, 4), backward=(8,), warmup=2, recompute=True),
        ))  # fmt: skip
    if meta:
        plan = replace(plan, meta={**plan.meta, **meta})
    path = tmp / "plan.json"
    save_plan(replace(plan, profile=profile), path)
    return path


def _layers() -> int:
    return zoo_two_stage_plan().stages[-1].hi


@pytest.mark.slow
def test_run_json_and_trace_of_the_median_iteration(tmp_path: Path) -> None:
    trace = tmp_path / "trace.json"
    args = [str(_plan(tmp_path)), "--steps", "4", "--warmup-steps", "1", "--json", "--trace", str(trace)]
    res = CliRunner().invoke(run_command, args)
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert [s["step"] for s in doc["steps"]] == [0, 1, 2, 3]
    assert all(math.isfinite(s["loss"]) and s["iteration_ms"] > 0 for s in doc["steps"])
    assert doc["predicted_iteration_ms"] is None  # the plan names no profile
    # The median is an actual iteration (the lower middle of the 3 kept), and the trace shows that one.
    kept = sorted(s["iteration_ms"] for s in doc["steps"][1:])
    assert doc["median_iteration_ms"] == kept[1]
    q1, q3 = doc["quartiles_ms"]
    assert kept[0] <= q1 <= doc["median_iteration_ms"] <= q3 <= kept[2]
    written = json.loads(trace.read_text())
    assert written["metadata"]["iteration_ms"] == doc["median_iteration_ms"]
    events = written["traceEvents"]
    ops = [e for e in events if e["ph"] == "X"]
    assert len(ops) == 8  # 2 stages x (2 forwards + 2 backwards)
    assert {e["tid"] for e in ops} == {0, 1}
    assert max(e["ts"] + e["dur"] for e in ops) == pytest.approx(doc["median_iteration_ms"] * 1e3, rel=1e-6)
    # Same shape as the predicted trace: identical keys on every event.
    sample = chrome_trace_events(simulate(load_plan(tmp_path / "plan.json"), CostModel(uniform_profile(layers=_layers()))).ops)
    assert {tuple(sorted(e)) for e in events} == {tuple(sorted(e)) for e in sample}


def test_print_launch_is_the_local_command(tmp_path: Path) -> None:
    path = str(_plan(tmp_path))
    res = CliRunner().invoke(run_command, [path, "--print-launch", "--backend", "nccl", "--steps", "7"])
    assert res.exit_code == 0, res.output
    last = res.output.strip().splitlines()[-1]
    assert last.startswith("torchrun --nnodes=2 --nproc-per-node=1 ")
    # The entry point and its flags are exactly what a local run hands torchrun.
    cfg = RunConfig(steps=7, launch=LaunchConfig(backend="nccl"))
    assert shlex.split(last)[-len(entry_argv(path, cfg)):] == entry_argv(path, cfg)
    assert "-m umsearch.runtime.torchrun" in last and "--backend=nccl" in last


def test_print_launch_runs_the_same_checks(tmp_path: Path) -> None:
    res = CliRunner().invoke(run_command, [str(_plan(tmp_path, deadlock=True)), "--print-launch"])
    assert isinstance(res.exception, PlanError) and "deadlocks" in str(res.exception)
    wrong = tmp_path / "wrong.json"
    save_plan(replace(zoo_two_stage_plan(), meta={"model": {"source": "mlp", "args": {"width": 16, "layers": 2}}}), wrong)
    res = CliRunner().invoke(run_command, [str(wrong), "--print-launch"])
    assert isinstance(res.exception, PlanError)
    assert f"covers layers [0, {_layers()}) but the model has 3 layers" in str(res.exception)


def test_nproc_per_node_needs_print_launch(tmp_path: Path) -> None:
    res = CliRunner().invoke(run_command, [str(_plan(tmp_path)), "--nproc-per-node", "2"])
    assert isinstance(res.exception, RuntimeExecutionError)
    assert "--nproc-per-node 2 only shapes the --print-launch command" in str(res.exception)


def test_deadlocking_plan_is_refused(tmp_path: Path) -> None:
    res = CliRunner().invoke(run_command, [str(_plan(tmp_path, deadlock=True))])
    assert res.exit_code != 0 and isinstance(res.exception, PlanError)
    assert "deadlocks" in str(res.exception)


def test_profile_layer_mismatch_names_the_profile(tmp_path: Path) -> None:
    save_profile(uniform_profile(layers=_layers() + 3), tmp_path / "prof.json")
    plan_path = _plan(tmp_path, profile="prof.json")
    with pytest.raises(PlanError, match=rf"covers layers \[0, {_layers()}\) but the profile .*prof.json has "
                                        rf"{_layers() + 3} layers"):  # fmt: skip
        plan_cost(load_plan(plan_path), tmp_path / "prof.json")


def test_warnings_for_untrustworthy_measurements(tmp_path: Path) -> None:
    prof = tmp_path / "prof.json"
    save_profile(uniform_profile(layers=_layers()), prof)
    plan = load_plan(_plan(tmp_path, profile="prof.json", meta={"profile_sha256": file_sha256(prof)}))
    assert run_warnings(plan, prof, RunConfig(), cpus=2) == []
    save_profile(uniform_profile(layers=_layers(), fwd=9.0), prof)  # re-measured since the search
    [stale] = run_warnings(plan, prof, RunConfig(), cpus=2)
    assert "not the one the plan was searched on" in stale
    [crowded] = run_warnings(plan, None, RunConfig(launch=LaunchConfig(threads=2)), cpus=3)
    assert crowded.startswith("2 stages x 2 thread(s) need 4 cores but 3 are available")


@pytest.mark.slow
def test_validate_reports_prediction_spread_and_busy_error(tmp_path: Path) -> None:
    save_profile(uniform_profile(layers=_layers(), fwd=0.5, bwd=1.0), tmp_path / "prof.json")
    plan_path = _plan(tmp_path, profile="prof.json")
    out = tmp_path / "fid.json"
    res = CliRunner().invoke(validate_command, [str(plan_path), "--steps", "4", "--warmup-steps", "1", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "busy error" in res.stdout and "IQR ms" in res.stdout and "MAPE" in res.stdout
    doc = json.loads(out.read_text())
    row = doc["plans"][0]
    want = simulate(load_plan(plan_path), CostModel(uniform_profile(layers=_layers(), fwd=0.5, bwd=1.0))).iteration_ms
    assert row["predicted_ms"] == want
    assert len(row["measured_ms"]) == 4
    assert row["measured_median_ms"] == sorted(row["measured_ms"][1:])[1]
    q1, q3 = row["measured_quartiles_ms"]
    assert q1 <= row["measured_median_ms"] <= q3
    assert row["error"] == (row["predicted_ms"] - row["measured_median_ms"]) / row["measured_median_ms"]
    assert doc["mape_percent"] == abs(row["error"]) * 100
    assert len(row["busy_error"]) == 2 and all(isinstance(e, float) for e in row["busy_error"])
    for e in row["busy_error"]:  # printed too, not only in the JSON
        assert f"{e:+.1%}" in res.stdout
