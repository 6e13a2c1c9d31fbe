"""``simulate`` and ``show`` on a plan with data-parallel replicas (docs/model.md section 9, example 8)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.helpers import run_cli
from tests.contract import EXAMPLE3, example8, example8_profile, unit_profile
from umsearch.core.plan_io import save_plan
from umsearch.core.profile import save_profile


@pytest.fixture()
def files(tmp_path: Path) -> Path:
    save_profile(example8_profile(), tmp_path / "prof.json")
    save_plan(example8("pp_inner"), tmp_path / "plan.json", profile="prof.json")
    return tmp_path


def test_simulate_json_gives_both_ends(files: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "simulate", str(files / "plan.json"), "--json")
    assert code == 0
    got = json.loads(out)
    assert got["iteration_ms"] == pytest.approx(41.004, abs=1e-9)
    assert got["compute_end_ms"] == pytest.approx(19.004, abs=1e-9)
    assert got["allreduce_end_ms"] == pytest.approx(41.004, abs=1e-9)
    assert got["peak_memory_bytes"] == [8_000_080.0, 8_000_040.0]


def test_simulate_json_without_replicas(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One replica: the compute end is the iteration and there is no all-reduce (null)."""
    save_profile(unit_profile(4), tmp_path / "prof.json")
    save_plan(EXAMPLE3, tmp_path / "plan.json", profile="prof.json")
    code, out, _ = run_cli(capsys, "simulate", str(tmp_path / "plan.json"), "--json")
    got = json.loads(out)
    assert code == 0 and got["iteration_ms"] == got["compute_end_ms"] == 27.0 and got["allreduce_end_ms"] is None


def test_show_draws_the_all_reduce_lanes(files: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gantt = files / "g.png"
    code, _, _ = run_cli(capsys, "show", str(files / "plan.json"), "--gantt", str(gantt))
    assert code == 0
    assert gantt.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
