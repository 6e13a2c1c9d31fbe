"""Hostile input through every command: one red line, exit 1, no traceback, no hang, nothing written.

A table of the cases found by hand (issue "Reliability and security") and the
kinds added since, then hypothesis mutations of a valid plan and profile.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.cli.helpers import run_cli
from tests.strategies import uniform_profile
from umsearch.core.plan import placed_plan
from umsearch.core.plan_io import save_plan
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


def _run_plan(tmp: Path, model: object = None) -> Path:
    """The fuzz plan, naming a zoo model (``umsearch run`` needs one): a 4-layer MLP unless ``model``."""
    doc = _json(tmp, "plan.json")
    doc["model"] = model or {"source": "mlp", "args": {"layers": 3, "width": 8}}
    return Path(_put(tmp, "run_plan.json", doc))


UNEQUAL = {"schema": "umsearch.plan/2", "global_batch": 4, "ranks": 2, "profile": "../prof.json",
           "stages": [{"layers": [0, 2], "rank": 0, "forward": [2, 2], "backward": [2, 2]},
                      {"layers": [2, 4], "rank": 1, "forward": [4], "backward": [4]}],
           "actions": [["0F0", "0F1", "0B0", "0B1"], ["1F0", "1I0", "1W0"]]}  # fmt: skip
"""A 2-rank plan torchtitan cannot run (unequal microbatches): its export falls back to a baseline."""


def _baseline(ms: float = 5.0, batch: int = 4, **change: object) -> dict:  # type: ignore[type-arg]
    """An equal 2-rank baseline of :data:`UNEQUAL` as baselines.json holds it, with ``change`` applied."""
    half = batch // 2
    doc = {"schema": "umsearch.plan/2", "global_batch": batch, "ranks": 2, "predicted": {"iteration_ms": ms},
           "stages": [{"layers": [0, 2], "rank": 0, "forward": [half, half], "backward": [half, half]},
                      {"layers": [2, 4], "rank": 1, "forward": [half, half], "backward": [half, half]}],
           "actions": [["0F0", "0F1", "0B0", "0B1"], ["1F0", "1F1", "1B0", "1B1"]]}  # fmt: skip
    return {**doc, **change}


THREE_RANKS = _baseline(ranks=3, stages=[{"layers": [0, 1], "rank": 0, "forward": [4], "backward": [4]},
                                         {"layers": [1, 2], "rank": 1, "forward": [4], "backward": [4]},
                                         {"layers": [2, 4], "rank": 2, "forward": [4], "backward": [4]}],
                        actions=[["0F0", "0B0"], ["1F0", "1B0"], ["2F0", "2B0"]])  # fmt: skip
DEADLOCK = _baseline(actions=[["0F0", "0B0", "0F1", "0B1"], ["1F0", "1F1", "1B0", "1B1"]])


def _export_with(tmp: Path, plans: object) -> list[str]:
    """torchtitan export of :data:`UNEQUAL` with ``plans`` as the baselines beside it."""
    (tmp / "s").mkdir()
    _put(tmp / "s", "plan.json", UNEQUAL)
    _put(tmp / "s", "baselines.json", {"schema": "umsearch.baselines/2", "baseline_plans": plans})
    return ["export", str(tmp / "s" / "plan.json"), "--format", "torchtitan", "--out", str(tmp / "tt")]


def _toml(tmp: Path, profile: str, extra: str = "") -> str:
    text = f"profile = {json.dumps(profile)}\nranks = 2\nglobal_batch = 8\n{extra}"
    return _raw(tmp, "s.toml", text.encode("utf-8", "surrogatepass"))


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
    # Issue 24, finding 3: tracebacks.
    ("NUL byte in the plan's profile path", lambda t: ["simulate", _plan_with(t, lambda d: d.update(profile="a\0b"))],
     "NUL byte"),
    ("NUL byte in the TOML's profile path", lambda t: ["search", _toml(t, "a\0b.json")], "NUL byte"),
    ("100,000-character profile path in a plan", lambda t: ["show", _plan_with(t, lambda d: d.update(
        profile="x" * 100_000))], r"too long \(100000 bytes"),
    ("100,000-character profile path in a TOML", lambda t: ["search", _toml(t, "x" * 100_000)],
     r"profile path .*\.\.\. \(1000\d\d characters\) is too long"),
    ("TOML array nested 100,000 deep", lambda t: ["search", _toml(t, "prof.json", "x = " + "[" * 100_000
                                                                 + "]" * 100_000 + "\n")], "nests deeper than 64"),
    ("layer named with a lone surrogate", lambda t: ["search", "--profile", _profile_with(
        t, lambda d: d["layers"][0].update(name="\ud800")), "--ranks", "2", "--batch", "8", "--out",
        str(t / "o")], r"'\\ud800', which is not Unicode"),
    ("baseline_plans a list", lambda t: _export_with(t, [_baseline()]), "'baseline_plans' must be an object"),
    # Finding 4: nonsense accepted.
    ("baseline of -1 ms", lambda t: _export_with(t, {"GPipe": _baseline(ms=-1.0)}), "GPipe: .* no positive time"),
    ("3-rank baseline of a 2-rank plan", lambda t: _export_with(t, {"GPipe": THREE_RANKS}),
     "GPipe: 3 ranks, the plan has 2"),
    ("deadlocking baseline", lambda t: _export_with(t, {"GPipe": DEADLOCK}), "GPipe: deadlocks"),
    ("batch-8 baseline of a batch-4 plan", lambda t: _export_with(t, {"GPipe": _baseline(batch=8)}),
     "GPipe: a batch of 8, the plan's is 4"),
    ("search --out ''", lambda t: ["search", "--profile", str(t / "prof.json"), "--ranks", "2", "--batch", "8",
                                   "--out", ""], "--out is an empty path"),
    ("search --ranks 2 --stages 3 (default space)", lambda t: ["search", "--ranks", "2", "--stages", "3"],
     "ranks = 2 and its alias stages = 3 disagree"),
    ("export --out ''", lambda t: ["export", str(t / "plan.json"), "--format", "pipelining-csv", "--out", ""],
     "--out is an empty path"),
    ("run --warmup-steps 30 --steps 20", lambda t: ["run", str(_run_plan(t)), "--print-launch", "--steps", "20",
                                                    "--warmup-steps", "30"], "--warmup-steps 30 leaves none"),
    ("run --lr -1", lambda t: ["run", str(_run_plan(t)), "--print-launch", "--lr", "-1"], "--lr must be 0 or more"),
    ("actions with an Arabic-Indic digit", lambda t: ["simulate", _plan_with(
        t, lambda d: d["actions"][0].__setitem__(0, "0F\u0661"))], "0F\u0661|action"),
    ("actions with a full-width digit", lambda t: ["simulate", _plan_with(
        t, lambda d: d["actions"][0].__setitem__(0, "\uff10F0"))], "\uff10F0|action"),
    # Finding 5: a zoo model too large to build.
    ("zoo gpt of 100,000 layers", lambda t: ["run", str(_run_plan(t, {"source": "gpt", "args": {"layers": 100_000}})),
                                             "--print-launch"], "layers=100000 is over the runtime's limit of 10000"),
    # Finding 2: outputs that are not regular files.
    ("show --gantt a folder", lambda t: ["show", str(t / "plan.json"), "--gantt", str(t)],
     "--gantt.* is a (folder|directory)"),
    ("search --out a file", lambda t: ["search", "--profile", str(t / "prof.json"), "--ranks", "2", "--batch", "8",
                                       "--out", str(t / "plan.json")], "is a file"),
    ("show --gantt the plan it reads", lambda t: ["show", str(t / "plan.json"), "--gantt", str(t / "plan.json")],
     "is an input of this command"),
    ("run --out the plan it runs", lambda t: ["run", str(_run_plan(t)), "--out", str(t / "run_plan.json")],
     "is an input of this command"),
    ("run --out an over-long name", lambda t: ["run", str(_run_plan(t)), "--out", str(t / ("x" * 300))],
     "300 bytes long, over the limit of 255"),
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


def _char_device(path: Path) -> Path:
    """A character device like /dev/null at ``path`` (skips the test where mknod is not permitted)."""
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except (PermissionError, AttributeError, OSError) as exc:
        pytest.skip(f"cannot make a device node here: {exc}")
    return path


# Issue 24, finding 2: an output path that is a device node is written through, never replaced.
DEVICE_OUTPUTS: list[tuple[str, Callable[[Path, Path], list[str]]]] = [
    ("show --gantt", lambda t, dev: ["show", str(t / "plan.json"), "--gantt", str(dev)]),
    ("show --trace", lambda t, dev: ["show", str(t / "plan.json"), "--gantt", str(t / "g.png"), "--trace", str(dev)]),
    ("compare --gantt", lambda t, dev: ["compare", str(t / "plan.json"), "--gantt", str(dev)]),
    ("export pipelining-csv --out X.csv", lambda t, dev: ["export", str(t / "plan.json"), "--format",
                                                          "pipelining-csv", "--out", str(dev)]),
]  # fmt: skip


@pytest.mark.parametrize("case", DEVICE_OUTPUTS, ids=[c[0] for c in DEVICE_OUTPUTS])
def test_a_character_device_output_is_written_through(case: tuple[str, Callable[[Path, Path], list[str]]],
                                                      tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    _files(tmp_path)
    dev = _char_device(tmp_path / "null.csv")
    code, _, err = _run(capsys, *case[1](tmp_path, dev))
    assert code == 0, err
    assert stat.S_ISCHR(dev.lstat().st_mode) and dev.lstat().st_rdev == os.makedev(1, 3)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp file left beside it


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
@pytest.mark.parametrize("argv", [
    ["show", "{plan}", "--gantt", "{fifo}"], ["show", "{plan}", "--trace", "{fifo}"],
    ["compare", "{plan}", "--gantt", "{fifo}"], ["export", "{plan}", "--format", "pipelining-csv", "--out", "{fifo}"],
    ["calibrate", "{prof}", "--out", "{fifo}"], ["run", "{run_plan}", "--out", "{fifo}"],
    ["run", "{run_plan}", "--trace", "{fifo}"], ["validate", "{run_plan}", "--out", "{fifo}"],
])  # fmt: skip
def test_a_fifo_output_is_refused_before_any_work(argv: list[str], tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    _files(tmp_path)
    fifo = tmp_path / "out.csv"
    os.mkfifo(fifo)
    names = {"plan": str(tmp_path / "plan.json"), "prof": str(tmp_path / "prof.json"), "fifo": str(fifo),
             "run_plan": str(_run_plan(tmp_path))}  # fmt: skip
    code, _, err = _run(capsys, *[a.format(**names) for a in argv])
    assert code == 1 and err.count("\n") == 1, err
    assert f"{str(fifo)!r} is a FIFO (named pipe)" in err, err
    assert stat.S_ISFIFO(fifo.lstat().st_mode)


def _search(tmp: Path, capsys: pytest.CaptureFixture[str], out: Path, *more: str) -> tuple[int, str]:
    code, _, err = _run(capsys, "search", str(tmp / "s.toml"), "--generations", "1", "--out", str(out), "--quiet",
                        *more)  # fmt: skip
    return code, err


# Finding 1: search --out DIR keeps what the user had in DIR, inputs included.
def test_search_out_keeps_the_users_files_and_its_inputs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    save_profile(uniform_profile(), tmp_path / "prof.json")
    _raw(tmp_path, "s.toml", b'profile = "prof.json"\nranks = 2\nglobal_batch = 8\n')
    (tmp_path / "keep.txt").write_text("mine")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "notes.md").write_text("notes")
    code, err = _search(tmp_path, capsys, tmp_path)  # the folder holding the TOML and the profile
    assert code == 0, err
    assert (tmp_path / "keep.txt").read_text() == "mine" and (tmp_path / "sub" / "notes.md").read_text() == "notes"
    assert (tmp_path / "s.toml").exists() and (tmp_path / "prof.json").exists()
    assert (tmp_path / "plan.json").exists() and (tmp_path / "baselines" / "GPipe.json").exists()
    # A second search with fewer peers removes the stale baselines it wrote, and nothing else.
    code, err = _search(tmp_path, capsys, tmp_path, "--peers", "1F1B")
    assert code == 0, err
    assert sorted(p.name for p in (tmp_path / "baselines").iterdir()) == ["1F1B.json", "local_greedy.json"]
    assert (tmp_path / "keep.txt").read_text() == "mine" and (tmp_path / "sub" / "notes.md").read_text() == "notes"
    assert (tmp_path / "s.toml").exists() and (tmp_path / "prof.json").exists()


def test_search_out_refuses_a_file_of_the_users_before_searching(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    save_profile(uniform_profile(), tmp_path / "prof.json")
    _raw(tmp_path, "s.toml", b'profile = "prof.json"\nranks = 2\nglobal_batch = 8\n')
    out = tmp_path / "o"
    out.mkdir()
    (out / "report.md").write_text("my report")
    code, err = _search(tmp_path, capsys, out)
    assert code == 1 and err.count("\n") == 1, err
    assert "report.md' was not written by umsearch (the folder has no .umsearch-outputs.json); move it away or " \
           "choose another folder" in err
    assert [p.name for p in out.iterdir()] == ["report.md"] and (out / "report.md").read_text() == "my report"


def test_a_killed_searchs_staging_folder_is_removed_by_the_next(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """Only a staging folder whose marker proves it a dead run's goes; nothing beside --out is looked at."""
    from umsearch.storage.output_folder import STAGING_MARKER, make_staging

    save_profile(uniform_profile(), tmp_path / "prof.json")
    _raw(tmp_path, "s.toml", b'profile = "prof.json"\nranks = 2\nglobal_batch = 8\n')
    out = tmp_path / "res"
    out.mkdir()
    killed = make_staging(out)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    marker = json.loads((killed / STAGING_MARKER).read_text())
    (killed / STAGING_MARKER).write_text(json.dumps({**marker, "pid": dead.pid}))
    (killed / "plan.json").write_text("{}")
    (tmp_path / ".res.abcd_123").mkdir()  # named like an old version's staging, but the user's
    (tmp_path / ".res.abcd_123" / "pareto.json").write_text("{}")
    code, err = _search(tmp_path, capsys, out)
    assert code == 0, err
    assert sorted(p.name for p in tmp_path.iterdir()) == [".res.abcd_123", "prof.json", "res", "s.toml"]
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == [".umsearch-outputs.json"]


@pytest.mark.slow
def test_run_out_and_trace_write_through_character_devices(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Finding 2 for the commands that write after a real run: the device nodes stay devices."""
    _files(tmp_path)
    out, trace = _char_device(tmp_path / "out.json"), _char_device(tmp_path / "trace.json")
    code, _, err = _run(capsys, "run", str(_run_plan(tmp_path)), "--steps", "1", "--out", str(out), "--trace",
                        str(trace))  # fmt: skip
    assert code == 0, err
    assert stat.S_ISCHR(out.lstat().st_mode) and stat.S_ISCHR(trace.lstat().st_mode)
