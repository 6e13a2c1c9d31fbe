"""Outputs that never destroy what the user did not ask to replace.

Every file a command writes goes through this module:

* :func:`check_output_file` / :func:`check_output_dir` refuse a bad output
  path *before* any work starts (NUL bytes, over-long names, a file where a
  folder must be, a folder, FIFO, socket or block device where a file must be),
  so nothing is measured or searched only to fail at the end.
* :func:`write_output_file` replaces a regular file atomically (temp file in
  the same folder, fsync, rename: readers see the old file or the new one) and
  writes *through* an existing character device such as ``/dev/null`` (never
  replacing the node); FIFOs, sockets and block devices are refused.
* :class:`OutputFolder` writes a set of files into a folder the user may share
  with files of their own. A manifest in the folder (:data:`MANIFEST`) lists
  what umsearch wrote there; only files in the previous manifest are replaced
  or removed, a file umsearch did not write is never touched (its name in the
  new output is refused, before any work), no input the command read is
  replaced or removed, the main file (``plan.json``) is renamed into place last,
  and staging folders left by a killed run are removed at the next run.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path, PurePosixPath
from typing import Any

from umsearch.core.errors import OutputError
from umsearch.core.paths import path_text

MANIFEST = ".umsearch-outputs.json"
"""The manifest file :class:`OutputFolder` keeps in every folder it writes."""
MANIFEST_SCHEMA = "umsearch.outputs/1"
STAGING_PREFIX = ".umsearch-staging."
"""Prefix of the staging folder inside an output folder (removed when left by a killed run)."""
_LEGACY_STAGING = re.compile(r"\.(?P<name>.+?)\.(?:old\.)?[a-z0-9_]{8}")
"""Staging folders of umsearch versions before the manifest: ``.OUT.XXXXXXXX`` and ``.OUT.old.XXXXXXXX``
beside the output folder."""


def _path_text(path: str | os.PathLike[str], what: str) -> str:
    """``path`` as text after the checks every path gets (:func:`umsearch.core.paths.path_text`)."""
    return path_text(path, what, OutputError)


def _kind(mode: int) -> str:
    """What a file mode is, in words."""
    kinds = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISCHR, "a character device"), (stat.S_ISREG, "a file"))  # fmt: skip
    return next((word for test, word in kinds if test(mode)), "not a regular file")


def _check_ancestors(p: Path, what: str, text: str) -> None:
    """The nearest existing folder above ``p`` is a folder we may write into (missing ones are created)."""
    for parent in p.absolute().parents:
        try:
            info = parent.stat()
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as exc:
            raise OutputError(f"{what} {text!r}: cannot use folder {str(parent)!r}: {exc.strerror}") from None
        if not stat.S_ISDIR(info.st_mode):
            raise OutputError(f"{what} {text!r} cannot be written: {str(parent)!r} is {_kind(info.st_mode)}, "
                              "not a folder; choose a path inside a folder")  # fmt: skip
        if not os.access(parent, os.W_OK | os.X_OK):
            raise OutputError(f"{what} {text!r} cannot be written: folder {str(parent)!r} is not writable; "
                              "choose another path")  # fmt: skip
        return


def _same_file(a: Path, b: str | os.PathLike[str]) -> bool:
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return False


def check_output_file(path: str | os.PathLike[str], what: str = "output file", *,
                      inputs: Iterable[str | os.PathLike[str]] = ()) -> Path:  # fmt: skip
    """``path`` as a :class:`Path` if a file can be written there; else :class:`OutputError` naming it and the fix.

    Refused: an empty path, a NUL byte, a name over :data:`~umsearch.core.paths.NAME_MAX` or a path
    over :data:`~umsearch.core.paths.PATH_MAX` bytes, a file (not a folder) above it, an existing
    folder, FIFO, socket or block device. An existing regular file is fine (it
    is replaced atomically), so is a character device such as ``/dev/null``
    (written through). Missing parent folders are fine (created on writing).
    ``what`` names the path in messages, e.g. ``"--gantt"``; ``inputs`` are
    files the command reads, which it may not write over.
    """
    text = _path_text(path, what)
    p = Path(text)
    try:
        info = p.stat()
    except (FileNotFoundError, NotADirectoryError):  # the ancestors' check says which
        info = None
    except OSError as exc:
        raise OutputError(f"{what} {text!r} cannot be used: {exc.strerror}; choose another path") from None
    if info is not None:
        if stat.S_ISDIR(info.st_mode):
            raise OutputError(f"{what} {text!r} is a folder; give a file name (e.g. {text.rstrip('/')}/NAME)")
        if not (stat.S_ISREG(info.st_mode) or stat.S_ISCHR(info.st_mode)):
            raise OutputError(f"{what} {text!r} is {_kind(info.st_mode)}; umsearch writes regular files (or "
                              "character devices such as /dev/null): give another path")  # fmt: skip
        if stat.S_ISREG(info.st_mode) and any(_same_file(p, src) for src in inputs):
            raise OutputError(f"{what} {text!r} is an input of this command; give another path")
    _check_ancestors(p, what, text)
    return p


def check_output_dir(path: str | os.PathLike[str], what: str = "output folder") -> Path:
    """``path`` as a :class:`Path` if it is, or can become, a folder to write into; else :class:`OutputError`.

    Same path checks as :func:`check_output_file`; an existing path must be a folder.
    """
    text = _path_text(path, what)
    p = Path(text)
    try:
        info = p.stat()
    except (FileNotFoundError, NotADirectoryError):
        _check_ancestors(p, what, text)
        return p
    except OSError as exc:
        raise OutputError(f"{what} {text!r} cannot be used: {exc.strerror}; choose another folder") from None
    if not stat.S_ISDIR(info.st_mode):
        raise OutputError(f"{what} {text!r} is {_kind(info.st_mode)}, not a folder; give a folder")
    if not os.access(p, os.W_OK | os.X_OK):
        raise OutputError(f"{what} {text!r} is not writable; choose another folder")
    return p


class OutputWriteError(OutputError):
    """Writing an output failed after its path was accepted (a full disk, a vanished folder)."""

    def __init__(self, what: str, path: str, reason: str) -> None:
        super().__init__(f"{what} {path!r} could not be written: {reason}; nothing was left there")
        self.reason = reason
        """Why, in words (the operating system's)."""


def _write_through(p: Path, data: bytes) -> None:
    """Write into an existing character device (``/dev/null``, a terminal): open and write, never replace it."""
    fd = os.open(p, os.O_WRONLY | getattr(os, "O_NOCTTY", 0))
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def _replace_atomically(target: Path, data: bytes) -> None:
    """Write ``data`` to a temp file beside ``target``, fsync it and rename it over ``target``."""
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = stat.S_IMODE(target.stat().st_mode)  # keep the permissions of the file replaced
    except FileNotFoundError:
        mode = 0o644  # mkstemp creates 0600; outputs are meant to be shared
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name[:200]}.", suffix=".tmp", dir=target.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_output_file(path: str | os.PathLike[str], data: str | bytes, what: str = "output file") -> Path:
    """Write ``data`` (``str`` as UTF-8) to ``path``; returns the path.

    A regular file (or an absent path) is replaced atomically: readers and a
    crash see the old file or the new one, never a mix. A symbolic link is
    followed (the file it names is replaced, the link stays). An existing
    character device is written through, never replaced. Everything else
    :func:`check_output_file` refuses raises :class:`OutputError`, and so does a
    failed write (nothing partial is left at ``path``).
    """
    p = check_output_file(path, what)
    target = Path(os.path.realpath(p)) if p.is_symlink() else p
    try:
        raw = data.encode("utf-8") if isinstance(data, str) else data
        if target.exists() and stat.S_ISCHR(target.stat().st_mode):
            _write_through(target, raw)
        else:
            _replace_atomically(target, raw)
    except OSError as exc:
        raise OutputWriteError(what, str(p), str(exc.strerror or exc)) from None
    except UnicodeEncodeError as exc:  # text from an input the input layer let through: a bug, said in one line
        raise OutputWriteError(what, str(p), f"the text holds {exc.object[exc.start:exc.end]!a}, which is not "
                               "Unicode") from None  # fmt: skip
    return p


