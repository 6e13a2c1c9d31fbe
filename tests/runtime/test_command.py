"""``umsearch run`` and ``umsearch validate``: the printed cluster command, refusals before any
process starts, one-line errors, outputs; end-to-end runs on a small zoo MLP (slow)."""

from __future__ import annotations

import json
import math
import shlex
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner, Result
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.contract import warmup_plan
from tests.strategies import uniform_profile
from umsearch.cli.run import (
    entry_argv,
    one_line_errors,
    run_command,
    run_warnings,
    validate_command,
)
from umsearch.core.loader import load_plan_file
from umsearch.core.plan import Plan
from umsearch.core.plan_io import save_plan
from umsearch.core.profile import file_sha256, save_profile
from umsearch.runtime.config import LaunchConfig, RunConfig
from umsearch.runtime.launch import RankFailure
from umsearch.runtime.run_plan import RunResult, StepResult

MLP: dict[str, Any] = {"source": "mlp", "args": {"layers": 3, "width": 16}}
LAYERS = 4  # three Linear+Tanh blocks and the classifier


def two_rank_plan(batch: int = 8) -> Plan:
    """Two ranks, one stage each, unequal microbatches (1F1B on stage 0, GPipe on stage 1)."""
    plan = warmup_plan(batch, [([2, batch - 2], [2, batch - 2], 2, False), ([4, batch - 4], [4, batch - 4], 2, False)])
    return replace(plan, stages=(replace(plan.stages[0], layers=(0, 2)), replace(plan.stages[1], layers=(2, LAYERS))))


def _plan(tmp: Path, *, profile: str | None = None, deadlock: bool = False, **meta: Any) -> Path:
    plan = two_rank_plan()
    if deadlock:  # docs/model.md 8.2's partitions on the same layers
        bad = warmup_plan(8, [([1, 3, 4], [2, 6], 1, True), ([4, 4], [8], 2, True)])
        plan = replace(bad, stages=tuple(replace(b, layers=s.layers) for b, s in zip(bad.stages, plan.stages, strict=True)))
    meta.setdefault("model", MLP)
    if profile is not None:
        meta["profile"] = profile
    return save_plan(plan, tmp / "plan.json", **meta)


def _one_line(res: Result) -> str:
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("error: ")
    return lines[0][len("error: "):]


# ---------------------------------------------------------------------------
# --print-launch
# ---------------------------------------------------------------------------


def test_print_launch_is_the_local_command(tmp_path: Path) -> None:
    path = str(_plan(tmp_path))
    res = CliRunner().invoke(run_command, [path, "--print-launch", "--steps", "7", "--threads", "2"])
    assert res.exit_code == 0, res.output
    last = res.stdout.strip().splitlines()[-1]
    assert last.startswith("OMP_NUM_THREADS=2 torchrun --standalone --nnodes=1 --nproc-per-node=2 --max-restarts=0 ")
    # The entry point and its flags are exactly what a local run hands torchrun.
    cfg = RunConfig(steps=7, launch=LaunchConfig(threads=2))
    assert shlex.split(last)[-len(entry_argv(path, cfg)):] == entry_argv(path, cfg)


def test_print_launch_for_several_nodes_is_one_line_for_all(tmp_path: Path) -> None:
    path = str(_plan(tmp_path))
    common = [path, "--print-launch", "--backend", "nccl", "--nnodes", "2", "--rdzv-endpoint", "node0:29400"]
    lines = []
    for node in ("0", "1"):
        res = CliRunner().invoke(run_command, [*common, "--node-rank", node])
        assert res.exit_code == 0, res.output
        assert f"(this is node {node})" in res.stdout
        lines.append(res.stdout.strip().splitlines()[-1])
    assert lines[0] == lines[1]  # works unchanged on each node
    words = shlex.split(lines[0])
    assert words[:5] == ["torchrun", "--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=node0:29400",
                         words[4]] and words[4].startswith("--rdzv-id=umsearch-")  # fmt: skip
    assert "--nproc-per-node=1" in words and not any(w.startswith("--node-rank") for w in words)
    assert "--backend=nccl" in words and not lines[0].startswith("OMP_NUM_THREADS")
    # The rendezvous id follows the plan's contents and flags, so every node derives the same one.
    again = CliRunner().invoke(run_command, common)
    assert again.stdout.strip().splitlines()[-1] == lines[0]
    other = CliRunner().invoke(run_command, [*common, "--steps", "3"])
    assert shlex.split(other.stdout.strip().splitlines()[-1])[4] != words[4]


