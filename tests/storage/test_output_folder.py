"""umsearch.storage.output_folder and umsearch.storage.manifest: an output folder shared with the user's files.

umsearch replaces or removes a file only when its manifest proves, by size and SHA-256 and for this very
folder, that umsearch wrote it; it never touches anything outside the folder (issue 33).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.folders import fill_with, tree
from umsearch.errors import OutputError
from umsearch.storage.manifest import MANIFEST, SCHEMA, read_manifest
from umsearch.storage.output_folder import STAGING_MARKER, OutputFolder, left_staging, make_staging
from umsearch.storage.reading import identity


def _entry(text: str) -> list[dict[str, object]]:
    data = text.encode()
    return [{"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}]


def _listed(text: str, command: str = "search") -> dict[str, object]:
    """A manifest entry: the contents ``text`` written by ``command``."""
    return {"command": command, "contents": _entry(text)}


def _manifest(folder: Path, files: dict[str, str], *, bound_to: Path | None = None) -> None:
    """A manifest in ``folder`` listing ``files`` (name -> the text claimed), bound to ``bound_to``."""
    doc = {"schema": SCHEMA, "folder": identity(bound_to or folder), "files": {n: _listed(t) for n, t in files.items()}}
    (folder / MANIFEST).write_text(json.dumps(doc))


def test_a_folder_keeps_the_users_files_and_replaces_only_its_own(tmp_path: Path) -> None:
    out = tmp_path / "o"
    out.mkdir()
    (out / "mine.txt").write_text("mine")
    OutputFolder(out, command="search").write(fill_with({"plan.json": "1", "baselines/A.json": "a", "baselines/B.json": "b"}))
    assert set(read_manifest(out).files) == {"plan.json", "baselines/A.json", "baselines/B.json"}
    (out / "baselines" / "mine.json").write_text("mine")
    written = OutputFolder(out, command="search").write(fill_with({"plan.json": "2", "baselines/A.json": "a2"}))
    assert written == [out / "baselines/A.json", out / "plan.json"]
    assert sorted(tree(out)) == [MANIFEST, "baselines/A.json", "baselines/mine.json", "mine.txt", "plan.json"]
    assert (out / "plan.json").read_text() == "2"
    assert not [p for p in out.iterdir() if p.name.startswith(".umsearch-staging")]


def test_a_stale_output_the_user_edited_is_kept(tmp_path: Path) -> None:
    out = tmp_path / "o"
    OutputFolder(out, command="search").write(fill_with({"plan.json": "1", "baselines/A.json": "a", "baselines/B.json": "b"}))
    (out / "baselines" / "B.json").write_text("my notes on B")
    OutputFolder(out, command="search").write(fill_with({"plan.json": "2"}))
    assert not (out / "baselines" / "A.json").exists()  # umsearch's, unchanged: removed as stale
    assert (out / "baselines" / "B.json").read_text() == "my notes on B"
    with pytest.raises(OutputError, match=r"B.json' was not written by umsearch \(.*does not list it\)"):
        OutputFolder(out, command="search", expected=["baselines/B.json"])


@pytest.mark.parametrize("how", ["copied from another folder", "edited hashes", "older schema"])
def test_a_forged_or_stale_manifest_deletes_and_replaces_nothing_of_the_users(tmp_path: Path, how: str) -> None:
    """Issue 33, finding 2: a manifest listing the user's keep.txt, sub/notes.md and report.md."""
    out, other = tmp_path / "out", tmp_path / "other"
    (out / "sub").mkdir(parents=True)
    other.mkdir()
    user = {"keep.txt": "keep", "sub/notes.md": "notes", "report.md": "my report"}
    for name, text in user.items():
        (out / name).write_text(text)
    if how == "copied from another folder":  # the contents match, but the manifest was written for `other`
        _manifest(out, user, bound_to=other)
    elif how == "edited hashes":
        _manifest(out, {n: t + " as umsearch wrote it" for n, t in user.items()})
    else:
        (out / MANIFEST).write_text(json.dumps({"schema": "umsearch.outputs/1", "files": sorted(user)}))
    with pytest.raises(OutputError, match="report.md' was not written by umsearch"):
        OutputFolder(out, command="search", expected=["plan.json", "report.md"])
    OutputFolder(out, command="search", expected=["plan.json"]).write(fill_with({"plan.json": "{}"}))
    assert {n: (out / n).read_text() for n in user} == user
    assert set(read_manifest(out).files) == {"plan.json"}


