"""The CLI: exit codes, JSON output and one-line errors for bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.strategies import uniform_profile
from umsearch.cli import main
from umsearch.core.plan import Plan, save_plan, uniform_plan
from umsearch.core.profile import save_profile


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(list(args))
        raise SystemExit(0)
    out = capsys.readouterr()
    return int(exc.value.code or 0), out.out, out.err


@pytest.fixture()
def files(tmp_path: Path) -> Path:
    save_profile(uniform_profile(), tmp_path / "prof.json")
    p = uniform_plan([0, 1, 2, 3, 4], 8, 8, "1f1b")
    save_plan(Plan(global_batch=8, stages=p.stages, profile="prof.json"), tmp_path / "plan.json")
    return tmp_path


def test_simulate_json(files: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "simulate", str(files / "plan.json"), "--json")
    assert code == 0
    got = json.loads(out)
    assert got["iteration_ms"] == 33.0 and got["deadlock"] is False
    assert got["peak_memory_bytes"] == [440.0, 430.0, 420.0, 410.0]


def test_simulate_deadlock_exits_zero(files: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = {"schema": "umsearch.core.plan/1", "global_batch": 8, "profile": "prof.json", "stages": [
        {"layers": [0, 2], "forward": [1, 3, 4], "backward": [2, 6], "warmup": 1, "recompute": True},
        {"layers": [2, 4], "forward": [4, 4], "backward": [8], "warmup": 2, "recompute": True}]}  # fmt: skip
    (files / "dead.json").write_text(json.dumps(plan))
    code, out, _ = _run(capsys, "simulate", str(files / "dead.json"), "--json")
    assert code == 0
    assert json.loads(out)["deadlock"] is True and json.loads(out)["iteration_ms"] is None


def _bad_plan(base: dict, **change: object) -> dict:  # type: ignore[type-arg]
    return {**base, **change}


PLAN = {"schema": "umsearch.core.plan/1", "global_batch": 4, "profile": "prof.json",
        "stages": [{"layers": [0, 2], "forward": [2, 2], "warmup": 2}, {"layers": [2, 4], "forward": [4], "warmup": 1}]}  # fmt: skip


@pytest.mark.parametrize(
    "change,match",
    [
        ({"schema": "umsearch.core.plan/0"}, "unknown plan schema"),
        ({"global_batch": 5}, "sums to 4 but global_batch is 5"),
        ({"stages": [{"layers": [0, 3], "forward": [4], "warmup": 1}]}, "model has 4 layers"),
        ({"stages": [{"layers": [0, 2], "forward": [4], "warmup": 1}, {"layers": [3, 4], "forward": [4], "warmup": 1}]}, "previous stage ends at 2"),
        ({"stages": [{"layers": [0, 4], "forward": [4], "warmup": 0}]}, "warmup = 0"),
        ({"stages": [{"layers": [0, 4], "forward": [4, 0], "warmup": 1}]}, r"forward\[1\] must be a positive"),
        ({"stages": [{"layers": [0, 4], "forward": [4], "backward": [2, 2], "warmup": 1}]}, "does not recompute"),
    ],
)
def test_bad_plans(files: Path, capsys: pytest.CaptureFixture[str], change: dict, match: str) -> None:  # type: ignore[type-arg]
    (files / "bad.json").write_text(json.dumps({**PLAN, **change}))
    code, _, err = _run(capsys, "simulate", str(files / "bad.json"))
    assert code == 1
    assert err.count("\n") == 1 and "error:" in err
    import re

    assert re.search(match, err.replace("\n", ""))


PROFILE_CHANGES = [
    (lambda p: p.pop("link"), "missing field 'link'"),
    (lambda p: p.update(microbatch_sizes=[2, 4]), "must start with 1"),
    (lambda p: p.update(microbatch_sizes=[1, 1]), "strictly ascending"),
    (lambda p: p["layers"][1].update(fwd_ms=[1.0, -1.0]), r"layers\[1\].fwd_ms\[1\] must be non-negative"),
    (lambda p: p["layers"][0].update(bwd_ms=[1.0]), r"layers\[0\].bwd_ms has 1 values"),
    (lambda p: p["link"].update(bandwidth_gb_per_s=0), "bandwidth_gb_per_s must be positive"),
    (lambda p: p.update(schema="umsearch.core.profile/9"), "unknown profile schema"),
    (lambda p: p["layers"][2].pop("stash_bytes"), r"missing field layers\[2\].'stash_bytes'"),
    (lambda p: p.update(input_bytes="big"), "input_bytes must be a number"),
]


@pytest.mark.parametrize("mutate,match", PROFILE_CHANGES)
def test_bad_profiles(files: Path, capsys: pytest.CaptureFixture[str], mutate, match: str) -> None:  # type: ignore[no-untyped-def]
    prof = json.loads((files / "prof.json").read_text())
    mutate(prof)
    (files / "prof.json").write_text(json.dumps(prof))
    code, _, err = _run(capsys, "simulate", str(files / "plan.json"))
    assert code == 1
    import re

    assert re.search(match, err.replace("\n", "")), err


def test_nan_time_rejected(files: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = (files / "prof.json").read_text().replace('"fwd_ms": [\n        1.0', '"fwd_ms": [\n        NaN', 1)
    (files / "prof.json").write_text(text)
    code, _, err = _run(capsys, "simulate", str(files / "plan.json"))
    assert code == 1 and "must be finite" in err


def test_show_writes_gantt_and_trace(files: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, _ = _run(capsys, "show", str(files / "plan.json"), "--gantt", str(files / "g.png"), "--trace", str(files / "t.json"))
    assert code == 0
    assert (files / "g.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    trace = json.loads((files / "t.json").read_text())
    xs = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(xs) == 4 * 16 and max(e["ts"] + e["dur"] for e in xs) == pytest.approx(33_000)


def test_search_json(files: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "search", "--profile", str(files / "prof.json"), "--stages", "2", "--batch", "8",
                        "--generations", "3", "--out", str(files / "res"), "--json")  # fmt: skip
    assert code == 0
    got = json.loads(out)
    assert got["iteration_ms"] <= min(b["iteration_ms"] for b in got["baselines"] if b["iteration_ms"])
    assert (files / "res" / "plan.json").exists()


def test_search_bad_flag_value(files: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(capsys, "search", "--profile", str(files / "prof.json"), "--stages", "9", "--batch", "8")
    assert code == 1 and "stages = 9" in err