def test_print_launch_quotes_every_word_the_user_gave(tmp_path: Path) -> None:
    """Issue 24, finding 5: the line runs nothing of what it quotes when pasted into a shell."""
    (tmp_path / "my plans").mkdir()
    path = str(_plan(tmp_path / "my plans"))
    endpoint = "$(touch pwned):29500"
    res = CliRunner().invoke(run_command, [path, "--print-launch", "--nnodes", "2", "--rdzv-endpoint", endpoint])
    assert res.exit_code == 0, res.output
    line = res.stdout.strip().splitlines()[-1]
    words = shlex.split(line)
    assert f"--rdzv-endpoint={endpoint}" in words and path in words
    # Pasted into bash with printf in torchrun's place: the words come out as they are, nothing runs.
    pasted = line.replace("torchrun ", "printf '%s\\n' ", 1)
    done = subprocess.run(["bash", "-c", pasted], cwd=tmp_path, capture_output=True, text=True, timeout=30,
                          check=True)  # fmt: skip
    assert done.stdout.splitlines() == words[words.index("torchrun") + 1 :] and not (tmp_path / "pwned").exists()


@pytest.mark.parametrize("args, message", [
    (["--nnodes", "2", "--rdzv-endpoint", "h:\u0662\u0669\u0665"], "must be HOST:PORT"),
    (["--nnodes", "2"], "--nnodes 2 needs --rdzv-endpoint HOST:PORT"),
    (["--nnodes", "3", "--rdzv-endpoint", "h:1"], "the plan has 2 rank(s), which do not fill 3 node(s)"),
    (["--nproc-per-node", "3"], "which do not fill 1 node(s) of 3 process(es)"),
    (["--nnodes", "2", "--rdzv-endpoint", "h"], "--rdzv-endpoint 'h' must be HOST:PORT"),
    (["--nnodes", "2", "--rdzv-endpoint", "h:1", "--node-rank", "2"], "--node-rank 2 is not a node of 2"),
])  # fmt: skip
def test_print_launch_shapes_are_checked(tmp_path: Path, args: list[str], message: str) -> None:
    res = CliRunner().invoke(run_command, [str(_plan(tmp_path)), "--print-launch", *args])
    assert res.exit_code == 1 and message in _one_line(res)


def test_print_launch_runs_the_checks_but_builds_nothing(tmp_path: Path) -> None:
    res = CliRunner().invoke(run_command, [str(_plan(tmp_path, deadlock=True)), "--print-launch"])
    assert res.exit_code == 1 and ": the plan deadlocks (rank " in _one_line(res)
    # A layer count that only building the model would reveal is the ranks' to find: nothing is built here.
    wrong = _plan(tmp_path, model={"source": "mlp", "args": {"layers": 9}})
    res = CliRunner().invoke(run_command, [str(wrong), "--print-launch"])
    assert res.exit_code == 0, res.output
    # ... but a local run checks it before starting anything.
    res = CliRunner().invoke(run_command, [str(wrong)])
    assert res.exit_code == 1 and f"covers layers [0, {LAYERS}) but the model has 10 layers" in _one_line(res)


@pytest.mark.parametrize("flag", [["--nproc-per-node", "2"], ["--nnodes", "2"], ["--rdzv-endpoint", "h:1"],
                                  ["--node-rank", "0"]])  # fmt: skip
def test_cluster_shapes_need_print_launch(tmp_path: Path, flag: list[str]) -> None:
    res = CliRunner().invoke(run_command, [str(_plan(tmp_path)), *flag])
    assert res.exit_code == 1 and f"{flag[0]} only shapes the --print-launch command" in _one_line(res)


