"""Several commands writing into one output folder (issue 41): each replaces or removes only what it wrote.

The manifest records which command wrote each file; a name another command wrote stops a run before any
work, naming both; a failed write puts every file back; two writers take turns; another host's staging
folder is left alone; a signal during the write stops the command only once the outputs are in place.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import shutil
import signal
import socket
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.folders import fill_with, tree
from umsearch.cli.export import _names as export_names
from umsearch.cli.replay import REPLAY_FILE
from umsearch.cli.report import FILES as SEARCH_FILES
from umsearch.errors import Interrupted, OutputError
from umsearch.orchestrate.tune_output import EXPORT_FILES as TUNE_EXPORT_FILES
from umsearch.orchestrate.tune_output import FILES as TUNE_FILES
from umsearch.storage.manifest import MANIFEST, read_manifest
from umsearch.storage.output_folder import (
    STAGING_MARKER,
    STAGING_SCHEMA,
    OutputFolder,
    left_staging,
)
from umsearch.storage.reading import identity


def _search(out: Path, tag: str, baselines: tuple[str, ...] = ("A", "B")) -> list[Path]:
    files = {"plan.json": tag, "report.md": tag} | {f"baselines/{b}.json": tag for b in baselines}
    return OutputFolder(out, command="search", expected=list(files)).write(fill_with(files))


def test_a_replay_beside_a_search_keeps_every_search_output_and_the_next_search_is_not_refused(tmp_path: Path) -> None:
    out = tmp_path / "o"
    _search(out, "s1")
    before = tree(out)
    OutputFolder(out, command="replay", inputs=[out / "plan.json"], expected=["replay.json"],
                 last=("replay.json",)).write(fill_with({"replay.json": "r1"}))  # fmt: skip
    assert tree(out) == before | {MANIFEST: tree(out)[MANIFEST], "replay.json": b"r1"}
    _search(out, "s2", baselines=("A",))  # B.json is the last search's and stale: removed; replay.json stays
    assert sorted(tree(out)) == [MANIFEST, "baselines/A.json", "plan.json", "replay.json", "report.md"]
    assert (out / "replay.json").read_text() == "r1" and (out / "plan.json").read_text() == "s2"
    manifest = read_manifest(out)
    assert {n: manifest.command(n) for n in manifest.files} == {
        "baselines/A.json": "search", "plan.json": "search", "report.md": "search", "replay.json": "replay"}


def test_a_name_another_command_wrote_stops_the_run_before_any_work_naming_both(tmp_path: Path) -> None:
    out = tmp_path / "o"
    _search(out, "s1")
    before = tree(out)
    with pytest.raises(OutputError, match=r"'.*report.md' is an output of umsearch search, and umsearch tune "
                                          r"writes a file of that name"):  # fmt: skip
        OutputFolder(out, command="tune", expected=["tune.json", "report.md"])
    assert tree(out) == before


def test_a_clash_that_appears_while_the_command_works_is_refused_at_writing_with_nothing_changed(
        tmp_path: Path) -> None:  # fmt: skip
    out = tmp_path / "o"
    folder = OutputFolder(out, command="tune", expected=["tune.json", "report.md"])
    _search(out, "s1")  # a search wrote report.md meanwhile
    before = tree(out)
    with pytest.raises(OutputError, match="is an output of umsearch search"):
        folder.write(fill_with({"tune.json": "t", "report.md": "t"}))
    assert tree(out) == before


def test_an_older_manifest_proves_contents_but_no_command_so_its_files_are_replaced_never_removed(
        tmp_path: Path) -> None:  # fmt: skip
    out = tmp_path / "o"
    out.mkdir()
    listed = {"plan.json": "old plan", "replay.json": "old replay"}
    for name, text in listed.items():
        (out / name).write_text(text)
    doc = {"schema": "umsearch.outputs/2", "folder": identity(out),
           "files": {n: [{"size": len(t), "sha256": hashlib.sha256(t.encode()).hexdigest()}] for n, t in listed.items()}}
    (out / MANIFEST).write_text(json.dumps(doc))
    OutputFolder(out, command="search", expected=["plan.json"]).write(fill_with({"plan.json": "new"}))
    assert (out / "plan.json").read_text() == "new" and (out / "replay.json").read_text() == "old replay"
    manifest = read_manifest(out)
    assert manifest.command("plan.json") == "search" and manifest.command("replay.json") is None
    assert manifest.proves(out, "replay.json")


def test_a_failed_write_puts_every_file_back_and_names_the_output_not_the_staging_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    out = tmp_path / "o"
    _search(out, "s1")
    (out / "mine.txt").write_text("mine")
    before = tree(out)
    real = os.replace

    def failing(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        if Path(dst) == out / "plan.json" and "staging" in str(src) and ".replaced" not in str(src):
            raise OSError(errno.ENOSPC, "No space left on device", str(src))
        real(src, dst)

    monkeypatch.setattr(os, "replace", failing)
    with pytest.raises(OutputError) as info:
        _search(out, "s2", baselines=("C",))  # every other file already moved, A and B removed as stale
    message = str(info.value)
    assert f"{str(out / 'plan.json')!r} could not be written: No space left on device" in message
    assert "staging" not in message and "as the previous run left it" in message
    monkeypatch.setattr(os, "replace", real)
    assert tree(out) == before
    assert not [p for p in out.iterdir() if p.name.startswith(".umsearch-staging")]
    _search(out, "s3")  # and the folder is still umsearch's to write
    assert (out / "plan.json").read_text() == "s3"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder")
def test_a_read_only_subfolder_is_refused_before_anything_moves(tmp_path: Path) -> None:
    out = tmp_path / "o"
    _search(out, "s1")
    before = tree(out)
    (out / "baselines").chmod(0o555)
    try:
        with pytest.raises(OutputError, match=r"baselines/A.json' could not be written"):
            _search(out, "s2")
        assert tree(out) == before
    finally:
        (out / "baselines").chmod(0o755)


def test_a_read_only_subfolder_as_root_is_still_all_or_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same case where permissions cannot be taken away (root): a folder reported unwritable."""
    out = tmp_path / "o"
    _search(out, "s1")
    before = tree(out)
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if Path(p) == out / "baselines" else real(p, mode))
    with pytest.raises(OutputError, match=r"baselines/A.json' could not be written: its folder is not writable"):
        _search(out, "s2")
    assert tree(out) == before


