"""Predicted peak memory against the devices' (``run`` refuses what cannot fit, unless ``--force-memory``)
and against what a run measured (``run`` and ``validate`` report both per rank)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from tests.runtime.helpers import plan_of
from tests.strategies import uniform_profile
from umsearch.cli.run import run_command
from umsearch.core.actions import ActionRecord
from umsearch.core.plan_io import save_plan
from umsearch.core.profile import save_profile
from umsearch.core.units import format_bytes
from umsearch.errors import PlanError
from umsearch.runtime.preflight import DeviceMemory, check_memory, memory_refusal
from umsearch.runtime.run_plan import (
    NOT_MEASURED_ON_CPU,
    RunResult,
    StepResult,
    measured_peaks,
    memory_lines,
    memory_report,
    merge_step,
)

GiB = 2**30
MLP: dict[str, Any] = {"source": "mlp", "args": {"layers": 3, "width": 16}}


# ---------------------------------------------------------------------------
# The refusal, a pure function of byte counts
# ---------------------------------------------------------------------------


def test_a_rank_above_its_gpu_is_named_with_both_figures() -> None:
    gpus = [DeviceMemory(name="cuda:0 (H100)", bytes=80 * GiB), DeviceMemory(name="cuda:1 (H100)", bytes=80 * GiB)]
    assert memory_refusal([10 * GiB, 81.5 * GiB], gpus) == (
        "rank 1 is predicted to peak at 81.50 GiB (docs/model.md section 5) but cuda:1 (H100) has 80.00 GiB")
    assert memory_refusal([10 * GiB, 80 * GiB], gpus) is None  # exactly full fits


def test_the_worst_rank_is_named_when_several_are_over() -> None:
    gpus = [DeviceMemory(name=f"cuda:{i} (A)", bytes=16 * GiB) for i in range(3)]
    why = memory_refusal([17 * GiB, 30 * GiB, 20 * GiB], gpus)
    assert why is not None and why.startswith("rank 1 is predicted to peak at 30.00 GiB")


def test_ranks_sharing_the_host_must_fit_together() -> None:
    host = DeviceMemory(name="this host's available memory", bytes=8 * GiB)
    assert memory_refusal([3 * GiB, 4 * GiB], [host, host]) is None
    assert memory_refusal([3 * GiB, 6 * GiB], [host, host]) == (
        "ranks 0, 1 (2 processes) share this host's available memory: together predicted to peak at 9.00 GiB "
        "(docs/model.md section 5; rank 1 the most, 6.00 GiB) but it has 8.00 GiB")


def test_data_parallel_copies_name_their_pipeline_rank() -> None:
    host = DeviceMemory(name="this host's available memory", bytes=5 * GiB)
    why = memory_refusal([1 * GiB, 6 * GiB, 1 * GiB, 6 * GiB], [host] * 4, ranks=[0, 1, 0, 1])
    assert why == ("rank 1 is predicted to peak at 6.00 GiB (docs/model.md section 5) but this host's available "
                   "memory has 5.00 GiB")  # fmt: skip


def test_check_memory_says_the_ways_out_in_one_line() -> None:
    with pytest.raises(PlanError) as err:
        check_memory([2 * GiB], [DeviceMemory(name="cuda:0 (T4)", bytes=1 * GiB)])
    text = str(err.value)
    assert "\n" not in text and text == (
        "rank 0 is predicted to peak at 2.00 GiB (docs/model.md section 5) but cuda:0 (T4) has 1.00 GiB: the run "
        "would run out of memory; search again with --memory-limit at or below the device's memory, or pass "
        "--force-memory to run anyway")
    check_memory([1 * GiB], [DeviceMemory(name="cuda:0 (T4)", bytes=1 * GiB)])  # fits: no error


def test_sizes_print_as_the_tables_do() -> None:
    assert [format_bytes(v) for v in (512, 1536, 3 * 2**20, 1.5 * GiB)] == ["512 B", "1.50 KiB", "3.00 MiB", "1.50 GiB"]


def test_mismatched_lists_are_a_programming_error() -> None:
    with pytest.raises(ValueError, match="must match"):
        memory_refusal([1.0, 2.0], [DeviceMemory(name="x", bytes=1.0)])


# ---------------------------------------------------------------------------
# What a run measured, beside the prediction
# ---------------------------------------------------------------------------


class _Stats:
    """The fields of an IterationStats that merge_step reads."""

    def __init__(self, rank: int, peak: int | None, replica: int = 0) -> None:
        self.rank, self.replica, self.peak_memory_bytes = rank, replica, peak
        self.actions = (ActionRecord(rank=rank, stage=rank, kind="F", mb=0, size=1, start_ms=0.0, end_ms=1.0),)
        self.loss, self.step_ms, self.allreduce_end_ms = None, 1.0, None


def test_merged_steps_keep_each_ranks_device_peak_the_largest_of_its_replicas() -> None:
    step = merge_step([_Stats(0, 100), _Stats(1, 300), _Stats(0, 150, replica=1), _Stats(1, 200, replica=1)])
    assert step.peak_memory_bytes == (150, 300)
    assert merge_step([_Stats(0, None), _Stats(1, None)]).peak_memory_bytes == (None, None)  # CPU ranks
    later = merge_step([_Stats(0, 120), _Stats(1, 500)])
    assert measured_peaks([step, later]) == (150, 500)


def test_the_report_per_rank_on_cuda_and_on_cpu() -> None:
    cuda = memory_report([1000.0, 2000.0], [1500, 1000], ranks=2, state_factor="state_factor 2 (--optimizer sgd)")
    assert [(r["rank"], r["ratio"], r["over_prediction"]) for r in cuda["ranks"]] == [(0, 1.5, True), (1, 0.5, False)]
    assert "max_memory_allocated" in cuda["measured_by"] and "state_factor 2 (--optimizer sgd)" in cuda["predicted_by"]
    assert memory_lines(cuda)[:2] == ["rank 0 peak memory: predicted 1000 B, measured 1.46 KiB (1.50x, over the "
                                      "prediction)", "rank 1 peak memory: predicted 1.95 KiB, measured 1000 B (0.50x)"]  # fmt: skip
    cpu = memory_report([1000.0, 2000.0], [], ranks=2)
    assert cpu["measured_by"] == NOT_MEASURED_ON_CPU and "umsearch replay" in NOT_MEASURED_ON_CPU
    assert memory_lines(cpu)[0] == "rank 0 peak memory: predicted 1000 B, measured -"
    assert memory_report(None, [None, None], ranks=2)["ranks"][1]["predicted_peak_bytes"] is None


# ---------------------------------------------------------------------------
# umsearch run
# ---------------------------------------------------------------------------


def _plan_file(tmp: Path, params: float) -> Path:
    plan = plan_of(8, ((0, 2), [4, 4], None, 2), ((2, 4), [4, 4], None, 1))
    save_profile(uniform_profile(layers=4, fwd=0.5, bwd=1.0, params=params), tmp / "prof.json")
    return save_plan(plan, tmp / "plan.json", model=MLP, profile="prof.json")


def _fake_run(monkeypatch: pytest.MonkeyPatch, peaks: tuple[int | None, ...]) -> list[int]:
    """Stand in for the torchrun launch: every step measured ``peaks``; returns the launches made."""
    import umsearch.runtime.run_plan as run_plan

    launched: list[int] = []

    def run_plan_file(path: Any, processes: int, cfg: Any, choice: Any = None) -> RunResult:
        launched.append(processes)
        step = StepResult(iteration_ms=2.0, step_ms=2.5, loss=1.0, records=(), peak_memory_bytes=peaks)
        return RunResult(steps=(step,) * cfg.steps, grads=None)

    monkeypatch.setattr(run_plan, "run_plan_file", run_plan_file)
    return launched


def _one_line(res: Result) -> str:
    lines = [ln for ln in res.stderr.splitlines() if ln.strip() and not ln.startswith("warning:")]
    assert res.exit_code == 1 and len(lines) == 1 and lines[0].startswith("error: "), res.output
    return lines[0][len("error: "):]


def test_run_refuses_a_plan_above_the_hosts_memory_before_launching(monkeypatch: pytest.MonkeyPatch,
                                                                     tmp_path: Path) -> None:  # fmt: skip
    launched = _fake_run(monkeypatch, (None, None))
    path = _plan_file(tmp_path, params=1e16)  # 2 layers x 1e16 bytes x state factor 2 per rank: petabytes
    res = CliRunner().invoke(run_command, [str(path), "--steps", "1", "--warmup-steps", "0"])
    line = _one_line(res)
    assert line.startswith("rank ") and "is predicted to peak at " in line and "PiB" not in line
    assert "this host's available memory has " in line and "--force-memory" in line
    assert launched == []


def test_force_memory_runs_it_and_reports_memory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    launched = _fake_run(monkeypatch, (None, None))
    path = _plan_file(tmp_path, params=1e16)
    out = tmp_path / "run.json"
    res = CliRunner().invoke(run_command, [str(path), "--steps", "1", "--warmup-steps", "0", "--force-memory",
                                           "--out", str(out)])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert launched == [2]
    assert "rank 0 peak memory: predicted " in res.stdout and "measured -" in res.stdout
    assert "measured: not on CPU ranks (they have no allocator peak)" in res.stdout
    doc = json.loads(out.read_text())
    rows = doc["memory"]["ranks"]
    # sgd (the default --optimizer) keeps 2 bytes of state per parameter byte; two layers per rank
    assert [r["predicted_peak_bytes"] >= 2 * 2 * 1e16 for r in rows] == [True, True]
    assert [r["measured_peak_bytes"] for r in rows] == [None, None]


def test_run_reports_the_measured_device_peak_where_there_is_one(monkeypatch: pytest.MonkeyPatch,
                                                                  tmp_path: Path) -> None:  # fmt: skip
    _fake_run(monkeypatch, (5000, 9000))
    res = CliRunner().invoke(run_command, [str(_plan_file(tmp_path, params=100.0)), "--steps", "2", "--warmup-steps",
                                           "1", "--json"])  # fmt: skip
    assert res.exit_code == 0, res.output
    mem = json.loads(res.stdout)["memory"]
    assert [r["measured_peak_bytes"] for r in mem["ranks"]] == [5000, 9000]
    assert all(r["over_prediction"] for r in mem["ranks"])  # a few hundred bytes predicted
    assert "max_memory_allocated" in mem["measured_by"]


@pytest.mark.slow
def test_a_real_run_tallies_each_ranks_memory_in_the_models_terms() -> None:
    import functools

    from tests.runtime.test_distributed import PLANS, tiny_model
    from umsearch.runtime.config import LaunchConfig, RunConfig
    from umsearch.runtime.run_plan import MEASURED_BY_TALLY, memory_report, run_plan

    plan = PLANS["1f1b-unequal"]
    result = run_plan(plan, functools.partial(tiny_model, plan.num_layers), RunConfig(steps=2, seed=1,
                      launch=LaunchConfig(timeout_s=60)))  # fmt: skip
    model = tiny_model(plan.num_layers)
    for r, peak in enumerate(result.tallied_peak_bytes):
        params = sum(p.numel() * p.element_size() for j in plan.stages_of(r)
                     for i in range(plan.stages[j].lo, plan.stages[j].hi) for p in model.layers[i].parameters())  # fmt: skip
        assert peak is not None and peak > 2 * params  # weights and SGD's gradients, plus saved activations
    report = memory_report([1.0, 1.0], result.peak_memory_bytes(1), ranks=2, tallied=result.tallied_peak_bytes)
    assert report["measured_by"] == MEASURED_BY_TALLY
    assert [row["measured_peak_bytes"] for row in report["ranks"]] == list(result.tallied_peak_bytes)
