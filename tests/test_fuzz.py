"""Hostile input through every command: one red line, exit 1, no traceback, no hang, nothing written.

A table of the cases found by hand (issue "Reliability and security") and the
kinds added since, then hypothesis mutations of a valid plan and profile.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.cli.helpers import run_cli
from tests.strategies import uniform_profile
from umsearch.core.plan import placed_plan, save_plan
from umsearch.core.profile import save_profile
from umsearch.core.schedules import one_f_one_b

ROOT = Path(__file__).resolve().parents[1]


_run = run_cli


def _files(tmp: Path) -> Path:
    save_profile(uniform_profile(), tmp / "prof.json")
    plan = placed_plan([0, 1, 2, 3, 4], [0, 1, 2, 3], 8, [[1] * 8] * 4, one_f_one_b(4, 8))
    save_plan(plan, tmp / "plan.json", profile="prof.json")
    return tmp


def _json(tmp: Path, name: str) -> dict:  # type: ignore[type-arg]
    return json.loads((tmp / name).read_text())


def _put(tmp: Path, name: str, doc: object) -> str:
    (tmp / name).write_text(json.dumps(doc))
    return str(tmp / name)


def _profile_with(tmp: Path, change: Callable[[dict], None]) -> str:  # type: ignore[type-arg]
    doc = _json(tmp, "prof.json")
    change(doc)
    return _put(tmp, "bad_prof.json", doc)


def _plan_with(tmp: Path, change: Callable[[dict], None]) -> str:  # type: ignore[type-arg]
    doc = _json(tmp, "plan.json")
    doc["profile"] = str(tmp / "prof.json")
    change(doc)
    return _put(tmp, "bad_plan.json", doc)


def _raw(tmp: Path, name: str, data: bytes) -> str:
    (tmp / name).write_bytes(data)
    return str(tmp / name)


# (id, builder of the argv given the folder, a regex the error line must match)
CASES: list[tuple[str, Callable[[Path], list[str]], str]] = [
    ("profile in Latin-1", lambda t: ["simulate", str(t / "plan.json"), "--profile",
                                      _raw(t, "l1.json", '{"model": "caf\xe9"}'.encode("latin-1"))], "UTF-8"),
    ("profile in UTF-16", lambda t: ["simulate", str(t / "plan.json"), "--profile",
                                     _raw(t, "u16.json", '{"a": 1}'.encode("utf-16"))], "UTF-8"),
    ("plan nested thousands deep", lambda t: ["simulate", _raw(t, "deep.json", b"[" * 5000 + b"]" * 5000)],
     "deep|nest"),
    ("integer too large for a float", lambda t: ["simulate", str(t / "plan.json"), "--profile", _profile_with(
        t, lambda d: d["layers"][0].update(fwd_ms=[10**400, 1]))], "fwd_ms"),
    ("floats that overflow when summed", lambda t: ["simulate", str(t / "plan.json"), "--profile", _profile_with(
        t, lambda d: [lay.update(fwd_ms=[1e308, 1e308]) for lay in d["layers"]])], "fwd_ms|large|limit"),
    ("state_factor a string", lambda t: ["simulate", _plan_with(t, lambda d: d.update(state_factor="x"))],
     "state_factor"),
    ("state_factor a list", lambda t: ["simulate", _plan_with(t, lambda d: d.update(state_factor=[1]))],
     "state_factor"),
    ("state_factor negative", lambda t: ["simulate", _plan_with(t, lambda d: d.update(state_factor=-1))],
     "state_factor"),
    ("state_factor flag NaN", lambda t: ["simulate", str(t / "plan.json"), "--state-factor", "nan"],
     "state-factor|state_factor"),
    ("misspelled stage key", lambda t: ["simulate", _plan_with(t, lambda d: d["stages"][0].update(recompte=True))],
     "recompte"),
    ("misspelled layer key", lambda t: ["simulate", str(t / "plan.json"), "--profile", _profile_with(
        t, lambda d: d["layers"][0].update(stash_byte=1))], "stash_byte"),
    ("negative link latency", lambda t: ["simulate", str(t / "plan.json"), "--profile", _profile_with(
        t, lambda d: d["link"].update(latency_ms=-1))], "latency_ms"),
    ("markup in a missing path", lambda t: ["simulate", str(t / "runs" / "[" / "b].json")], r"\[/b\]\.json"),
    ("markup tag in a path", lambda t: ["simulate", str(t / "[bold]x.json")], r"\[bold\]x\.json"),
    ("a folder as the plan", lambda t: ["simulate", str(t)], "regular file|directory|folder"),
    ("batch 1e30", lambda t: ["search", "--profile", str(t / "prof.json"), "--ranks", "2", "--batch", "1" + "0" * 30],
     "global_batch|batch"),
    ("time budget NaN", lambda t: ["search", "--profile", str(t / "prof.json"), "--ranks", "2", "--batch", "8",
                                   "--time-budget", "nan", "--out", str(t / "o")], "time_budget"),
    ("time budget inf", lambda t: ["search", "--profile", str(t / "prof.json"), "--ranks", "2", "--batch", "8",
                                   "--time-budget", "inf", "--out", str(t / "o")], "time_budget"),
    ("memory limit inf", lambda t: ["search", "--profile", str(t / "prof.json"), "--ranks", "2", "--batch", "8",
                                    "--memory-limit", "inf", "--out", str(t / "o")], "memory_limit|memory-limit"),
    ("ranks beyond the layers", lambda t: ["search", "--profile", str(t / "prof.json"), "--ranks", "9", "--batch", "8",
                                           "--out", str(t / "o")], "ranks = 9"),
    ("space name escaping results/", lambda t: ["search", _raw(t, "s.toml", b'name = "../../x"\nprofile = "prof.json"\n'
                                                               b'ranks = 2\nglobal_batch = 8\n')], "name"),
    ("space name empty", lambda t: ["search", _raw(t, "s.toml", b'name = ""\nprofile = "prof.json"\nranks = 2\n'
                                                   b"global_batch = 8\n")], "name"),
    ("space key misspelled", lambda t: ["search", _raw(t, "s.toml", b'profile = "prof.json"\nranks = 2\n'
                                                       b"global_batch = 8\nrecompte = true\n")], "recompte"),
    ("gantt into /proc", lambda t: ["show", str(t / "plan.json"), "--gantt", "/proc/umsearch/g.png"], "gantt"),
    ("gantt under a file", lambda t: ["show", str(t / "plan.json"), "--gantt", str(t / "plan.json" / "g.png")],
     "gantt"),
    ("search out under a file", lambda t: ["search", "--profile", str(t / "prof.json"), "--ranks", "2", "--batch", "8",
                                           "--generations", "1", "--out", str(t / "plan.json" / "o")], "out|write"),
    ("export out under a file", lambda t: ["export", str(t / "plan.json"), "--format", "pipelining-csv", "--out",
                                           str(t / "plan.json" / "o")], "out"),
    ("calibrate a missing profile", lambda t: ["calibrate", str(t / "nope.json")], "nope.json"),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_red_line(case: tuple[str, Callable[[Path], list[str]], str], tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    import re

    _files(tmp_path)
    argv = case[1](tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    code, out, err = _run(capsys, *argv)
    assert "Traceback" not in out + err
    if code == 2:  # click's own usage errors keep click's exit code and format
        assert "Usage:" in err and "Error: " in err, err
    else:
        assert code == 1, (out, err)
        assert err.count("\n") == 1 and err.startswith("error: "), err
    assert re.search(case[2], err), err
    after = sorted(p.name for p in tmp_path.iterdir())
    assert after == before, "a failed command left files behind"


def test_all_zero_times_search_cleanly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    save_profile(uniform_profile(fwd=0.0, bwd=0.0, split=False), tmp_path / "zero.json")
    code, out, err = _run(capsys, "search", "--profile", str(tmp_path / "zero.json"), "--ranks", "2", "--batch", "8",
                          "--generations", "1", "--out", str(tmp_path / "o"), "--json")  # fmt: skip
    assert "Traceback" not in out + err
    assert code == 0 or (code == 1 and err.count("\n") == 1), err


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_is_refused_not_read(tmp_path: Path) -> None:
    """Reading a FIFO would block forever; the input layer refuses anything but a regular file."""
    _files(tmp_path)
    fifo = tmp_path / "plan.fifo"
    os.mkfifo(fifo)
    for argv in (["simulate", str(fifo)], ["simulate", str(tmp_path / "plan.json"), "--profile", str(fifo)],
                 ["search", str(fifo)]):  # fmt: skip
        done = subprocess.run([sys.executable, "-m", "umsearch", *argv], capture_output=True, text=True, timeout=120,
                              cwd=ROOT, check=False)  # fmt: skip
        assert done.returncode == 1 and "Traceback" not in done.stderr and "regular file" in done.stderr, done.stderr


@pytest.mark.slow
def test_a_plan_of_100000_microbatches_simulates_in_bounded_time(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    save_profile(uniform_profile(layers=2), tmp_path / "prof.json")
    n = 100_000
    plan = placed_plan([0, 1, 2], [0, 1], n, [[1] * n] * 2, one_f_one_b(2, n))
    save_plan(plan, tmp_path / "big.json", profile="prof.json")
    code, out, err = _run(capsys, "simulate", str(tmp_path / "big.json"), "--json")
    assert code == 0, err
    assert json.loads(out)["iteration_ms"] == pytest.approx((n + 1) * 3.0)


VALUES = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.floats(allow_nan=False),
                   st.text(max_size=5), st.lists(st.integers(-2, 9), max_size=3))  # fmt: skip


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(where=st.sampled_from(["top", "stage", "action"]), key=st.sampled_from(
    ["global_batch", "ranks", "stages", "actions", "layers", "rank", "forward", "backward", "recompute", "x"]),
    value=VALUES)  # fmt: skip
def test_mutated_plans_fail_cleanly(tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str],
                                    where: str, key: str, value: object) -> None:  # fmt: skip
    tmp = _files(tmp_path_factory.mktemp("fz"))

    def change(d: dict) -> None:  # type: ignore[type-arg]
        if where == "top":
            d[key] = value
        elif where == "stage":
            d["stages"][1][key] = value
        else:
            d["actions"][1] = value if isinstance(value, list) else [value]

    code, out, err = _run(capsys, "simulate", _plan_with(tmp, change), "--json")
    assert "Traceback" not in out + err
    assert code == 0 or (code == 1 and err.count("\n") == 1 and err.startswith("error: ")), err
    if code == 0:
        json.loads(out)  # strict JSON, no NaN or Infinity