def test_two_writers_take_turns_on_the_folder_lock(tmp_path: Path) -> None:
    out = tmp_path / "o"
    out.mkdir()
    folder = OutputFolder(out, command="search", expected=["plan.json"])
    fd = os.open(out, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # another writer holds the folder
    done: list[object] = []
    writer = threading.Thread(target=lambda: done.append(folder.write(fill_with({"plan.json": "w"}))))
    writer.start()
    try:
        time.sleep(0.3)
        assert not (out / "plan.json").exists() and not done  # waiting, nothing moved
    finally:
        os.close(fd)
    writer.join(timeout=120)
    assert done and (out / "plan.json").read_text() == "w"


def _staging(out: Path, name: str, host: str) -> Path:
    p = out / name
    p.mkdir()
    (p / STAGING_MARKER).write_text(json.dumps({"schema": STAGING_SCHEMA, "folder": identity(p), "pid": 1,
                                                "host": host}))  # fmt: skip
    return p


def test_another_hosts_staging_folder_is_left_alone_until_it_is_a_day_old(tmp_path: Path) -> None:
    out = tmp_path / "o"
    out.mkdir()
    fresh = _staging(out, ".umsearch-staging.fresh", "another-host-" + socket.gethostname())
    old = _staging(out, ".umsearch-staging.old", "another-host-" + socket.gethostname())
    two_days = time.time() - 2 * 86400
    for p in (old, old / STAGING_MARKER):
        os.utime(p, (two_days, two_days))
    assert not left_staging(fresh) and left_staging(old)
    _search(out, "s1")
    assert fresh.is_dir() and not old.exists()


def test_a_signal_during_the_write_takes_effect_once_the_outputs_are_in_place(tmp_path: Path) -> None:
    out = tmp_path / "o"

    def fill(stage: Path) -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        fill_with({"plan.json": "w", "report.md": "w"})(stage)

    with pytest.raises(Interrupted) as info:
        OutputFolder(out, command="search").write(fill)
    assert info.value.signum == signal.SIGTERM
    assert sorted(tree(out)) == [MANIFEST, "plan.json", "report.md"]
    assert read_manifest(out).proves(out, "plan.json")
    assert signal.getsignal(signal.SIGTERM) is not None  # handlers given back


# ------------------------------------------------------------------------------------------------ property
_USER = ("notes.txt", "plan.json", "report.md", "replay.json", "baselines/mine.json", "torchtitan.toml",
         "plan_schedule.py")  # fmt: skip
_COMMANDS: dict[str, tuple[str, ...]] = {
    # Each command's names as its CLI declares them (the search also writes baselines/NAME.json).
    "search": (*SEARCH_FILES, "baselines/GPipe.json", "baselines/1F1B.json"),
    "tune": (*TUNE_FILES, *TUNE_EXPORT_FILES),
    "replay": (REPLAY_FILE,),
    "export-torchtitan": tuple(export_names("torchtitan")),
    "export-pipelining-csv": tuple(export_names("pipelining-csv")),
}


@st.composite
def _steps(draw: st.DrawFn) -> list[tuple[str, tuple[str, ...]]]:
    """Commands in a random order, each writing a random non-empty subset of its names."""
    out = []
    for _ in range(draw(st.integers(1, 6))):
        command = draw(st.sampled_from(sorted(_COMMANDS)))
        names = _COMMANDS[command]
        out.append((command, tuple(draw(st.lists(st.sampled_from(names), min_size=1, unique=True)))))
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(user=st.lists(st.sampled_from(_USER), unique=True), steps=_steps())
def test_any_sequence_of_commands_keeps_the_users_files_and_each_commands_last_outputs(
        tmp_path: Path, user: list[str], steps: list[tuple[str, tuple[str, ...]]]) -> None:  # fmt: skip
    out = tmp_path / "o"
    shutil.rmtree(out, ignore_errors=True)
    for name in user:
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(f"user's {name}")
    mine = tree(out)
    last: dict[str, dict[str, str]] = {}  # command -> what its last successful run wrote
    for i, (command, names) in enumerate(steps):
        files = {n: f"{command} run {i}: {n}" for n in names}
        try:
            OutputFolder(out, command=command, expected=_COMMANDS[command]).write(fill_with(files))
        except OutputError as exc:
            owners = set(mine) | {n for c, w in last.items() if c != command for n in w}
            assert any(n in str(exc) for n in owners if n in _COMMANDS[command])  # refused for a real clash only
            continue
        last[command] = files
    now = tree(out)
    assert {n: now[n] for n in mine} == mine  # every user file byte-identical
    manifest = read_manifest(out)
    for command, files in last.items():
        for name, text in files.items():  # complete and consistent: the last run's files, proven its own
            assert now[name] == text.encode() and manifest.command(name) == command
            assert manifest.proves(out, name)
    written = {n for files in last.values() for n in files}
    assert set(now) == set(mine) | written | ({MANIFEST} if last else set())  # nothing else left behind
