"""Issue 41 through the commands themselves: export keeps what it did not write, every plan passes one gate,
and a signal at any point (imports, the work, the writing) ends a command with 128 + the signal, one line
and complete outputs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.cli.helpers import run_cli
from tests.folders import tree
from tests.runtime.test_command import LAYERS, MLP, _plan, two_rank_plan
from tests.strategies import uniform_profile
from umsearch.cli.run import run_command
from umsearch.core.plan_io import save_plan
from umsearch.core.profile import save_profile
from umsearch.storage.manifest import MANIFEST, read_manifest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def unequal(tmp_path: Path) -> Path:
    """A plan with unequal microbatches (torchtitan cannot carry it) and its profile, in ``tmp_path / 'p'``."""
    folder = tmp_path / "p"
    folder.mkdir()
    save_profile(uniform_profile(layers=LAYERS), folder / "prof.json")
    save_plan(two_rank_plan(), folder / "plan.json", profile="prof.json", model=MLP)
    return folder / "plan.json"




def test_export_never_replaces_a_users_file_and_replaces_its_own(unequal: Path, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    out = tmp_path / "ex"
    out.mkdir()
    (out / "plan_schedule.py").write_text("# my own recipe")
    code, _, err = run_cli(capsys, "export", str(unequal), "--format", "torchtitan", "--out", str(out))
    assert code == 1 and "plan_schedule.py' was not written by umsearch" in err
    assert tree(out) == {"plan_schedule.py": b"# my own recipe"}
    (out / "plan_schedule.py").unlink()
    for _ in range(2):  # the second export replaces what the first wrote
        code, _, err = run_cli(capsys, "export", str(unequal), "--format", "torchtitan", "--out", str(out))
        assert code == 0, err
    assert sorted(tree(out)) == [MANIFEST, "plan_schedule.py", "umsearch_plan.json"]
    assert read_manifest(out).command("plan_schedule.py") == "export-torchtitan"


def test_export_never_writes_over_its_own_input(unequal: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    out = tmp_path / "ex"
    assert run_cli(capsys, "export", str(unequal), "--format", "torchtitan", "--out", str(out))[0] == 0
    before = tree(out)
    code, _, err = run_cli(capsys, "export", str(out / "umsearch_plan.json"), "--format", "torchtitan", "--out",
                           str(out), "--profile", str(unequal.parent / "prof.json"))  # fmt: skip
    assert code == 1 and "umsearch_plan.json' is an input of this command" in err
    assert tree(out) == before


def test_export_into_a_search_folder_keeps_every_search_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    save_profile(uniform_profile(), tmp_path / "prof.json")
    res = tmp_path / "res"
    code, _, err = run_cli(capsys, "search", "--profile", str(tmp_path / "prof.json"), "--ranks", "2", "--batch", "8",
                           "--generations", "2", "--out", str(res), "--quiet")  # fmt: skip
    assert code == 0, err
    before = tree(res)
    code, _, err = run_cli(capsys, "export", str(res / "plan.json"), "--format", "torchtitan", "--out", str(res))
    assert code == 0, err
    after = tree(res)
    assert {n: after[n] for n in before if n != MANIFEST} == {n: b for n, b in before.items() if n != MANIFEST}
    code, _, err = run_cli(capsys, "search", "--profile", str(tmp_path / "prof.json"), "--ranks", "2", "--batch", "8",
                           "--generations", "2", "--out", str(res), "--quiet")  # fmt: skip
    assert code == 0, err
    assert (res / "torchtitan.toml").read_bytes() == after["torchtitan.toml"]


def test_export_refuses_a_plan_that_deadlocks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    save_profile(uniform_profile(layers=LAYERS), tmp_path / "prof.json")
    plan = _plan(tmp_path, deadlock=True, profile="prof.json")
    code, _, err = run_cli(capsys, "export", str(plan), "--format", "torchtitan", "--out", str(tmp_path / "ex"))
    assert code == 1 and ": the plan deadlocks (rank " in err
    assert not (tmp_path / "ex").exists()


@pytest.mark.parametrize("what", ["fifo", "folder", "link to /dev/zero"])
def test_export_says_what_lies_beside_the_plan_in_place_of_baselines(unequal: Path, tmp_path: Path, what: str,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    beside = unequal.with_name("baselines.json")
    if what == "fifo":
        os.mkfifo(beside)
    elif what == "folder":
        beside.mkdir()
    else:
        beside.symlink_to("/dev/zero")
    code, out, err = run_cli(capsys, "export", str(unequal), "--format", "torchtitan", "--out", str(tmp_path / "ex"))
    said = out + err
    assert "no baselines.json lies beside it" not in said
    assert {"fifo": "FIFO", "folder": "directory", "link to /dev/zero": "character device"}[what] in said


def test_run_refuses_a_plan_whose_profile_is_missing_unless_the_model_is_named(tmp_path: Path) -> None:
    for name, make in (("missing", lambda p: None), ("loop", lambda p: p.symlink_to(p))):
        plan = _plan(tmp_path, profile=f"{name}.json")
        make(tmp_path / f"{name}.json")
        res = CliRunner().invoke(run_command, [str(plan), "--print-launch"])
        assert res.exit_code == 1, res.output
        assert f"{name}.json'" in res.stderr and "pass --profile" in res.stderr and "--model" in res.stderr
        res = CliRunner().invoke(run_command, [str(plan), "--print-launch", "--model", "mlp", "--arg", "layers=3",
                                               "--arg", "width=16"])  # fmt: skip
        assert res.exit_code == 0, res.output
        assert "warning:" in res.stderr and "nothing is predicted" in res.stderr
        assert "torchrun" in res.stdout


# ------------------------------------------------------------------------------------------------ signals
def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}


_KILL_AT_COMMIT = """
import os, signal, sys
import umsearch.storage.output_folder as of
real = of.OutputFolder._commit
def commit(self, stage):
    os.kill(os.getpid(), signal.SIG{sig})  # as if the batch system stopped the job right now
    return real(self, stage)
