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

A set of files written into a folder the user may share with files of their
own goes through :class:`umsearch.storage.output_folder.OutputFolder`.
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Iterable
from pathlib import Path

from umsearch.errors import OutputError
from umsearch.storage.paths import path_text
from umsearch.storage.reading import kind


def _path_text(path: str | os.PathLike[str], what: str) -> str:
    """``path`` as text after the checks every path gets (:func:`umsearch.storage.paths.path_text`)."""
    return path_text(path, what, OutputError)


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
            raise OutputError(f"{what} {text!r} cannot be written: {str(parent)!r} is {kind(info.st_mode)}, "
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

    Refused: an empty path, a NUL byte, a name over :data:`~umsearch.storage.paths.NAME_MAX` or a path
    over :data:`~umsearch.storage.paths.PATH_MAX` bytes, a file (not a folder) above it, an existing
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
            raise OutputError(f"{what} {text!r} is {kind(info.st_mode)}; umsearch writes regular files (or "
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
        raise OutputError(f"{what} {text!r} is {kind(info.st_mode)}, not a folder; give a folder")
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


def replace_atomically(target: Path, data: bytes) -> None:
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
            replace_atomically(target, raw)
    except OSError as exc:
        raise OutputWriteError(what, str(p), str(exc.strerror or exc)) from None
    except UnicodeEncodeError as exc:  # text from an input the input layer let through: a bug, said in one line
        raise OutputWriteError(what, str(p), f"the text holds {exc.object[exc.start:exc.end]!a}, which is not "
                               "Unicode") from None  # fmt: skip
    return p