# ---------------------------------------------------------------------------------------------------------------------
# Output folders


def _clean_name(name: Any) -> str | None:
    """A manifest entry as a relative POSIX path inside the folder, or None when it is not one (never trusted)."""
    if not isinstance(name, str) or not name or "\0" in name or "\\" in name:
        return None
    pure = PurePosixPath(name)
    if pure.is_absolute() or any(part in ("", ".", "..") for part in pure.parts) or str(pure) != name:
        return None
    if pure.parts[0] == MANIFEST or pure.parts[0].startswith(STAGING_PREFIX):
        return None
    return name


def read_manifest(folder: Path) -> set[str] | None:
    """The files the manifest in ``folder`` says umsearch wrote there; None when there is no usable manifest."""
    try:
        doc = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(doc, dict) or doc.get("schema") != MANIFEST_SCHEMA or not isinstance(doc.get("files"), list):
        return None
    return {n for n in map(_clean_name, doc["files"]) if n is not None}


def _write_manifest(folder: Path, names: Iterable[str]) -> None:
    from umsearch import __version__

    doc = {"schema": MANIFEST_SCHEMA, "written_by": f"umsearch {__version__}", "files": sorted(names)}
    _replace_atomically(folder / MANIFEST, (json.dumps(doc, indent=2) + "\n").encode())


