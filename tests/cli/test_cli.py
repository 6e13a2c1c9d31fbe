"""The CLI: exit codes, JSON output and one-line errors for bad input."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.cli.helpers import run_cli
from tests.strategies import uniform_profile
from umsearch.core.plan import placed_plan
from umsearch.core.plan_io import save_plan
from umsearch.core.profile import save_profile
from umsearch.core.schedules import one_f_one_b

_run = run_cli


@pytest.fixture()
def files(tmp_path: Path) -> Path:
    save_profile(uniform_profile(), tmp_path / "prof.json")
    plan = placed_plan([0, 1, 2, 3, 4], [0, 1, 2, 3], 8, [[1] * 8] * 4, one_f_one_b(4, 8))
    save_plan(plan, tmp_path / "plan.json", profile="prof.json")
    return tmp_path


def test_simulate_json(files: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "simulate", str(files / "plan.json"), "--json")
    assert code == 0
    got = json.loads(out)
    # 1F1B, 4 ranks, 8 microbatches, F = 1 and B = 2 ms: (ranks - 1 + microbatches) x 3 ms.
    assert got["iteration_ms"] == 33.0 and got["deadlock"] is False
    # 400 B of state (100 B of parameters x 4) plus 10 B per microbatch in flight: 4, 3, 2, 1.
    assert got["peak_memory_bytes"] == [440.0, 430.0, 420.0, 410.0]
    assert got["busy_ms"] == [24.0] * 4 and got["stage_busy_ms"] == [24.0] * 4


def test_simulate_tables(files: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "simulate", str(files / "plan.json"))
    assert code == 0 and "1x8" in out and "iteration time 33.000 ms" in out


def test_simulate_deadlock_exits_zero(files: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = {"schema": "umsearch.plan/2", "global_batch": 8, "ranks": 2, "profile": "prof.json", "stages": [
        {"layers": [0, 2], "rank": 0, "forward": [4, 4], "backward": [4, 4]},
        {"layers": [2, 4], "rank": 1, "forward": [8], "backward": [8]}],
        "actions": [["0F0", "0B0", "0F1", "0B1"], ["1F0", "1B0"]]}  # fmt: skip
    (files / "dead.json").write_text(json.dumps(plan))
    code, out, _ = _run(capsys, "simulate", str(files / "dead.json"), "--json")
    assert code == 0
    got = json.loads(out)
    assert got["deadlock"] is True and got["iteration_ms"] is None
    assert got["blocked"] == ["rank 0 is stuck at 0B0, waiting for 1B0 on rank 1",
                              "rank 1 is stuck at 1F0, waiting for 0F1 on rank 0"]  # fmt: skip


def test_a_version_1_plan_loads_and_simulates(files: Path, capsys: pytest.CaptureFixture[str]) -> None:
    v1 = {"schema": "umsearch.plan/1", "global_batch": 8, "profile": "prof.json",
          "stages": [{"layers": [i, i + 1], "forward": [1] * 8, "warmup": 4 - i} for i in range(4)]}  # fmt: skip
    (files / "v1.json").write_text(json.dumps(v1))
    code, out, _ = _run(capsys, "simulate", str(files / "v1.json"), "--json")
    assert code == 0 and json.loads(out)["iteration_ms"] == 33.0


PLAN = {"schema": "umsearch.plan/2", "global_batch": 4, "ranks": 2, "profile": "prof.json",
        "stages": [{"layers": [0, 2], "rank": 0, "forward": [2, 2], "backward": [2, 2]},
                   {"layers": [2, 4], "rank": 1, "forward": [4], "backward": [4]}],
        "actions": [["0F0", "0F1", "0B0", "0B1"], ["1F0", "1I0", "1W0"]]}  # fmt: skip


def _stages(*changes: dict[str, object]) -> list[dict[str, object]]:
    return [{**st, **ch} for st, ch in zip(PLAN["stages"], changes, strict=True)]  # type: ignore[arg-type, dict-item]


@pytest.mark.parametrize(
    "change,match",
    [
        ({"schema": "umsearch.plan/0"}, "unknown plan schema"),
        ({"global_batch": 5}, "sums to 4 but global_batch is 5"),
        ({"stages": _stages({}, {"layers": [2, 3]})}, "has 4 layers"),
        ({"stages": _stages({}, {"layers": [3, 4]})}, "ends at 2"),
        ({"stages": _stages({"forward": [4, 0]}, {})}, r"forward\[1\] = 0 must be between 1"),
        ({"stages": _stages({"backward": [1, 3]}, {})}, "recompute"),
        ({"actions": [["0F0", "0F1", "0B0", "0B1"], ["1F0", "1W0", "1I0"]]}, "rank 1: 1W0 comes before 1I0"),
        ({"actions": [["0F0", "0F1", "0B0", "0B1", "1F0"], ["1I0", "1W0"]]}, "rank 0 lists 1F0 but stage 1 is on rank 1"),
    ],
)  # fmt: skip
def test_bad_plans(files: Path, capsys: pytest.CaptureFixture[str], change: dict, match: str) -> None:  # type: ignore[type-arg]
    (files / "bad.json").write_text(json.dumps({**PLAN, **change}))
    code, _, err = _run(capsys, "simulate", str(files / "bad.json"))
    assert code == 1
    assert err.count("\n") == 1 and "error:" in err
    assert re.search(match, err.replace("\n", "")), err


def test_a_split_backward_needs_the_profiles_input_and_weight_times(files: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    save_profile(uniform_profile(split=False), files / "prof.json")
    (files / "split.json").write_text(json.dumps(PLAN))
    code, _, err = _run(capsys, "simulate", str(files / "split.json"))
    assert code == 1 and re.search("stage 1 uses I/W but layer 2 has no bwd_input_ms", err), err


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
    assert re.search(match, err.replace("\n", "")), err


def test_nan_time_rejected(files: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = (files / "prof.json").read_text().replace('"fwd_ms": [\n        1.0', '"fwd_ms": [\n        NaN', 1)
    (files / "prof.json").write_text(text)
    code, _, err = _run(capsys, "simulate", str(files / "plan.json"))
    assert code == 1 and "NaN is not JSON" in err


def test_show_writes_gantt_and_trace(files: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, _ = _run(capsys, "show", str(files / "plan.json"), "--gantt", str(files / "g.png"), "--trace", str(files / "t.json"))
    assert code == 0
    assert (files / "g.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    trace = json.loads((files / "t.json").read_text())
    xs = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(xs) == 4 * 16 and max(e["ts"] + e["dur"] for e in xs) == pytest.approx(33_000)
    assert {e["tid"] for e in xs} == {0, 1, 2, 3} and xs[0]["name"] == "0F0 [1]"


def test_search_json(files: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "search", "--profile", str(files / "prof.json"), "--stages", "2", "--batch", "8",
                        "--generations", "3", "--out", str(files / "res"), "--json")  # fmt: skip
    assert code == 0
    got = json.loads(out)
    assert got["iteration_ms"] <= min(b["iteration_ms"] for b in got["baselines"] if b["iteration_ms"])
    assert (files / "res" / "plan.json").exists()


def test_search_bad_flag_value(files: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(capsys, "search", "--profile", str(files / "prof.json"), "--ranks", "9", "--batch", "8")
    assert code == 1 and "ranks = 9" in err, err


def test_export_pipelining_csv_and_torchtitan(files: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import tomllib

    code, out, err = _run(capsys, "export", str(files / "plan.json"), "--format", "pipelining-csv",
                          "--out", str(files / "csv"))  # fmt: skip
    assert code == 0, err
    assert (files / "csv" / "schedule.csv").read_text().splitlines()[0].startswith("0F0,0F1,0F2,0F3,0B0")
    code, out, err = _run(capsys, "export", str(files / "plan.json"), "--format", "torchtitan",
                          "--out", str(files / "tt"), "--json")  # fmt: skip
    assert code == 0, err
    cfg = tomllib.loads((files / "tt" / "torchtitan.toml").read_text())
    assert cfg["training"] == {"local_batch_size": 8}
    assert cfg["parallelism"] == {"pipeline_parallel_degree": 4, "pipeline_parallel_microbatch_size": 1,
                                  "module_fqns_per_model_part": [["l0"], ["l1"], ["l2"], ["l3"]],
                                  "pipeline_parallel_schedule": "1F1B"}  # fmt: skip


def test_export_of_an_unequal_plan_without_baselines_says_what_to_do(files: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    (files / "u.json").write_text(json.dumps({**PLAN, "stages": _stages({}, {"forward": [1, 3], "backward": [1, 3]}),
                                              "actions": [["0F0", "0F1", "0B0", "0B1"], ["1F0", "1F1", "1B0", "1B1"]]}))
    code, _, err = _run(capsys, "export", str(files / "u.json"), "--format", "pipelining-csv", "--out", str(files / "o"))
    assert code == 1 and "unequal microbatches" in err and "umsearch run" in err
    # torchtitan takes the plan itself through PlanSchedule (tests/runtime/test_torchtitan_recipe.py).
    code, out, err = _run(capsys, "export", str(files / "u.json"), "--format", "torchtitan", "--out", str(files / "o"))
    assert code == 0 and "no torchtitan.toml" in out and "unequal microbatches" in out


def test_search_then_export_takes_the_best_equal_baseline(files: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(capsys, "search", "--profile", str(files / "prof.json"), "--ranks", "2", "--batch", "8",
                        "--generations", "2", "--out", str(files / "res"), "--quiet")  # fmt: skip
    assert code == 0, err
    code, out, err = _run(capsys, "export", str(files / "res" / "plan.json"), "--format", "torchtitan",
                          "--out", str(files / "tt"), "--json")  # fmt: skip
    assert code == 0, err
    assert (files / "tt" / "torchtitan.toml").exists()
    # Every baseline is a plan file of its own: compare them with the plan, side by side.
    peers = sorted((files / "res" / "baselines").glob("*.json"))
    assert {p.stem for p in peers} >= {"GPipe", "1F1B", "ZBVZeroBubble"}
    code, out, err = _run(capsys, "compare", str(files / "res" / "plan.json"), *map(str, peers), "--json",
                          "--gantt", str(files / "cmp.png"))  # fmt: skip
    assert code == 0, err
    rows = json.loads(out)["plans"]
    assert len(rows) == 1 + len(peers) and rows[0]["speedup_over_first"] == 1.0
    assert all(r["speedup_over_first"] <= 1.0 + 1e-9 for r in rows)  # the plan is never slower than a baseline
    assert (files / "cmp.png").read_bytes()[:4] == b"\x89PNG"


def _in_a_terminal(argv: list[str], width: int, height: int = 50) -> str:
    """Run ``argv`` in a pseudo-terminal of ``width`` x ``height`` (as a user's terminal); its output,
    escape sequences removed, lines split."""
    import fcntl
    import os
    import pty
    import select
    import struct
    import subprocess
    import termios
    import time

    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", height, width, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")} | {"TERM": "xterm-256color"}
    proc = subprocess.Popen(argv, stdin=follower, stdout=follower, stderr=follower, env=env, close_fds=True)
    os.close(follower)
    chunks, deadline = [], time.monotonic() + 600
    while time.monotonic() < deadline:
        ready, _, _ = select.select([leader], [], [], 1.0)
        if ready:
            try:
                data = os.read(leader, 65536)
            except OSError:  # the follower side closed: the process is done
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    proc.wait(timeout=60)
    os.close(leader)
    assert proc.returncode == 0
    text = b"".join(chunks).decode("utf-8", "replace")
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\x1b[()][A-Za-z0-9]", "", text)
    return text.replace("\r\n", "\n")


@pytest.mark.parametrize("width", [80, 160])
def test_the_demo_tables_fit_the_terminal(width: int, tmp_path: Path) -> None:
    """`umsearch search` on the bundled default in a real (pseudo) terminal of 80 and 160 columns: no
    line of the tables is wider, and no stage row folds onto a second line."""
    import sys

    text = _in_a_terminal([sys.executable, "-m", "umsearch", "search", "--time-budget", "5", "--out",
                           str(tmp_path / "res")], width)  # fmt: skip
    lines = text.split("\n")
    start = next(i for i, line in enumerate(lines) if line.lstrip("\r").startswith("stages"))
    lines = [line.split("\r")[-1] for line in lines[start:]]  # progress redraws end in a carriage return
    assert max(len(line.rstrip()) for line in lines) <= width, max(lines, key=len)
    end = next(i for i, line in enumerate(lines) if line.startswith("└"))
    rows = [line for line in lines[:end] if line.startswith("│")]
    # One line per stage (stage and rank numbers in the first cells), nothing folded onto a second line.
    assert rows and all(re.match(r"^│\s+\d+ │\s+\d+ │", line) for line in rows), rows


def test_export_csv_to_a_file_and_unequal_plans_refused(files: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(capsys, "export", str(files / "plan.json"), "--format", "pipelining-csv",
                        "--out", str(files / "out" / "s.csv"))  # fmt: skip
    assert code == 0, err
    assert (files / "out" / "s.csv").read_text().count("\n") == 4  # one row per rank
    (files / "u.json").write_text(json.dumps({**PLAN, "stages": _stages({}, {"forward": [1, 3], "backward": [1, 3]}),
                                              "actions": [["0F0", "0F1", "0B0", "0B1"], ["1F0", "1F1", "1B0", "1B1"]]}))
    code, _, err = _run(capsys, "export", str(files / "u.json"), "--format", "pipelining-csv",
                        "--out", str(files / "none"))  # fmt: skip
    assert code == 1 and "only umsearch's runtime can run it" in err and err.count("\n") == 1
    assert not (files / "none").exists()  # nothing written, not even the folder
