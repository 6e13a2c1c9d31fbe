"""``search --out`` and ``tune --out`` into folders holding the user's files (issue 33), as a careful user tries
them: nothing beside the folder is touched, a forged or missing manifest proves nothing, every clash and bad
path is refused before any work, FIFOs and devices are never read, and SIGTERM keeps what tune measured."""

from __future__ import annotations

import hashlib
import json
import os
import signal
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.cli.helpers import run_cli
from tests.orchestrate.test_tune import PROFILE, TIMES, FakeMachine, _candidates
from tests.strategies import uniform_profile
from umsearch.core.profile import save_profile
from umsearch.storage.manifest import MANIFEST, SCHEMA
from umsearch.storage.reading import identity

SPACE = b'profile = "prof.json"\nranks = 2\nglobal_batch = 8\n'


def _setup(tmp: Path) -> None:
    save_profile(uniform_profile(), tmp / "prof.json")
    (tmp / "s.toml").write_bytes(SPACE)


def _search(tmp: Path, capsys: pytest.CaptureFixture[str], out: Path) -> tuple[int, str]:
    code, _, err = run_cli(capsys, "search", str(tmp / "s.toml"), "--generations", "1", "--out", str(out), "--quiet")
    return code, err


@pytest.fixture
def no_search(monkeypatch: pytest.MonkeyPatch) -> None:
    """The search must not start: a refusal comes before any work."""

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the search ran before the refusal")

    monkeypatch.setattr("umsearch.cli.search.run_search", refuse)


def _tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and not p.is_symlink()}  # fmt: skip