def test_a_manifest_proves_only_in_the_folder_it_was_written_for(tmp_path: Path) -> None:
    out = tmp_path / "out"
    OutputFolder(out, command="search").write(fill_with({"plan.json": "1", "report.md": "r"}))
    assert read_manifest(out).proves(out, "report.md")
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)  # a backup restored, say: its files are the user's now
    assert read_manifest(copy).files == {} and "another folder" in str(read_manifest(copy).unproven)
    with pytest.raises(OutputError, match="written for another folder"):
        OutputFolder(copy, command="search", expected=["report.md"])
    moved = tmp_path / "moved"
    out.rename(moved)  # a rename keeps the folder: still umsearch's
    OutputFolder(moved, command="search", expected=["plan.json", "report.md"]).write(fill_with({"plan.json": "2", "report.md": "r2"}))
    assert (moved / "report.md").read_text() == "r2"


def test_a_folder_without_a_manifest_is_all_the_users(tmp_path: Path) -> None:
    """Issue 33, finding 3: a copied umsearch plan.json proves nothing; the run stops before any work."""
    out = tmp_path / "res"
    (out / "baselines").mkdir(parents=True)
    (out / "plan.json").write_text('{"schema": "umsearch.plan/2"}')
    (out / "report.md").write_text("old report")
    (out / "baselines" / "MyHandTuned.json").write_text('{"schema": "umsearch.plan/2"}')
    before = tree(out)
    with pytest.raises(OutputError, match=r"plan.json' was not written by umsearch \(the folder has no "):
        OutputFolder(out, command="search", expected=["plan.json", "report.md"])
    OutputFolder(out, command="search").write(fill_with({"pareto.json": "{}"}))  # a name that is free is fine
    assert {n: b for n, b in tree(out).items() if n in before} == before


def test_folders_beside_the_output_are_never_touched(tmp_path: Path) -> None:
    """Issue 33, finding 1: a backup, a dated copy and an 'old' snapshot beside --out survive a run."""
    beside = {".out.backup01/report.md": "backup", ".out.20261206/plan.json": "dated",
              ".out.old.snapshot/previous/plan.json": "previous", ".out.abcd_123/pareto.json": "{}"}  # fmt: skip
    for name, text in beside.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    OutputFolder(tmp_path / "out", command="search").write(fill_with({"plan.json": "{}"}))
    assert {n: (tmp_path / n).read_text() for n in beside} == beside
    assert sorted(tree(tmp_path / "out")) == [MANIFEST, "plan.json"]


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_only_a_staging_folder_its_marker_proves_is_removed(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / ".umsearch-staging.mine").mkdir()  # the user's, whatever its name says
    (out / ".umsearch-staging.mine" / "notes.md").write_text("mine")
    killed = make_staging(out)  # what a killed run leaves: its marker, a process that is gone
    marker = json.loads((killed / STAGING_MARKER).read_text())
    (killed / STAGING_MARKER).write_text(json.dumps({**marker, "pid": _dead_pid()}))
    (killed / "plan.json").write_text("{}")
    copied = out / ".umsearch-staging.copied"
    shutil.copytree(killed, copied)  # a copy's marker names another folder
    live = make_staging(out)  # a run writing into the same folder now (this process)
    assert left_staging(killed) and not left_staging(copied) and not left_staging(live)
    OutputFolder(out, command="search").write(fill_with({"plan.json": "{}"}))
    left = sorted(p.name for p in out.iterdir() if p.name.startswith(".umsearch-staging"))
    assert left == sorted([".umsearch-staging.mine", copied.name, live.name])
    assert (out / ".umsearch-staging.mine" / "notes.md").read_text() == "mine"


def test_a_run_that_ends_without_writing_leaves_nothing(tmp_path: Path) -> None:
    code = ("import sys; from umsearch.storage.output_folder import OutputFolder; "
            f"OutputFolder({str(tmp_path / 'a' / 'b')!r}); sys.exit(1)")  # fmt: skip
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 1
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("kind, message", [
    ("folder", "is a folder, not a file"),
    ("fifo", r"is a FIFO \(named pipe\), not a file"),
    ("link to /dev/zero", "is a link, not a file"),
    ("too large", "over the limit of"),
    ("not JSON", "is not JSON"),
    ("bad entry", "malformed 'files' table"),
    ("unknown schema", "has schema 'umsearch.outputs/9'"),
])  # fmt: skip
def test_a_manifest_that_is_no_manifest_is_refused_at_once(tmp_path: Path, kind: str, message: str) -> None:
    out = tmp_path / "out"
    out.mkdir()
    m = out / MANIFEST
    if kind == "folder":
        m.mkdir()
    elif kind == "fifo":
        os.mkfifo(m)
    elif kind == "link to /dev/zero":
        m.symlink_to("/dev/zero")
    elif kind == "too large":
        m.write_bytes(b" " * (9 * 2**20))
    elif kind == "not JSON":
        m.write_text("{")
    elif kind == "bad entry":
        m.write_text(json.dumps({"schema": SCHEMA, "folder": identity(out), "files": {"plan.json": [{"size": -1}]}}))
    else:
        m.write_text(json.dumps({"schema": "umsearch.outputs/9", "files": {}}))
    start = time.monotonic()
    with pytest.raises(OutputError, match=message):
        OutputFolder(out, command="search", expected=["plan.json"])
    assert time.monotonic() - start < 60  # a FIFO or a device would block or read forever: a generous bound
    assert os.path.lexists(m)


