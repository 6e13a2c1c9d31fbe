"""umsearch.core.outputs: output paths checked before work, devices written through, folders shared with
the user's own files (issue 24)."""

from __future__ import annotations

import json
import os
import socket
import stat
from pathlib import Path

import pytest

from umsearch.core.errors import OutputError
from umsearch.core.outputs import (
    MANIFEST,
    OutputFolder,
    check_output_dir,
    check_output_file,
    read_manifest,
    write_output_file,
)


def _node(path: Path, kind: int, device: tuple[int, int]) -> Path:
    try:
        os.mknod(path, kind | 0o666, os.makedev(*device))
    except (PermissionError, OSError) as exc:
        pytest.skip(f"cannot make a device node here: {exc}")
    return path


@pytest.mark.parametrize("name, message", [
    ("", "--gantt is an empty path"),
    ("a\0b.png", "contains a NUL byte"),
    ("x" * 256, "is 256 bytes long, over the limit of 255"),
    ("/".join(["d"] * 2100), "is too long (4199 bytes"),
    ("\udc80x.png", None),  # an undecodable byte from the command line: a valid name
    ("\ud800.png", "cannot be encoded as a file name"),
])  # fmt: skip
def test_bad_output_names_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str,
                                     message: str | None) -> None:  # fmt: skip
    monkeypatch.chdir(tmp_path)
    if message is None:
        assert check_output_file(name, "--gantt") == Path(name)
        return
    with pytest.raises(OutputError, match=message.replace("(", r"\(")):
        check_output_file(name, "--gantt")


def test_file_kinds_an_output_may_not_replace(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "sock"))
    (tmp_path / "file").write_text("")
    cases = {"fifo": r"is a FIFO \(named pipe\)", "sock": "is a socket", ".": "is a folder",
             "file/x.png": "'.*file' is a file, not a folder"}  # fmt: skip
    for name, message in cases.items():
        with pytest.raises(OutputError, match=message):
            check_output_file(tmp_path / name, "--out")
    sock.close()
    with pytest.raises(OutputError, match="is a file, not a folder"):
        check_output_dir(tmp_path / "file", "--out")


def test_a_block_device_is_refused(tmp_path: Path) -> None:
    dev = _node(tmp_path / "blk", stat.S_IFBLK, (7, 0))
    with pytest.raises(OutputError, match="is a block device"):
        write_output_file(dev, b"x", "--out")
    assert stat.S_ISBLK(dev.lstat().st_mode)


def test_a_character_device_is_written_through(tmp_path: Path) -> None:
    dev = _node(tmp_path / "null", stat.S_IFCHR, (1, 3))
    assert write_output_file(dev, "text") == dev
    assert stat.S_ISCHR(dev.lstat().st_mode) and os.listdir(tmp_path) == ["null"]


def test_a_regular_file_is_replaced_keeping_its_mode_and_a_link_keeps_pointing(tmp_path: Path) -> None:
    target = tmp_path / "real.json"
    target.write_text("old")
    target.chmod(0o600)
    link = tmp_path / "link.json"
    link.symlink_to(target)
    write_output_file(link, "new")
    assert link.is_symlink() and target.read_text() == "new" and stat.S_IMODE(target.stat().st_mode) == 0o600
    write_output_file(tmp_path / "a" / "b.json", "x")  # missing folders are made
    assert (tmp_path / "a" / "b.json").read_text() == "x"


def _fill(names: dict[str, str]):  # type: ignore[no-untyped-def]
    def fill(stage: Path) -> None:
        for name, text in names.items():
            (stage / name).parent.mkdir(parents=True, exist_ok=True)
            (stage / name).write_text(text)

    return fill


