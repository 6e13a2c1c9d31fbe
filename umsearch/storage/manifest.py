"""The manifest of an output folder: the proof of which files in it umsearch wrote.

A folder umsearch writes into (``search --out``, ``tune --out``) may hold the
user's own files, so umsearch replaces or removes a file there only when it can
*prove* it wrote it. The manifest, ``.umsearch-outputs.json`` in the folder,
records for each file umsearch wrote its size and SHA-256 and the command that
wrote it, and the identity (device and inode) of the folder it was written for::

    {"schema": "umsearch.outputs/3", "written_by": "umsearch 0.x",
     "folder": {"device": 2049, "inode": 1234567},
     "files": {"plan.json": {"command": "search", "contents": [{"size": 5120, "sha256": "ab12..."}]}, ...}}

A file is umsearch's when its name is listed, it is a regular file reached
through real folders (no link on the way, no other hard link to it), and its
bytes have one of the listed contents (a list, because while a run swaps its
files in, the manifest lists the old content and the new). A file edited since,
a manifest copied from another folder, one of an older umsearch (schema
``umsearch.outputs/1`` recorded names only) or no manifest at all proves
nothing: those files are the user's. A manifest of schema ``umsearch.outputs/2``
proves contents but not which command wrote them (:attr:`Manifest.commands` is
None for its entries): :class:`~umsearch.storage.output_folder.OutputFolder` then
lets a command replace such a file under a name it writes, and never removes one.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from umsearch.errors import OutputError
from umsearch.storage.outputs import replace_atomically
from umsearch.storage.reading import (
    Content,
    FileTooLarge,
    NotRegularFile,
    digest,
    identity,
    read_bounded,
)

MANIFEST = ".umsearch-outputs.json"
"""The manifest's name inside the output folder."""
SCHEMA = "umsearch.outputs/3"
_NO_COMMAND_SCHEMA = "umsearch.outputs/2"
"""Contents recorded, but not the command that wrote them."""
_OLDER_SCHEMAS = ("umsearch.outputs/1",)
MAX_BYTES = 8 * 2**20
"""Largest manifest read: some 70,000 entries, where a run writes a few dozen."""
UNKNOWN_COMMAND = "unknown"
"""The command recorded for a file an older manifest listed without one."""
STAGING_PREFIX = ".umsearch-staging."
"""Names starting so are reserved for staging folders; a manifest never lists one."""
_SHA256_HEX = frozenset("0123456789abcdef")


def clean_name(name: Any) -> str | None:
    """A manifest entry as a relative POSIX path inside the folder, or None when it is not one (never trusted)."""
    if not isinstance(name, str) or not name or "\0" in name or "\\" in name:
        return None
    pure = PurePosixPath(name)
    if pure.is_absolute() or any(part in ("", ".", "..") for part in pure.parts) or str(pure) != name:
        return None
    if pure.parts[0] == MANIFEST or pure.parts[0].startswith(STAGING_PREFIX):
        return None
    return name


def inside(folder: Path, name: str) -> bool:
    """Whether every folder on the way to ``folder / name`` is a real folder (missing ones are made as such)."""
    here = folder
    for part in PurePosixPath(name).parts[:-1]:
        here = here / part
        try:
            if not stat.S_ISDIR(here.lstat().st_mode):
                return False
        except FileNotFoundError:
            return True
        except OSError:
            return False
    return True


@dataclass(frozen=True)
class Manifest:
    """What a folder's manifest proves: for each listed name, the contents umsearch wrote under it."""

    files: dict[str, tuple[Content, ...]] = field(default_factory=dict)
    """Listed name -> the contents it may have (one, or old and new during a swap)."""
    commands: dict[str, str | None] = field(default_factory=dict)
    """Listed name -> the command that wrote it (``search``, ``tune``, ...); None where the manifest is
    older than the record (schema ``umsearch.outputs/2``)."""
    unproven: str | None = None
    """Why a manifest that is there proves nothing (another folder's, an older version's); None otherwise."""

    def content(self, folder: Path, name: str) -> Content | None:
        """The content of ``folder / name`` when the manifest proves umsearch wrote it; else None."""
        allowed = self.files.get(name)
        if not allowed or not inside(folder, name):
            return None
        path = folder / name
        try:
            info = path.lstat()
        except OSError:
            return None
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
            return None  # a link, or a file with other names: someone else's too
        if all(c.size != info.st_size for c in allowed):
            return None  # cheap refusal before hashing
        try:
            now = digest(path)
        except OSError:
            return None
        return now if now in allowed else None

    def command(self, name: str) -> str | None:
        """The command that wrote ``name`` (None: not listed, or listed by an older manifest)."""
        return self.commands.get(name)

    def proves(self, folder: Path, name: str) -> bool:
        """Whether ``folder / name`` is, byte for byte, a file umsearch wrote there."""
        return self.content(folder, name) is not None

    def why_not(self, folder: Path, name: str) -> str:
        """Why ``folder / name`` is not proven umsearch's, in words for a clash message."""
        if self.unproven:
            return self.unproven
        if name not in self.files:
            return f"{MANIFEST} does not list it" if self.files or (folder / MANIFEST).exists() else \
                f"the folder has no {MANIFEST}"  # fmt: skip
        return "it changed since umsearch wrote it, or is a link"