def test_deadlocking_plan_is_refused_before_anything_starts(tmp_path: Path) -> None:
    res = CliRunner().invoke(run_command, [str(_plan(tmp_path, deadlock=True))])
    assert res.exit_code == 1 and "deadlocks" in _one_line(res)


def test_profile_mismatch_names_the_profile(tmp_path: Path) -> None:
    save_profile(uniform_profile(layers=LAYERS + 3), tmp_path / "prof.json")
    res = CliRunner().invoke(run_command, [str(_plan(tmp_path, profile="prof.json")), "--print-launch"])
    assert res.exit_code == 1
    assert f"does not fit profile {tmp_path / 'prof.json'}" in _one_line(res)


# ---------------------------------------------------------------------------
# One-line errors and outputs
# ---------------------------------------------------------------------------

_GLOO = "rank 1 failed: RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed [b]"


@click.command()
@one_line_errors
def _failing_command() -> None:
    raise RankFailure(_GLOO + "\nsecond line")


def test_a_rank_error_with_brackets_prints_as_one_literal_line() -> None:
    res = CliRunner().invoke(_failing_command, [])
    assert res.exit_code == 1
    assert _one_line(res) == _GLOO + " second line"


@pytest.mark.parametrize("flag", ["--out", "--trace"])
def test_unwritable_outputs_are_refused_before_the_run(tmp_path: Path, flag: str) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for target in (blocker / "x.json", tmp_path, Path("/proc/umsearch-no/x.json")):
        res = CliRunner().invoke(run_command, [str(_plan(tmp_path)), flag, str(target)])
        assert res.exit_code == 1
        assert f"{flag} {str(target)!r}" in _one_line(res)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "plan.json"]  # nothing partial