def _is_umsearch_json(path: Path) -> bool:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(doc, dict) and str(doc.get("schema", "")).startswith("umsearch.")


def _legacy_outputs(folder: Path, known: Iterable[str]) -> set[str]:
    """Files of an output folder written before manifests existed (its ``plan.json`` is an umsearch plan).

    Only names umsearch writes count, and of JSON files only those whose
    ``schema`` is umsearch's; anything else in the folder stays the user's.
    """
    if not _is_umsearch_json(folder / "plan.json"):
        return set()
    found: set[str] = set()
    for name in known:
        p = folder / name
        if not _ours(folder, name):
            continue
        if name.endswith(".json") and not _is_umsearch_json(p):
            continue
        found.add(name)
    return found


def _regular(p: Path) -> bool:
    """Whether ``p`` is a regular file itself (not a link to one)."""
    try:
        return stat.S_ISREG(p.lstat().st_mode)
    except OSError:
        return False


def _inside(folder: Path, name: str) -> bool:
    """Whether every folder on the way to ``folder / name`` is a real folder, not a link leading elsewhere."""
    here = folder
    for part in PurePosixPath(name).parts[:-1]:
        here = here / part
        try:
            if not stat.S_ISDIR(here.lstat().st_mode):
                return False
        except FileNotFoundError:
            return True  # made by the writer, as a real folder
        except OSError:
            return False
    return True


def _ours(folder: Path, name: str) -> bool:
    """Whether ``folder / name`` is a regular file reached through real folders only (one we may replace)."""
    return _inside(folder, name) and _regular(folder / name)


def _staged_files(stage: Path) -> list[str]:
    """Every regular file under ``stage``, as sorted relative POSIX paths."""
    return sorted(p.relative_to(stage).as_posix() for p in stage.rglob("*") if _regular(p))


