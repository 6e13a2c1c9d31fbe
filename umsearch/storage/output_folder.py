"""An output folder shared with the user's files: umsearch replaces or removes only what it proves it wrote.

:class:`OutputFolder` is how ``search``, ``tune``, ``replay`` and ``export``
write into a folder (``--out``). The rules, in the order a run meets them:

1. Before any work: the folder is checked and made, a malformed manifest is
   refused, and every name the run may write is checked. A name that exists
   and is not proven umsearch's by the manifest (:mod:`umsearch.storage.manifest`:
   listed, same size and SHA-256, a regular file reached through real folders)
   stops the run, naming the file. So does a name another command wrote there
   (a search's ``report.md`` where tune writes its own): the message names both
   commands. No manifest proves nothing: then every existing name clashes. An
   input the command read is never replaced.
2. The run stages its files in a folder inside the output folder, named
   ``.umsearch-staging.*`` and holding a marker that records the staging
   folder's own identity. Only folders whose marker proves them a staging
   folder, of a process that is gone, are removed later (a killed run's); one
   made on another host (a shared filesystem) only once it is a day old.
   Nothing outside the named folder is read, renamed or removed.
3. On writing, under a lock on the folder (a second writer waits) and with
   SIGINT, SIGTERM and SIGHUP held until the end: a manifest listing the old
   and the new contents, the new files renamed into place (``plan.json``
   last), this command's stale files of its previous run removed only if still
   byte-identical to what it wrote (another command's outputs stay), the final
   manifest. Replaced and removed files are first moved into the staging
   folder, so a failed write puts them back: the folder is then as the
   previous run left it, and the error names the output file.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import socket
import stat
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from umsearch.errors import Interrupted, OutputError
from umsearch.storage.manifest import (
    MANIFEST,
    STAGING_PREFIX,
    Manifest,
    inside,
    read_manifest,
    regular_files,
    write_manifest,  # fmt: skip
)
from umsearch.storage.outputs import check_output_dir, replace_atomically
from umsearch.storage.reading import Content, digest, identity, read_bounded
from umsearch.storage.signals import DeferredSignals

STAGING_MARKER = ".umsearch-staging.json"
"""The marker file inside a staging folder (never moved into the output)."""
STAGING_SCHEMA = "umsearch.staging/1"
REPLACED = ".replaced"
"""Inside a staging folder: the files a write replaced or removed, until it has succeeded."""
REMOTE_STAGING_AGE_S = 24 * 3600.0
"""A staging folder made on another host is removed only once this old (its run cannot be seen from
here; a run's writing takes seconds)."""
LOCK_POLL_S = 0.05
"""How often a writer waiting for the folder's lock looks again (and whether a signal asked it to stop)."""


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
    must be gone (a run writing into the same folder right now keeps its own). One made on another host
    (a shared filesystem) is left alone until it is :data:`REMOTE_STAGING_AGE_S` old.
    """
    try:
        if not stat.S_ISDIR(p.lstat().st_mode):
            return False
        marker = json.loads(read_bounded(p / STAGING_MARKER, 4096, follow_links=False))
    except (OSError, ValueError, RecursionError):
        return False
    if not isinstance(marker, dict) or marker.get("schema") != STAGING_SCHEMA or marker.get("folder") != identity(p):
        return False
    if marker.get("host") != socket.gethostname():
        try:  # whether that host's run is alive cannot be seen from here
            return _age_s(p) > REMOTE_STAGING_AGE_S
        except OSError:
            return False
    return not _alive(marker.get("pid"))


def _age_s(p: Path) -> float:
    """Seconds since anything in the staging folder ``p`` last changed."""
    newest = max((q.lstat().st_mtime for q in (p, *p.rglob("*"))), default=p.lstat().st_mtime)
    return time.time() - newest


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




# ------------------------------------------------------------------------------------------------ writing safely
@contextlib.contextmanager
def _locked(folder: Path, stop: DeferredSignals) -> Iterator[None]:
    """Hold the folder's lock (``flock`` on the folder itself: no file of its own) while the block runs.

    A second writer waits here; a signal received while waiting stops the wait (nothing was written
    yet). Where the filesystem has no locks, the block runs unlocked, as before locks existed."""
    fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if stop.received is not None:
                    raise Interrupted(stop.received) from None
                time.sleep(LOCK_POLL_S)
            except OSError as exc:
                if exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
                    break
                raise
        yield
    finally:
        os.close(fd)  # releases the lock


class _Swap:
    """Files moved into or out of the folder, each undoable: the replaced ones wait in the staging folder."""

    def __init__(self, folder: Path, stage: Path) -> None:
        self.folder, self.keep = folder, stage / REPLACED
        self.done: list[tuple[str, bool]] = []  # (name, whether an old file was kept aside)

    def _aside(self, name: str) -> bool:
        if not os.path.lexists(self.folder / name):
            return False
        (self.keep / name).parent.mkdir(parents=True, exist_ok=True)
        os.replace(self.folder / name, self.keep / name)
        return True

    def put(self, name: str, new: Path) -> None:
        """Move ``new`` to ``name``, the file there (if any) kept aside."""
        kept = self._aside(name)
        self.done.append((name, kept))
        (self.folder / name).parent.mkdir(parents=True, exist_ok=True)
        os.replace(new, self.folder / name)

    def remove(self, name: str) -> None:
        """Move the file at ``name`` aside."""
        self.done.append((name, self._aside(name)))

    def undo(self) -> None:
        """Put every file back as it was, newest move first (best effort: each step on its own)."""
        for name, kept in reversed(self.done):
            with contextlib.suppress(OSError):
                if kept:
                    os.replace(self.keep / name, self.folder / name)
                elif os.path.lexists(self.folder / name):
                    (self.folder / name).unlink()
        self.done.clear()


# ------------------------------------------------------------------------------------------------ the folder
class OutputFolder:
    """A folder one command writes a set of files into, leaving everything else in it alone (module docstring).

    Create it before the work starts: the manifest is read, every name in
    ``expected`` checked, and the folder and a staging folder in it made and
    removed again (an unwritable place is refused now, and a command that
    fails later leaves nothing). Then call :meth:`write` with a function that
    fills the staging folder. ``command`` names the command writing (``search``,
    ``tune``, ``replay``, ``export``): the manifest records it for each file.
    ``inputs`` are files the command read: never replaced or removed. ``last``
    names the files renamed into place after all others.
    """

    def __init__(self, path: str | os.PathLike[str], what: str = "--out", *, command: str,
                 inputs: Iterable[str | os.PathLike[str]] = (), expected: Iterable[str] = (),
                 last: Iterable[str] = ("plan.json",)) -> None:  # fmt: skip
        self.path = check_output_dir(path, what)
        self.what = what
        self.command = command
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
        """What the folder's manifest proves (:func:`umsearch.storage.manifest.read_manifest`)."""
        return read_manifest(self.path, self.what)

    def _is_input(self, p: Path) -> bool:
        for src in self.inputs:
            with contextlib.suppress(OSError, ValueError):
                if os.path.samefile(p, src):
                    return True
        return False

    def _conflicts(self, names: list[str], manifest: Manifest) -> list[str]:
        """Why each of ``names`` may not be written (a file the user owns or another command wrote, an input,
        a file where a folder goes)."""
        problems = []
        for name in names:
            dest = self.path / name
            other = manifest.command(name)
            if not inside(self.path, name):
                problems.append(f"{str(dest.parent)!r} is not a folder of its own (a file or a link) where "
                                "umsearch writes a folder")  # fmt: skip
            elif self._is_input(dest):
                problems.append(f"{str(dest)!r} is an input of this command")
            elif not os.path.lexists(dest):
                continue
            elif not manifest.proves(self.path, name):
                problems.append(f"{str(dest)!r} was not written by umsearch ({manifest.why_not(self.path, name)})")
            elif other is not None and other != self.command:
                problems.append(f"{str(dest)!r} is an output of umsearch {other}, and umsearch {self.command} "
                                "writes a file of that name")  # fmt: skip
        return problems

    def _check(self, names: list[str], manifest: Manifest) -> None:
        problems = self._conflicts(names, manifest)
        if problems:
            more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
            raise OutputError(f"{self.what} {str(self.path)!r}: {'; '.join(problems[:3])}{more}; move it away or "
                              "choose another folder (umsearch replaces only files it proves it wrote there, "
                              f"with the same command: listed in {MANIFEST} with their contents)")  # fmt: skip

    def write(self, fill: Callable[[Path], Any]) -> list[Path]:
        """Call ``fill(stage)`` to write the outputs into the staging folder, then move them into place.

        See the module docstring for the order. SIGINT, SIGTERM and SIGHUP
        received meanwhile raise :class:`~umsearch.errors.Interrupted` once
        the outputs are in place. Any :class:`OSError` becomes
        :class:`OutputError` naming the output, with the folder as the previous
        run left it. Returns the paths written.
        """
        with DeferredSignals() as held:
            stage, made = self._open()
            try:
                fill(stage)
                with _locked(self.path, held):
                    return self._commit(stage)
            except OSError as exc:
                raise OutputError(f"{self.what} {str(self.path)!r}: {self._named(exc, stage)} could not be written: "
                                  f"{exc.strerror or exc}; the folder is as the previous run left it") from None
            finally:
                _discard(stage, made)  # the folders made stay once they hold anything

    def _named(self, exc: OSError, stage: Path) -> str:
        """The output an error is about: the file in the folder, never the staging folder's path."""
        for name in (exc.filename, exc.filename2):
            if not isinstance(name, str):
                continue
            with contextlib.suppress(ValueError):
                rel = Path(name).relative_to(stage)
                if rel.parts and rel.parts[0] == REPLACED:
                    rel = Path(*rel.parts[1:])
                return repr(str(self.path / rel)) if rel.parts else "an output"
            return repr(name)
        return "an output"

    def _commit(self, stage: Path) -> list[Path]:
        new = [n for n in regular_files(stage) if n != STAGING_MARKER]
        contents = {n: digest(stage / n) for n in new}
        old = read_manifest(self.path, self.what)  # again, under the lock: the folder may have changed meanwhile
        self._check(new, old)
        proven = {n: c for n in old.files if (c := old.content(self.path, n)) is not None}
        before = {n: old.command(n) for n in proven}
        commands = before | {n: self.command for n in new}
        stale = sorted(n for n in proven if n not in contents and before[n] == self.command
                       and not self._is_input(self.path / n))  # fmt: skip
        self._check_writable([*new, *stale])
        kept: dict[str, tuple[Content, ...]] = {n: (c,) for n, c in proven.items()}
        # While files move, the manifest lists old and new contents: a kill leaves every file proven.
        write_manifest(self.path, kept | {n: (*kept.get(n, ()), contents[n]) for n in new}, commands)
        swap = _Swap(self.path, stage)
        try:
            ordered = [n for n in new if n not in self.last] + [n for n in new if n in self.last]
            for name in ordered:
                if name in self.last:
                    self._remove(stale, proven, swap)
                    stale = []
                swap.put(name, stage / name)
            self._remove(stale, proven, swap)
        except BaseException:
            swap.undo()
            write_manifest(self.path, kept, before)
            raise
        gone = {n for n, moved in swap.done if n not in contents and moved}
        final = {n: c for n, c in kept.items() if n not in gone} | {n: (contents[n],) for n in new}
        write_manifest(self.path, final, commands)
        return [self.path / n for n in new]

    def _check_writable(self, names: list[str]) -> None:
        """Refuse before anything moves when a folder a file goes into (or leaves) is not writable."""
        for name in names:
            here = (self.path / name).parent
            while not here.exists() and here != self.path:
                here = here.parent
            if not os.access(here, os.W_OK | os.X_OK):
                raise OSError(errno.EACCES, "its folder is not writable", str(self.path / name))

    def _remove(self, names: list[str], proven: dict[str, Content], swap: _Swap) -> None:
        """Move aside each of ``names`` still holding what umsearch wrote (checked again right before)."""
        for name in names:
            if Manifest({name: (proven[name],)}).proves(self.path, name):
                swap.remove(name)
