"""umsearch.storage.outputs: output paths checked before work, devices written through (issue 24)."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest

from umsearch.errors import OutputError
from umsearch.storage.outputs import check_output_dir, check_output_file, write_output_file


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