def _refuse(folder: Path, what: str, why: str) -> OutputError:
    return OutputError(f"{what} {str(folder)!r}: its {MANIFEST} {why}; umsearch keeps the list of the files it "
                       f"wrote there: move {MANIFEST} away or choose another folder")  # fmt: skip


def _content(entry: Any) -> Content | None:
    if not isinstance(entry, dict) or set(entry) != {"size", "sha256"}:
        return None
    size, sha = entry["size"], entry["sha256"]
    if type(size) is not int or size < 0 or not isinstance(sha, str) or len(sha) != 64 or not set(sha) <= _SHA256_HEX:
        return None
    return Content(size, sha)


_COMMAND_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz-")


def _contents(entries: Any) -> tuple[Content, ...] | None:
    if not isinstance(entries, list) or not entries:
        return None
    contents = tuple(_content(e) for e in entries)
    return None if any(c is None for c in contents) else tuple(c for c in contents if c is not None)


def _entry(entry: Any, with_command: bool) -> tuple[tuple[Content, ...], str | None] | None:
    """One ``files`` value: (contents, command), or None when malformed."""
    if not with_command:
        contents = _contents(entry)
        return None if contents is None else (contents, None)
    if not isinstance(entry, dict) or set(entry) != {"command", "contents"}:
        return None
    command, contents = entry["command"], _contents(entry["contents"])
    if not isinstance(command, str) or not 0 < len(command) <= 32 or not set(command) <= _COMMAND_CHARS:
        return None
    if contents is None:
        return None
    return contents, None if command == UNKNOWN_COMMAND else command


def _entries(doc: dict[str, Any], with_command: bool) -> tuple[dict[str, tuple[Content, ...]],
                                                               dict[str, str | None]] | None:  # fmt: skip
    """The ``files`` table as (contents, commands), or None when it is malformed (unsafe names are
    dropped, never trusted)."""
    files = doc.get("files")
    if not isinstance(files, dict):
        return None
    contents: dict[str, tuple[Content, ...]] = {}
    commands: dict[str, str | None] = {}
    for name, raw in files.items():
        entry = _entry(raw, with_command)
        if entry is None:
            return None
        if (clean := clean_name(name)) is not None:
            contents[clean], commands[clean] = entry
    return contents, commands


def read_manifest(folder: Path, what: str = "--out") -> Manifest:
    """The manifest of ``folder`` (empty when there is none).

    Raises :class:`OutputError` in one line, before any work, when the
    manifest is not a regular file (a folder, FIFO, device, link), is over
    :data:`MAX_BYTES` or is not a manifest (malformed JSON, unknown schema,
    bad entries). A manifest written for another folder, or by an umsearch
    that recorded no contents, is read as proving nothing.
    """
    try:
        raw = read_bounded(folder / MANIFEST, MAX_BYTES, follow_links=False)
    except (FileNotFoundError, NotADirectoryError):
        return Manifest()
    except NotRegularFile as exc:
        raise _refuse(folder, what, f"is {exc.what}, not a file") from None
    except FileTooLarge as exc:
        raise _refuse(folder, what, f"has {exc.size} bytes, over the limit of {MAX_BYTES}") from None
    except OSError as exc:
        raise _refuse(folder, what, f"cannot be read ({exc.strerror or exc})") from None
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError):
        raise _refuse(folder, what, "is not JSON") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("schema"), str):
        raise _refuse(folder, what, "is not a manifest (no schema)") from None
    if doc["schema"] in _OLDER_SCHEMAS:
        return Manifest(unproven=f"{MANIFEST} is an older umsearch's, which recorded no contents")
    if doc["schema"] not in (SCHEMA, _NO_COMMAND_SCHEMA):
        raise _refuse(folder, what, f"has schema {str(doc['schema'])[:40]!r}, not {SCHEMA!r}")
    table = _entries(doc, with_command=doc["schema"] == SCHEMA)
    if table is None:
        raise _refuse(folder, what, "has a malformed 'files' table")
    if doc.get("folder") != identity(folder, follow_links=True):
        return Manifest(unproven=f"{MANIFEST} was written for another folder (copied or restored)")
    return Manifest(*table)


def write_manifest(folder: Path, files: dict[str, tuple[Content, ...]], commands: dict[str, str | None]) -> None:
    """Write ``folder``'s manifest (atomically) listing ``files``, each under the command that wrote it,
    bound to the folder. An entry whose command is unknown (an older manifest's) is kept as the
    command ``unknown``, which no command writes as."""
    from umsearch import __version__

    doc = {"schema": SCHEMA, "written_by": f"umsearch {__version__}", "folder": identity(folder, follow_links=True),
           "files": {n: {"command": commands.get(n) or UNKNOWN_COMMAND, "contents": [c.to_json() for c in files[n]]}
                     for n in sorted(files)}}  # fmt: skip
    replace_atomically(folder / MANIFEST, (json.dumps(doc, indent=2) + "\n").encode())


def regular_files(root: Path) -> list[str]:
    """Every regular file under ``root`` (links not followed), as sorted relative POSIX paths."""
    out = []
    for dirpath, _, names in os.walk(root):
        for n in names:
            p = Path(dirpath) / n
            if stat.S_ISREG(p.lstat().st_mode):
                out.append(p.relative_to(root).as_posix())
    return sorted(out)