of.OutputFolder._commit = commit
from umsearch.cli.entry import main
main(sys.argv[1:])
"""


@pytest.mark.parametrize(("sig", "code"), [("TERM", 143), ("INT", 130)])
def test_a_signal_while_search_writes_its_outputs_ends_with_its_code_and_complete_outputs(
        tmp_path: Path, sig: str, code: int) -> None:  # fmt: skip
    save_profile(uniform_profile(), tmp_path / "prof.json")
    out = tmp_path / "res"
    args = ["search", "--profile", str(tmp_path / "prof.json"), "--ranks", "2", "--batch", "8", "--generations", "2",
            "--out", str(out), "--quiet"]  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", _KILL_AT_COMMIT.format(sig=sig), *args], env=_env(), cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr and "interrupted" in proc.stderr
    manifest = read_manifest(out)
    assert {"plan.json", "report.md", "baselines.json"} <= set(manifest.files)
    assert all(manifest.proves(out, n) for n in manifest.files)
    assert not [p for p in out.iterdir() if p.name.startswith(".umsearch-staging")]


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130), (signal.SIGHUP, 129)])
def test_a_signal_during_the_start_up_imports_ends_with_its_code_and_one_line(tmp_path: Path, sig: int,
                                                                              code: int) -> None:  # fmt: skip
    """``python -v`` reports each import as it happens: the signal lands once the CLI's own imports run."""
    import fcntl

    # A one-page pipe: the child blocks once a page ahead of this reader, so it is still importing when the
    # signal is sent (with the default 64 KiB it could finish --help and exit 0 before this test read that far).
    r, w = os.pipe()
    fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 4096)
    # The child starts as from a terminal, Ctrl-C not ignored: a child inherits an ignored SIGINT, and pytest
    # itself runs with SIGINT ignored when a non-interactive shell started it in the background (`make test &`).
    proc = subprocess.Popen([sys.executable, "-v", "-m", "umsearch", "search", "--help"], env=_env(), cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=w,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    os.close(w)
    stderr = os.fdopen(r)
    seen: list[str] = []
    deadline = time.monotonic() + 300
    for line in stderr:
        seen.append(line)
        if "umsearch.cli.entry" in line and line.startswith("import "):
            break  # the handlers are set right after this module's import
        assert time.monotonic() < deadline
    for line in stderr:  # then wait for an import the CLI itself asks for
        seen.append(line)
        if line.startswith("import 'click") or line.startswith("import 'rich"):
            proc.send_signal(sig)
            break
    with stderr:
        rest = stderr.read()
    assert proc.wait(timeout=300) == code, "".join(seen[-5:]) + rest
    assert "Traceback" not in rest and "error: interrupted" in rest


@pytest.mark.slow
def test_search_replay_tune_and_search_again_into_one_folder_lose_nothing(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """The issue's own sequence on the bundled mlp profile: replay beside a search, tune refused, search again."""
    profile = str(ROOT / "search_spaces" / "profiles" / "mlp_cpu.json")
    out = tmp_path / "rpa"
    search = ["search", "--profile", profile, "--ranks", "2", "--batch", "16", "--generations", "2", "--out", str(out),
              "--quiet"]  # fmt: skip
    assert run_cli(capsys, *search)[0] == 0
    (out / "notes.txt").write_text("mine")
    searched = tree(out)
    code, _, err = run_cli(capsys, "replay", str(out / "plan.json"), "--all-ranks", "--steps", "1", "--out", str(out))
    assert code == 0, err
    replayed = tree(out)
    assert {n: replayed[n] for n in searched if n != MANIFEST} == {n: b for n, b in searched.items() if n != MANIFEST}
    code, _, err = run_cli(capsys, "tune", profile, "--ranks", "2", "--batch", "16", "--out", str(out))
    assert code == 1 and "is an output of umsearch search, and umsearch tune writes a file of that name" in err
    assert tree(out) == replayed
    code, _, err = run_cli(capsys, *search)
    assert code == 0, err
    final = tree(out)
    assert final["replay.json"] == replayed["replay.json"] and final["notes.txt"] == b"mine"
    assert json.loads(final["plan.json"])["schema"].startswith("umsearch.plan/")