def test_validate_refuses_an_unwritable_out_first(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")
    res = CliRunner().invoke(validate_command, [str(_plan(tmp_path)), "--out", str(tmp_path / "f" / "o.json")])
    assert res.exit_code == 1 and "cannot be written" in _one_line(res)


def test_validate_needs_a_profile(tmp_path: Path) -> None:
    res = CliRunner().invoke(validate_command, [str(_plan(tmp_path))])
    assert res.exit_code == 1 and "names no profile; pass --profile" in _one_line(res)


def test_warnings_for_untrustworthy_measurements(tmp_path: Path) -> None:
    prof = tmp_path / "prof.json"
    save_profile(uniform_profile(layers=LAYERS), prof)
    loaded = load_plan_file(_plan(tmp_path, profile="prof.json", profile_sha256=file_sha256(prof)))
    adam = RunConfig(optimizer="adam")  # the plan's state_factor 4: Adam's
    assert run_warnings(loaded, adam, cpus=2) == []
    [sgd] = run_warnings(loaded, RunConfig(), cpus=2)
    assert sgd.startswith("--optimizer sgd keeps 2 bytes of state per parameter byte but the plan's memory was "
                          "predicted with state_factor 4") and "--optimizer adam" in sgd
    save_profile(uniform_profile(layers=LAYERS, fwd=9.0), prof)  # re-measured since the search
    [stale] = run_warnings(loaded, adam, cpus=2)
    assert "not the one the plan was searched on" in stale
    [_, crowded] = run_warnings(loaded, replace(adam, launch=LaunchConfig(threads=2)), cpus=3)
    assert crowded.startswith("2 ranks x 2 thread(s) need 4 cores but 3 are available")


# ---------------------------------------------------------------------------
# End to end (slow: torchrun, two ranks)
# ---------------------------------------------------------------------------


@pytest.mark.slow
def test_run_json_out_and_trace_of_the_median_iteration(tmp_path: Path) -> None:
    save_profile(uniform_profile(layers=LAYERS, fwd=0.5, bwd=1.0), tmp_path / "prof.json")
    trace, out = tmp_path / "t" / "trace.json", tmp_path / "run.json"
    args = [str(_plan(tmp_path, profile="prof.json")), "--steps", "4", "--warmup-steps", "1", "--json",
            "--trace", str(trace), "--out", str(out)]  # fmt: skip
    res = CliRunner().invoke(run_command, args)
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc == json.loads(out.read_text())
    assert doc["schema"] == "umsearch.run/1" and doc["model"] == MLP
    assert [s["step"] for s in doc["steps"]] == [0, 1, 2, 3]
    assert all(math.isfinite(s["loss"]) and s["iteration_ms"] > 0 for s in doc["steps"])
    assert doc["predicted_iteration_ms"] > 0
    # The median is an actual iteration (the lower middle of the 3 kept), and the trace shows that one.
    kept = sorted(s["iteration_ms"] for s in doc["steps"][1:])
    assert doc["median_iteration_ms"] == kept[1]
    q1, q3 = doc["quartiles_ms"]
    assert kept[0] <= q1 <= doc["median_iteration_ms"] <= q3 <= kept[2]
    written = json.loads(trace.read_text())
    assert written["metadata"]["iteration_ms"] == doc["median_iteration_ms"]
    ops = [e for e in written["traceEvents"] if e["ph"] == "X"]
    assert len(ops) == 8  # 2 stages x (2 forwards + 2 backwards)
    assert max(e["ts"] + e["dur"] for e in ops) == pytest.approx(doc["median_iteration_ms"] * 1e3, rel=1e-6)


@pytest.mark.slow
def test_run_prints_the_median_and_its_iqr(tmp_path: Path) -> None:
    res = CliRunner().invoke(run_command, [str(_plan(tmp_path)), "--steps", "3", "--warmup-steps", "1"])
    assert res.exit_code == 0, res.output
    assert "median iteration" in res.stdout and "IQR" in res.stdout and "of the last 2 step(s)" in res.stdout


@pytest.mark.slow
def test_validate_runs_plans_side_by_side_with_a_confidence_interval(tmp_path: Path) -> None:
    save_profile(uniform_profile(layers=LAYERS, fwd=0.5, bwd=1.0), tmp_path / "prof.json")
    first = _plan(tmp_path, profile="prof.json")
    second = tmp_path / "second.json"
    gpipe = warmup_plan(8, [([4, 4], [4, 4], 2, False), ([4, 4], [4, 4], 2, False)])
    gpipe = replace(gpipe, stages=tuple(replace(g, layers=s.layers) for g, s in zip(gpipe.stages, two_rank_plan().stages, strict=True)))
    save_plan(gpipe, second, model=MLP, profile="prof.json")
    out = tmp_path / "fid.json"
    res = CliRunner().invoke(validate_command, [str(first), str(second), "--rounds", "4", "--warmup-steps", "1",
                                                "--out", str(out)])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "95%" in res.stdout and "machine drift" in res.stdout and "MAPE" in res.stdout
    doc = json.loads(out.read_text())
    assert doc["schema"] == "umsearch.fidelity/2" and doc["rounds"] == 4
    for row in doc["plans"]:
        assert len(row["measured_ms"]) == 4
        lo, hi = row["measured_ci95_ms"]
        assert min(row["measured_ms"]) <= lo <= row["measured_median_ms"] <= hi <= max(row["measured_ms"])
        assert row["error"] == (row["predicted_ms"] - row["measured_median_ms"]) / row["measured_median_ms"]
        assert len(row["busy_error"]) == 2
    assert doc["mape_percent"] == pytest.approx(100 * sum(abs(r["error"]) for r in doc["plans"]) / 2)


# ---------------------------------------------------------------------------
# validate's statistics (no processes)
# ---------------------------------------------------------------------------


def test_rounds_rotate_every_contender_through_every_position() -> None:
    from umsearch.runtime.fidelity import rotation

    for n in (1, 2, 3, 5):
        orders = [rotation(n, r) for r in range(n)]
        assert all(sorted(o) == list(range(n)) for o in orders)
        for pos in range(n):
            assert sorted(o[pos] for o in orders) == list(range(n))


def test_bootstrap_interval_of_the_median() -> None:
    from umsearch.runtime.fidelity import bootstrap_median_ci

    values = [10.0, 11.0, 9.5, 10.2, 30.0, 10.1, 9.9, 10.4]
    lo, hi = bootstrap_median_ci(values)
    assert min(values) <= lo <= sorted(values)[3] <= sorted(values)[4] <= hi <= max(values)
    assert bootstrap_median_ci(values) == (lo, hi)  # seeded
    assert hi < 30.0  # the median shrugs off the outlier
    assert bootstrap_median_ci([4.0] * 6) == (4.0, 4.0)
    assert bootstrap_median_ci([7.0]) == (7.0, 7.0)


def test_drift_compares_the_halves_of_the_rounds() -> None:
    from umsearch.runtime.fidelity import drift

    assert drift([1.0, 1.0, 2.0, 2.0]) == 1.0
    assert drift([2.0, 2.0, 2.0, 1.0, 1.0, 1.0]) == -0.5
    assert drift([3.0, 9.0, 3.0]) == 0.0  # odd counts compare the outer halves
    assert drift([5.0]) == 0.0


def test_a_fidelity_row_compares_measured_rounds_with_the_simulation(tmp_path: Path) -> None:
    from umsearch.core.actions import ActionRecord
    from umsearch.core.cost import CostModel
    from umsearch.runtime.fidelity import Contender, FidelityReport, fidelity_row
    from umsearch.runtime.run_plan import StepResult
    from umsearch.sim.reference import simulate

    plan = two_rank_plan()
    cost = CostModel(uniform_profile(layers=LAYERS))
    sim = simulate(plan, cost)
    c = Contender(name="p", plan=plan, cost=cost, factory=lambda: None)  # type: ignore[arg-type, return-value]

    def step(scale: float) -> StepResult:
        recs = tuple(replace(a, start_ms=a.start_ms * scale, end_ms=a.end_ms * scale) for a in sim.records)
        assert all(isinstance(a, ActionRecord) for a in recs)
        return StepResult(iteration_ms=max(a.end_ms for a in recs), step_ms=0.0, loss=None, records=recs)

    row = fidelity_row(c, [step(s) for s in (1.0, 2.0, 1.5, 1.2, 1.1)])
    assert sim.iteration_ms is not None and sim.busy_ms is not None
    assert row.predicted_ms == sim.iteration_ms
    assert row.measured_ms == 1.2 * sim.iteration_ms  # the median round
    assert row.error == pytest.approx(1 / 1.2 - 1)
    assert row.measured_busy_ms == pytest.approx(tuple(1.2 * b for b in sim.busy_ms))
    assert row.measured_ci_ms[0] <= row.measured_ms <= row.measured_ci_ms[1]
    assert FidelityReport(rows=(row,), rounds=5).mape_percent == pytest.approx(100 * abs(1 / 1.2 - 1))


# ---------------------------------------------------------------------------
# Run statistics (issue 24, finding 4: a median outside its own IQR)
# ---------------------------------------------------------------------------


def _result(times: list[float]) -> RunResult:
    return RunResult(steps=tuple(StepResult(iteration_ms=t, step_ms=t, loss=None, records=()) for t in times),
                     grads=None)  # fmt: skip


def test_the_median_of_two_steps_lies_inside_its_iqr() -> None:
    # --steps 2 --warmup-steps 5 kept both steps; the interpolated Q1 (899) lay above the median (782).
    result = _result([1250.0, 782.0])
    assert result.median_iteration_ms(5) == 782.0
    assert result.quartiles_ms(5) == (782.0, 1016.0)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.001, 1e6), min_size=1, max_size=40), st.integers(0, 5))
def test_the_median_always_lies_inside_its_iqr(times: list[float], warmup: int) -> None:
    result = _result(times)
    q1, q3 = result.quartiles_ms(warmup)
    kept = [s.iteration_ms for s in result.kept(warmup)]
    assert min(kept) <= q1 <= result.median_iteration_ms(warmup) <= q3 <= max(kept)