def test_a_folder_keeps_the_users_files_and_replaces_only_its_own(tmp_path: Path) -> None:
    out = tmp_path / "o"
    out.mkdir()
    (out / "mine.txt").write_text("mine")
    OutputFolder(out).write(_fill({"plan.json": "1", "baselines/A.json": "a", "baselines/B.json": "b"}))
    assert read_manifest(out) == {"plan.json", "baselines/A.json", "baselines/B.json"}
    (out / "baselines" / "mine.json").write_text("mine")
    written = OutputFolder(out).write(_fill({"plan.json": "2", "baselines/A.json": "a2"}))
    assert written == [out / "baselines/A.json", out / "plan.json"]
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) == [
        MANIFEST, "baselines/A.json", "baselines/mine.json", "mine.txt", "plan.json"]  # fmt: skip
    assert (out / "plan.json").read_text() == "2"


def test_a_hostile_manifest_removes_nothing_outside_or_of_the_inputs(tmp_path: Path) -> None:
    out = tmp_path / "o"
    out.mkdir()
    (tmp_path / "victim.txt").write_text("v")
    (out / "space.toml").write_text("t")
    entries = ["../victim.txt", str(tmp_path / "victim.txt"), "space.toml", "./plan.json", MANIFEST]
    (out / MANIFEST).write_text(json.dumps({"schema": "umsearch.outputs/1", "files": entries}))
    assert read_manifest(out) == {"space.toml"}
    OutputFolder(out, inputs=[out / "space.toml"]).write(_fill({"plan.json": "1"}))
    assert (tmp_path / "victim.txt").read_text() == "v" and (out / "space.toml").read_text() == "t"
    with pytest.raises(OutputError, match="space.toml' is an input of this command"):
        OutputFolder(out, inputs=[out / "space.toml"], expected=["space.toml"])


def test_a_folder_written_before_manifests_is_taken_as_umsearchs(tmp_path: Path) -> None:
    out = tmp_path / "res"
    (out / "baselines").mkdir(parents=True)
    (out / "plan.json").write_text('{"schema": "umsearch.plan/2"}')
    (out / "report.md").write_text("old report")
    (out / "baselines" / "GPipe.json").write_text('{"schema": "umsearch.plan/2"}')
    (out / "baselines" / "notes.json").write_text('{"mine": true}')
    OutputFolder(out, expected=["plan.json", "report.md"]).write(_fill({"plan.json": "{}", "report.md": "new"}))
    assert (out / "report.md").read_text() == "new" and not (out / "baselines" / "GPipe.json").exists()
    assert (out / "baselines" / "notes.json").exists()


def test_a_swap_killed_halfway_by_an_older_version_is_undone(tmp_path: Path) -> None:
    """The pre-manifest search moved the old output into .NAME.old.XXXXXXXX/previous first: give it back."""
    old = tmp_path / ".res.old.abcdefgh"
    (old / "previous").mkdir(parents=True)
    (old / "previous" / "plan.json").write_text('{"schema": "umsearch.plan/2"}')
    (old / "previous" / "keep.txt").write_text("mine")
    OutputFolder(tmp_path / "res").write(_fill({"plan.json": "{}"}))
    assert (tmp_path / "res" / "keep.txt").read_text() == "mine" and not old.exists()


def test_a_folder_link_in_the_output_leads_nothing_outside(tmp_path: Path) -> None:
    out, elsewhere = tmp_path / "o", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    (elsewhere / "GPipe.json").write_text("not umsearch's")
    (out / "baselines").symlink_to(elsewhere)
    (out / MANIFEST).write_text(json.dumps({"schema": "umsearch.outputs/1", "files": ["baselines/GPipe.json"]}))
    OutputFolder(out).write(_fill({"plan.json": "{}"}))  # the stale entry lies behind a link: kept
    assert (elsewhere / "GPipe.json").read_text() == "not umsearch's"
    with pytest.raises(OutputError, match="is not a folder of its own"):
        OutputFolder(out).write(_fill({"baselines/GPipe.json": "{}"}))
    assert (elsewhere / "GPipe.json").read_text() == "not umsearch's"