def test_a_fifo_or_device_link_in_the_folder_is_a_clash_never_read(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    os.mkfifo(out / "plan.json")
    (out / "report.md").symlink_to("/dev/zero")
    _manifest(out, {"plan.json": "{}", "report.md": ""})
    with pytest.raises(OutputError, match="plan.json' was not written by umsearch.*report.md' was not written"):
        OutputFolder(out, command="search", expected=["plan.json", "report.md"])


def test_a_swap_killed_halfway_is_finished_by_the_next_run(tmp_path: Path) -> None:
    """The manifest written before the swap lists old and new contents: either proves the file umsearch's."""
    out = tmp_path / "out"
    OutputFolder(out, command="search").write(fill_with({"plan.json": "old", "report.md": "old"}))
    doc = json.loads((out / MANIFEST).read_text())
    for name in ("plan.json", "report.md"):
        doc["files"][name]["contents"] += _entry("new")
    (out / MANIFEST).write_text(json.dumps(doc))
    (out / "report.md").write_text("new")  # renamed in before the kill; plan.json still holds the old content
    OutputFolder(out, command="search", expected=["plan.json", "report.md"]).write(fill_with({"plan.json": "3", "report.md": "3"}))
    assert (out / "plan.json").read_text() == "3" and (out / "report.md").read_text() == "3"


def test_a_hostile_manifest_removes_nothing_outside_or_of_the_inputs(tmp_path: Path) -> None:
    out = tmp_path / "o"
    out.mkdir()
    (tmp_path / "victim.txt").write_text("v")
    (out / "space.toml").write_text("t")
    listed = {"../victim.txt": "v", str(tmp_path / "victim.txt"): "v", "space.toml": "t", "./plan.json": "{}"}
    _manifest(out, listed)
    assert set(read_manifest(out).files) == {"space.toml"}
    OutputFolder(out, command="search", inputs=[out / "space.toml"]).write(fill_with({"plan.json": "1"}))
    assert (tmp_path / "victim.txt").read_text() == "v" and (out / "space.toml").read_text() == "t"
    with pytest.raises(OutputError, match="space.toml' is an input of this command"):
        OutputFolder(out, command="search", inputs=[out / "space.toml"], expected=["space.toml"])


def test_a_folder_link_in_the_output_leads_nothing_outside(tmp_path: Path) -> None:
    out, elsewhere = tmp_path / "o", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    (elsewhere / "GPipe.json").write_text("{}")
    (out / "baselines").symlink_to(elsewhere)
    _manifest(out, {"baselines/GPipe.json": "{}"})
    OutputFolder(out, command="search").write(fill_with({"plan.json": "{}"}))  # the stale entry lies behind a link: kept
    assert (elsewhere / "GPipe.json").read_text() == "{}"
    with pytest.raises(OutputError, match="is not a folder of its own"):
        OutputFolder(out, command="search").write(fill_with({"baselines/GPipe.json": "{}"}))
    assert (elsewhere / "GPipe.json").read_text() == "{}"


def test_a_hard_linked_output_is_not_proven(tmp_path: Path) -> None:
    out = tmp_path / "o"
    OutputFolder(out, command="search").write(fill_with({"plan.json": "1", "report.md": "r"}))
    os.link(out / "report.md", tmp_path / "my-copy.md")  # the user's second name for it
    OutputFolder(out, command="search").write(fill_with({"plan.json": "2"}))
    assert (out / "report.md").exists() and (tmp_path / "my-copy.md").read_text() == "r"


def test_a_folder_reached_through_a_link_is_the_same_folder(tmp_path: Path) -> None:
    real = tmp_path / "real"
    OutputFolder(real, command="search").write(fill_with({"plan.json": "1", "report.md": "r"}))
    (tmp_path / "link").symlink_to(real)
    OutputFolder(tmp_path / "link", command="search", expected=["plan.json", "report.md"]).write(fill_with({"plan.json": "2",
                                                                                    "report.md": "r2"}))
    assert (real / "report.md").read_text() == "r2" and read_manifest(real).proves(real, "report.md")