class OutputFolder:
    """A folder umsearch writes a set of files into, leaving everything else in it alone.

    Create it before the work starts (the path and every expected name are
    checked then); call :meth:`write` with a function that fills a staging
    folder. ``inputs`` are files the command read: they are never replaced or
    removed. ``last`` names the files renamed into place after all others.
    """

    def __init__(self, path: str | os.PathLike[str], what: str = "--out", *,
                 inputs: Iterable[str | os.PathLike[str]] = (), expected: Iterable[str] = (),
                 last: Iterable[str] = ("plan.json",)) -> None:  # fmt: skip
        self.path = check_output_dir(path, what)
        self.what = what
        self.inputs = [Path(p) for p in inputs]
        self.last = tuple(last)
        self._check(list(expected), self.previous(list(expected)))

    def previous(self, names: Iterable[str] = ()) -> set[str]:
        """What an earlier run wrote here: the manifest's list, or a pre-manifest output's known files."""
        listed = read_manifest(self.path)
        if listed is not None:
            return listed
        if not self.path.is_dir():
            return set()
        known = set(names)
        if (self.path / "baselines").is_dir():
            known |= {f"baselines/{p.name}" for p in (self.path / "baselines").glob("*.json")}
        return _legacy_outputs(self.path, known)

    def _is_input(self, p: Path) -> bool:
        for src in self.inputs:
            with contextlib.suppress(OSError):
                if p.exists() and src.exists() and os.path.samefile(p, src):
                    return True
        return False

    def _conflicts(self, names: list[str], ours: set[str]) -> list[str]:
        """Why each of ``names`` may not be written (a file the user owns, an input, a file where a folder goes)."""
        problems = []
        for name in names:
            dest = self.path / name
            if not _inside(self.path, name):
                problems.append(f"{str(dest.parent)!r} is not a folder of its own (a file or a link) where "
                                "umsearch writes a folder")  # fmt: skip
            elif self._is_input(dest):
                problems.append(f"{str(dest)!r} is an input of this command")
            elif os.path.lexists(dest) and (name not in ours or not _ours(self.path, name)):
                problems.append(f"{str(dest)!r} was not written by umsearch")
        return problems

    def _check(self, names: list[str], ours: set[str]) -> None:
        problems = self._conflicts(names, ours)
        if problems:
            more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
            raise OutputError(f"{self.what} {str(self.path)!r}: {'; '.join(problems[:3])}{more}; move it away or "
                              "choose another folder (umsearch replaces only the files it wrote there, listed in "
                              f"{MANIFEST})")  # fmt: skip

    def clean_staging(self) -> None:
        """Remove staging folders a killed run left: ours inside the folder, older versions' beside it."""
        if self.path.is_dir():
            for p in self.path.glob(STAGING_PREFIX + "*"):
                if p.is_dir() and not p.is_symlink():
                    shutil.rmtree(p, ignore_errors=True)
        parent = self.path.absolute().parent
        with contextlib.suppress(OSError):
            for p in parent.iterdir():
                m = _LEGACY_STAGING.fullmatch(p.name)
                if m and m.group("name") == self.path.name and p.is_dir() and not p.is_symlink() \
                        and _looks_like_legacy_staging(p):  # fmt: skip
                    if (p / "previous").is_dir() and not os.path.lexists(self.path):
                        os.replace(p / "previous", self.path)  # killed mid-swap: the older output comes back
                    shutil.rmtree(p, ignore_errors=True)

    def write(self, fill: Callable[[Path], Any]) -> list[Path]:
        """Call ``fill(stage)`` to write the outputs into a staging folder, then move them into place.

        Order: a manifest listing old and new files (so a kill at any point
        leaves every umsearch file listed), the new files, the removal of stale
        ones from the previous manifest, the ``last`` files, the final manifest.
        Any :class:`OSError` becomes :class:`OutputError`. Returns the paths written.
        """
        try:
            self.clean_staging()
            self.path.mkdir(parents=True, exist_ok=True)
            stage = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=self.path))
        except OSError as exc:
            raise OutputError(f"{self.what} {str(self.path)!r} cannot be written: {exc.strerror}; choose another "
                              "folder") from None  # fmt: skip
        try:
            fill(stage)
            return self._commit(stage)
        except OSError as exc:
            raise OutputError(f"{self.what} {str(self.path)!r} could not be written: {exc.strerror or exc}") from None
        finally:
            shutil.rmtree(stage, ignore_errors=True)

    def _commit(self, stage: Path) -> list[Path]:
        new = _staged_files(stage)
        old = self.previous(new)
        self._check(new, old)
        _write_manifest(self.path, old | set(new))
        ordered = [n for n in new if n not in self.last] + [n for n in new if n in self.last]
        stale = [n for n in sorted(old - set(new)) if _ours(self.path, n) and not self._is_input(self.path / n)]
        for name in ordered:
            if name in self.last:
                for gone in stale:
                    (self.path / gone).unlink(missing_ok=True)
                stale = []
            (self.path / name).parent.mkdir(parents=True, exist_ok=True)
            os.replace(stage / name, self.path / name)
        for gone in stale:
            (self.path / gone).unlink(missing_ok=True)
        _write_manifest(self.path, new)
        return [self.path / n for n in new]


def _looks_like_legacy_staging(p: Path) -> bool:
    """Whether ``p`` holds only what the pre-manifest search put into its staging folders."""
    allowed = {"plan.json", "pareto.json", "baselines.json", "report.md", "pareto.png", "timeline.png", "trace.json",
               "baselines", "previous"}  # fmt: skip
    try:
        return all(child.name in allowed or child.name.endswith(".tmp") for child in p.iterdir())
    except OSError:
        return False
