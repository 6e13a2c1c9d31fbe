"""Opening a file umsearch reads without surprises: regular files only, within a size bound.

A path given to umsearch, or found in a folder it writes into, may be a FIFO
(opening it for reading blocks until a writer comes), a device (``/dev/zero``
streams forever), a socket, a folder or a link to any of them. Every read goes
through :func:`read_bounded` or :func:`digest`: they open the path
non-blocking, ask the *open file* what it is (so nothing can be swapped in
between a check and the read), and read at most a given number of bytes.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

_CHUNK = 1 << 20


def kind(mode: int) -> str:
    """What a file mode is, in words ("a folder", "a FIFO (named pipe)", "a file", ...)."""
    kinds = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISCHR, "a character device"), (stat.S_ISLNK, "a link"),
             (stat.S_ISREG, "a file"))  # fmt: skip
    return next((word for test, word in kinds if test(mode)), "not a regular file")


class NotRegularFile(OSError):
    """The path is not a regular file; :attr:`what` says what it is instead."""

    def __init__(self, what: str) -> None:
        super().__init__(f"it is {what}, not a regular file")
        self.what = what


class FileTooLarge(OSError):
    """The file holds more bytes than the reader accepts."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"it has {size} bytes, over the limit of {limit}")
        self.size = size
        self.limit = limit


def _open_regular(path: str | os.PathLike[str], follow_links: bool) -> tuple[int, os.stat_result]:
    """A descriptor of the regular file at ``path`` and its status; :class:`NotRegularFile` otherwise.

    Non-blocking, so that a FIFO answers at once; without ``follow_links`` a
    symbolic link is refused as a link.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    if not follow_links:
        try:
            info = os.lstat(path)
        except OSError:
            info = None
        if info is not None and stat.S_ISLNK(info.st_mode):
            raise NotRegularFile("a link")
        flags |= getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        try:  # a socket cannot be opened at all: say what it is rather than ENXIO
            info = os.stat(path) if follow_links else os.lstat(path)
        except OSError:
            raise exc from None
        if not stat.S_ISREG(info.st_mode):
            raise NotRegularFile(kind(info.st_mode)) from None
        raise
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise NotRegularFile(kind(info.st_mode))
    return fd, info


def read_bounded(path: str | os.PathLike[str], limit: int, *, follow_links: bool = True) -> bytes:
    """The bytes of the regular file at ``path``, at most ``limit`` of them.

    Raises :class:`NotRegularFile` (a folder, FIFO, socket, device; a link
    when ``follow_links`` is false), :class:`FileTooLarge` (by its size, or
    when it grew past ``limit`` while being read) or the :class:`OSError` of
    the failed open or read.
    """
    fd, info = _open_regular(path, follow_links)
    try:
        if info.st_size > limit:
            raise FileTooLarge(info.st_size, limit)
        chunks, total = [], 0
        while chunk := os.read(fd, min(_CHUNK, limit + 1 - total)):
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:
                raise FileTooLarge(total, limit)
        return b"".join(chunks)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Content:
    """What a file held: its size in bytes and the SHA-256 of its bytes (hex)."""

    size: int
    sha256: str

    def to_json(self) -> dict[str, int | str]:
        """The manifest's form of it."""
        return {"size": self.size, "sha256": self.sha256}


def digest(path: str | os.PathLike[str], *, follow_links: bool = False) -> Content:
    """The :class:`Content` of the regular file at ``path`` (a link is refused unless ``follow_links``).

    Raises as :func:`read_bounded` does, without a size bound (reads in chunks).
    """
    fd, _ = _open_regular(path, follow_links)
    h, size = hashlib.sha256(), 0
    try:
        while chunk := os.read(fd, _CHUNK):
            h.update(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    return Content(size, h.hexdigest())


def identity(path: Path, *, follow_links: bool = False) -> dict[str, int]:
    """Which folder (or file) ``path`` is, on this machine: its device and inode numbers (of the link
    itself unless ``follow_links``)."""
    info = path.stat() if follow_links else path.lstat()
    return {"device": info.st_dev, "inode": info.st_ino}
