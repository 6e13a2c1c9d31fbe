"""An output folder shared with the user's files: umsearch replaces or removes only what it proves it wrote.

:class:`OutputFolder` is how ``search --out`` and ``tune --out`` write. The
rules, in the order a run meets them:

1. Before any work: the folder is checked and made, a malformed manifest is
   refused, and every name the run may write is checked. A name that exists
   and is not proven umsearch's by the manifest (:mod:`umsearch.core.manifest`:
   listed, same size and SHA-256, a regular file reached through real folders)
   stops the run, naming the file. No manifest proves nothing: then every
   existing name clashes. An input the command read is never replaced.
2. The run stages its files in a folder inside the output folder, named
   ``.umsearch-staging.*`` and holding a marker that records the staging
   folder's own identity. Only folders whose marker proves them a staging
   folder, of a process that is gone, are removed later (a killed run's).
   Nothing outside the named folder is read, renamed or removed.
3. On writing: a manifest listing the old and the new contents, the new files
   renamed into place (``plan.json`` last), stale files of the previous run
   removed only if still byte-identical to what it wrote, the final manifest.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import stat
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from umsearch.core.errors import OutputError
from umsearch.core.files import Content, digest, identity, read_bounded
from umsearch.core.manifest import (
    MANIFEST,
    STAGING_PREFIX,
    Manifest,
    inside,
    read_manifest,
    regular_files,
    write_manifest,  # fmt: skip
)
from umsearch.core.outputs import check_output_dir, replace_atomically

STAGING_MARKER = ".umsearch-staging.json"
"""The marker file inside a staging folder (never moved into the output)."""
STAGING_SCHEMA = "umsearch.staging/1"


# ------------------------------------------------------------------------------------------------ staging folders
def make_staging(folder: Path) -> Path:
    """A new staging folder inside ``folder``, marked as umsearch's by its own identity and this process."""
    stage = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=folder))
    marker = {"schema": STAGING_SCHEMA, "folder": identity(stage), "pid": os.getpid(), "host": socket.gethostname()}
    replace_atomically(stage / STAGING_MARKER, json.dumps(marker).encode())
    return stage


def _alive(pid: Any) -> bool:
    if type(pid) is not int or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, owned by someone else
    return True


def left_staging(p: Path) -> bool:
    """Whether ``p`` is a staging folder a finished or killed umsearch run left (safe to remove).

    Its marker must be a regular file naming ``p`` itself (device and inode: a
    copied or hand-made folder does not match), and the process that made it
    must be gone (a run writing into the same folder right now keeps its own).
    """
    try:
        if not stat.S_ISDIR(p.lstat().st_mode):
            return False
        marker = json.loads(read_bounded(p / STAGING_MARKER, 4096, follow_links=False))
    except (OSError, ValueError, RecursionError):
        return False
    if not isinstance(marker, dict) or marker.get("schema") != STAGING_SCHEMA or marker.get("folder") != identity(p):
        return False
    return not (marker.get("host") == socket.gethostname() and _alive(marker.get("pid")))


def remove_left_staging(folder: Path) -> None:
    """Remove the staging folders inside ``folder`` that :func:`left_staging` proves a past run's."""
    with contextlib.suppress(OSError):
        for p in folder.iterdir():
            if p.name.startswith(STAGING_PREFIX) and left_staging(p):
                shutil.rmtree(p, ignore_errors=True)


def _discard(stage: Path, made: list[Path]) -> None:
    """Remove a staging folder and the (still empty) folders made for it: a run that ended without writing."""
    shutil.rmtree(stage, ignore_errors=True)
    for p in reversed(made):
        with contextlib.suppress(OSError):
            p.rmdir()  # only ever an empty folder


def _make_folders(path: Path) -> list[Path]:
    """``mkdir -p path``; returns the folders it made, outermost first."""
    missing = [p for p in (path, *path.parents) if not os.path.lexists(p)]
    path.mkdir(parents=True, exist_ok=True)
    return list(reversed(missing))