def test_backups_beside_out_survive_a_search(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Finding 1: .out.backup01, .out.20261206 and .out.old.snapshot/previous were removed or moved in."""
    _setup(tmp_path)
    beside = {".out.backup01/report.md": b"backup", ".out.20261206/plan.json": b"dated",
              ".out.old.snapshot/previous/plan.json": b"previous"}  # fmt: skip
    for name, data in beside.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(data)
    for _ in range(2):
        code, err = _search(tmp_path, capsys, tmp_path / "out")
        assert code == 0, err
    assert {n: b for n, b in _tree(tmp_path).items() if n in beside} == beside


def test_a_forged_manifest_costs_the_user_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                  no_search: None) -> None:  # fmt: skip
    """Finding 2: a manifest naming keep.txt, sub/notes.md and report.md (an older one: names only)."""
    _setup(tmp_path)
    out = tmp_path / "out"
    (out / "sub").mkdir(parents=True)
    user = {"keep.txt": b"keep", "sub/notes.md": b"notes", "report.md": b"my report"}
    for name, data in user.items():
        (out / name).write_bytes(data)
    (out / MANIFEST).write_text(json.dumps({"schema": "umsearch.outputs/1", "files": sorted(user)}))
    code, err = _search(tmp_path, capsys, out)
    assert code == 1 and err.count("\n") == 1 and "report.md' was not written by umsearch" in err, err
    assert {n: b for n, b in _tree(out).items() if n in user} == user


def test_a_copied_plan_without_a_manifest_stops_before_searching(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                 no_search: None) -> None:  # fmt: skip
    """Finding 3: a copied plan.json, the user's report.md and baselines/MyHandTuned.json."""
    _setup(tmp_path)
    out = tmp_path / "out"
    (out / "baselines").mkdir(parents=True)
    (out / "plan.json").write_text('{"schema": "umsearch.plan/2"}')
    (out / "report.md").write_text("mine")
    (out / "baselines" / "MyHandTuned.json").write_text('{"schema": "umsearch.plan/2"}')
    before = _tree(out)
    code, err = _search(tmp_path, capsys, out)
    assert code == 1 and "plan.json' was not written by umsearch (the folder has no" in err, err
    assert _tree(out) == before


@pytest.mark.parametrize("setup, message", [
    ("baseline", "1F1B.json' was not written by umsearch"),
    ("manifest folder", "is a folder, not a file"),
    ("manifest fifo", "is a FIFO"),
    ("plan fifo", "plan.json' was not written by umsearch"),
    ("plan /dev/zero", "plan.json' was not written by umsearch"),
    ("manifest /dev/zero", "is a link, not a file"),
])  # fmt: skip
def test_every_clash_and_bad_entry_is_refused_before_searching(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                               no_search: None, setup: str, message: str) -> None:  # fmt: skip
    _setup(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    if setup == "baseline":
        (out / "baselines").mkdir()
        (out / "baselines" / "1F1B.json").write_text("my hand-tuned 1F1B")
    elif setup == "manifest folder":
        (out / MANIFEST).mkdir()
    elif setup == "manifest fifo":
        os.mkfifo(out / MANIFEST)
    elif setup == "plan fifo":
        os.mkfifo(out / "plan.json")
    elif setup == "plan /dev/zero":
        (out / "plan.json").symlink_to("/dev/zero")
    else:
        (out / MANIFEST).symlink_to("/dev/zero")
    code, err = _search(tmp_path, capsys, out)
    assert code == 1 and err.count("\n") == 1 and message in err, err


def test_an_out_that_cannot_be_made_is_refused_before_searching(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                no_search: None) -> None:  # fmt: skip
    _setup(tmp_path)
    code, err = _search(tmp_path, capsys, Path("/proc/umsearch-out"))
    assert code == 1 and "cannot be written" in err, err


@pytest.mark.parametrize("what", ["fifo", "/dev/zero"])
def test_fifo_and_device_inputs_are_refused_at_once(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                    what: str) -> None:  # fmt: skip
    _setup(tmp_path)
    bad = tmp_path / "bad.json"
    if what == "fifo":
        os.mkfifo(bad)
    else:
        bad.symlink_to("/dev/zero")
    for args in (["search", "--profile", str(bad), "--ranks", "2", "--batch", "8", "--out", str(tmp_path / "o")],
                 ["tune", str(bad), "--model", "mlp", "--out", str(tmp_path / "t")],
                 ["search", str(bad), "--out", str(tmp_path / "o")]):  # fmt: skip
        code, _, err = run_cli(capsys, *args)
        assert code == 1 and err.count("\n") == 1 and "not a regular file" in err, (args, err)
    assert not (tmp_path / "o").exists() and not (tmp_path / "t").exists()


def test_tune_keeps_what_it_measured_on_sigterm_and_exits_143(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """SIGTERM in the second round's measuring: the first round is written, recorded as terminated."""
    save_profile(PROFILE, tmp_path / "p.json")

    class TermAt(FakeMachine):
        def __call__(self, entries: Sequence[Any], rounds: int) -> Any:
            if self.calls == 1:
                os.kill(os.getpid(), signal.SIGTERM)
            return super().__call__(entries, rounds)

    def machine(profile: Any, space: Any, factory: Any, cfg: Any, run_cfg: Any, *, on_progress: Any = None) -> Any:
        from umsearch.orchestrate.tune import tune

        return tune(profile, _candidates, TermAt(TIMES), cfg, on_progress=on_progress)

    monkeypatch.setattr("umsearch.orchestrate.tune.tune_on_machine", machine)
    code, _, err = run_cli(capsys, "tune", str(tmp_path / "p.json"), "--model", "mlp", "--rounds", "4",
                           "--measure-rounds", "3", "--out", str(tmp_path / "t"))  # fmt: skip
    assert code == 143, err
    assert "terminated by SIGTERM: kept and wrote the 1 round(s)" in err
    doc = json.loads((tmp_path / "t" / "tune.json").read_text())
    assert doc["interrupted"] and doc["stopped"].startswith("terminated by SIGTERM") and len(doc["rounds"]) == 1
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


# ---------------------------------------------------------------------------------------------- the property
_NAMES = ["plan.json", "report.md", "pareto.json", "baselines.json", "trace.json", "baselines/1F1B.json",
          "baselines/GPipe.json", "baselines/mine.json", "keep.txt", "sub/notes.md", "tune.json", "profile.json",
          "schedule.csv", "torchtitan.toml", ".umsearch-staging.x/notes.md"]  # fmt: skip


def _entry(data: bytes) -> dict[str, Any]:
    return {"command": "search", "contents": [{"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}]}


@st.composite
def _folders(draw: st.DrawFn) -> tuple[dict[str, bytes], str, dict[str, bytes]]:
    """The user's files, how the manifest lies (none, older, another folder's, wrong contents, bad names), and
    the contents it claims."""
    names = draw(st.lists(st.sampled_from(_NAMES), unique=True, max_size=8))
    user = {n: draw(st.binary(max_size=20)) for n in names}
    lie = draw(st.sampled_from(["none", "older", "other folder", "wrong contents", "outside"]))
    claimed = {n: draw(st.binary(max_size=20)) for n in draw(st.lists(st.sampled_from(_NAMES), unique=True))}
    return user, lie, claimed


def _plant(out: Path, user: dict[str, bytes], lie: str, claimed: dict[str, bytes], other: Path) -> None:
    for name, data in user.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_bytes(data)
    if lie == "none":
        return
    if lie == "older":
        doc: dict[str, Any] = {"schema": "umsearch.outputs/1", "files": sorted({*claimed, *user})}
    else:
        files = {n: _entry(user[n] if lie == "other folder" and n in user else data + b"~") for n, data in
                 claimed.items()}  # fmt: skip
        if lie == "outside":
            files = {f"../{n}": e for n, e in files.items()} | {str(out / n): e for n, e in files.items()}
        doc = {"schema": SCHEMA, "folder": identity(other if lie == "other folder" else out), "files": files}
    (out / MANIFEST).write_text(json.dumps(doc))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=_folders(), command=st.sampled_from(["search", "tune"]))
def test_whatever_the_folder_holds_the_users_files_survive_or_are_named(tmp_path_factory: pytest.TempPathFactory,
                                                                        case: Any, command: str) -> None:  # fmt: skip
    """After a search's or a tune's output folder writes (as the commands set it up), every file the user had
    is byte-identical, or the run stopped before writing and named it."""
    from umsearch.cli.report import output_folder
    from umsearch.errors import OutputError
    from umsearch.orchestrate.tune_output import EXPORT_FILES, FILES
    from umsearch.search.space import build_space
    from umsearch.storage.output_folder import OutputFolder

    tmp = tmp_path_factory.mktemp("prop")
    save_profile(uniform_profile(), tmp / "prof.json")
    out, other = tmp / "out", tmp / "other"
    out.mkdir()
    other.mkdir()
    user, lie, claimed = case
    _plant(out, user, lie, claimed, other)
    before = _tree(out)
    before.pop(MANIFEST, None)
    if command == "search":
        space = build_space({"profile": str(tmp / "prof.json"), "ranks": 2, "global_batch": 8})
        writes = ["plan.json", "pareto.json", "baselines.json", "report.md", "trace.json", "baselines/1F1B.json"]
        make = lambda: output_folder(out, space, None)  # noqa: E731
    else:
        writes = [*FILES, EXPORT_FILES[0]]
        make = lambda: OutputFolder(out, "--out", command="tune", expected=(*FILES, *EXPORT_FILES))  # noqa: E731

    def fill(stage: Path) -> None:
        for name in writes:
            (stage / name).parent.mkdir(parents=True, exist_ok=True)
            (stage / name).write_bytes(b"umsearch wrote " + name.encode())

    try:
        make().write(fill)
    except OutputError as exc:
        named = [n for n in before if f"{n}'" in str(exc)]
        assert named, str(exc)
        assert {n: b for n, b in _tree(out).items() if n != MANIFEST} == before
        return
    after = _tree(out)
    assert all(after.get(n) == data for n, data in before.items()), (lie, sorted(before), sorted(after))
    assert not (tmp / "out.bak").exists() and sorted(p.name for p in tmp.iterdir()) == ["other", "out", "prof.json"]


def test_search_writes_its_best_on_sigterm_and_exits_143(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """SIGTERM once the search has begun: the plans found so far are written, as for Ctrl-C."""
    from umsearch.search.driver import run_search

    _setup(tmp_path)

    def terminated(space: Any, profile: Any, on_progress: Any = None) -> Any:
        sent = []

        def progress(p: Any) -> None:
            if p.phase != "baselines" and not sent:
                sent.append(os.kill(os.getpid(), signal.SIGTERM))
            on_progress(p)

        return run_search(space, profile, progress)

    monkeypatch.setattr("umsearch.cli.search.run_search", terminated)
    code, err = _search(tmp_path, capsys, tmp_path / "out")
    assert code == 143, err
    assert (tmp_path / "out" / "plan.json").exists()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