# ------------------------------------------------------------------------------------------------ the folder
class OutputFolder:
    """A folder umsearch writes a set of files into, leaving everything else in it alone (module docstring).

    Create it before the work starts: the manifest is read, every name in
    ``expected`` checked, and the folder and a staging folder in it made and
    removed again (an unwritable place is refused now, and a command that
    fails later leaves nothing). Then call :meth:`write` with a function that
    fills the staging folder. ``inputs`` are files the command read: never
    replaced or removed. ``last`` names the files renamed into place after
    all others.
    """

    def __init__(self, path: str | os.PathLike[str], what: str = "--out", *,
                 inputs: Iterable[str | os.PathLike[str]] = (), expected: Iterable[str] = (),
                 last: Iterable[str] = ("plan.json",)) -> None:  # fmt: skip
        self.path = check_output_dir(path, what)
        self.what = what
        self.inputs = [Path(p) for p in inputs]
        self.last = tuple(last)
        if self.path.is_dir():
            self._check(list(expected), read_manifest(self.path, what))
        self._open(probe=True)

    def _open(self, *, probe: bool = False) -> tuple[Path, list[Path]]:
        """Make the folder and a staging folder in it; a probe removes both again (proving the place writable)."""
        try:
            made = _make_folders(self.path)
            if probe:
                _discard(make_staging(self.path), made)
                return self.path, []
            remove_left_staging(self.path)
            return make_staging(self.path), made
        except OSError as exc:
            raise OutputError(f"{self.what} {str(self.path)!r} cannot be written: {exc.strerror or exc}; choose "
                              "another folder") from None  # fmt: skip

    def previous(self) -> Manifest:
        """What the folder's manifest proves (:func:`umsearch.core.manifest.read_manifest`)."""
        return read_manifest(self.path, self.what)

    def _is_input(self, p: Path) -> bool:
        for src in self.inputs:
            with contextlib.suppress(OSError, ValueError):
                if os.path.samefile(p, src):
                    return True
        return False

    def _conflicts(self, names: list[str], manifest: Manifest) -> list[str]:
        """Why each of ``names`` may not be written (a file the user owns, an input, a file where a folder goes)."""
        problems = []
        for name in names:
            dest = self.path / name
            if not inside(self.path, name):
                problems.append(f"{str(dest.parent)!r} is not a folder of its own (a file or a link) where "
                                "umsearch writes a folder")  # fmt: skip
            elif self._is_input(dest):
                problems.append(f"{str(dest)!r} is an input of this command")
            elif os.path.lexists(dest) and not manifest.proves(self.path, name):
                problems.append(f"{str(dest)!r} was not written by umsearch ({manifest.why_not(self.path, name)})")
        return problems

    def _check(self, names: list[str], manifest: Manifest) -> None:
        problems = self._conflicts(names, manifest)
        if problems:
            more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
            raise OutputError(f"{self.what} {str(self.path)!r}: {'; '.join(problems[:3])}{more}; move it away or "
                              "choose another folder (umsearch replaces only files it proves it wrote there: "
                              f"listed in {MANIFEST} with their contents)")  # fmt: skip

    def write(self, fill: Callable[[Path], Any]) -> list[Path]:
        """Call ``fill(stage)`` to write the outputs into the staging folder, then move them into place.

        See the module docstring for the order. Any :class:`OSError` becomes
        :class:`OutputError`. Returns the paths written.
        """
        stage, made = self._open()
        try:
            fill(stage)
            return self._commit(stage)
        except OSError as exc:
            raise OutputError(f"{self.what} {str(self.path)!r} could not be written: {exc.strerror or exc}") from None
        finally:
            _discard(stage, made)  # the folders made stay once they hold anything

    def _commit(self, stage: Path) -> list[Path]:
        new = [n for n in regular_files(stage) if n != STAGING_MARKER]
        contents = {n: digest(stage / n) for n in new}
        old = read_manifest(self.path, self.what)  # again: the folder may have changed while the run worked
        self._check(new, old)
        proven: dict[str, Content] = {}
        for n in old.files:
            if (c := old.content(self.path, n)) is not None and not self._is_input(self.path / n):
                proven[n] = c
        swapping = {n: (proven[n], contents[n]) if n in proven else (contents[n],) for n in new}
        write_manifest(self.path, {**{n: (c,) for n, c in proven.items()}, **swapping})
        stale = sorted(set(proven) - set(new))
        ordered = [n for n in new if n not in self.last] + [n for n in new if n in self.last]
        for name in ordered:
            if name in self.last:
                self._remove(stale, proven)
                stale = []
            (self.path / name).parent.mkdir(parents=True, exist_ok=True)
            os.replace(stage / name, self.path / name)
        self._remove(stale, proven)
        write_manifest(self.path, {n: (contents[n],) for n in new})
        return [self.path / n for n in new]

    def _remove(self, names: list[str], proven: dict[str, Content]) -> None:
        """Remove each of ``names`` still holding what umsearch wrote (checked again right before)."""
        for name in names:
            if Manifest({name: (proven[name],)}).proves(self.path, name):
                (self.path / name).unlink(missing_ok=True)
