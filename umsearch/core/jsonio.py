"""Atomic, versioned JSON files.

Every file umsearch writes goes through :func:`write_json` (temp file in the
same directory, fsync, rename) so that a crash or Ctrl-C never leaves half a
plan behind.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

from umsearch.core.errors import UmsearchError


def write_text_atomic(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` so readers see the old file or the new one, never a mix."""
    return write_bytes_atomic(path, text.encode("utf-8"))


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` via a temp file in the same directory, fsync and rename."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        os.fchmod(fd, 0o644)  # mkstemp creates 0600; outputs are meant to be shared
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def write_json(path: str | os.PathLike[str], obj: Any) -> Path:
    """Serialize ``obj`` (indent 2, trailing newline) and write it atomically."""
    return write_text_atomic(path, json.dumps(obj, indent=2, allow_nan=False) + "\n")


MAX_INPUT_BYTES = 512 * 2**20
"""Largest input file (profile, plan, space) any command reads."""
MAX_JSON_DEPTH = 64
"""Deepest nesting of JSON arrays and objects accepted (a plan or profile needs four)."""


def read_text(path: str | os.PathLike[str], what: str, error: type[UmsearchError]) -> str:
    """The UTF-8 text of a regular file, raising ``error`` with the path and the reason when it cannot.

    FIFOs, devices and directories are refused before opening (reading a FIFO
    would block forever), and so are files over :data:`MAX_INPUT_BYTES`.
    """
    p = Path(path)
    try:
        info = p.stat()
    except FileNotFoundError:
        raise error(f"{what} file {str(p)!r} does not exist; check the path") from None
    except OSError as exc:
        raise error(f"cannot read {what} file {str(p)!r}: {exc.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        kind = "a directory" if stat.S_ISDIR(info.st_mode) else "not a regular file"
        raise error(f"{what} path {str(p)!r} is {kind}; give a {what} file")
    if info.st_size > MAX_INPUT_BYTES:
        raise error(f"{what} file {str(p)!r} has {info.st_size} bytes, over the limit of {MAX_INPUT_BYTES}")
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise error(f"cannot read {what} file {str(p)!r}: {exc.strerror}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        bom = " (it starts with a UTF-16 byte-order mark)" if data[:2] in (b"\xff\xfe", b"\xfe\xff") else ""
        raise error(f"{what} file {str(p)!r} is not UTF-8 text{bom}: byte {data[exc.start]:#04x} at offset "
                    f"{exc.start}; save it as UTF-8") from None  # fmt: skip


def _depth(obj: Any, limit: int) -> bool:
    """Whether ``obj`` nests no deeper than ``limit`` (iterative: deep inputs must not recurse)."""
    stack = [(obj, 0)]
    while stack:
        item, d = stack.pop()
        if d > limit:
            return False
        if isinstance(item, dict):
            stack.extend((v, d + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, d + 1) for v in item)
    return True


def read_json(path: str | os.PathLike[str], what: str, error: type[UmsearchError]) -> Any:
    """Parse a JSON file, raising ``error`` with the path and the reason when it cannot.

    Beyond :func:`read_text`'s checks: strict JSON (no ``NaN``/``Infinity``),
    nesting at most :data:`MAX_JSON_DEPTH` deep.
    """
    p = Path(path)
    text = read_text(p, what, error)

    def no_constants(name: str) -> Any:
        raise ValueError(f"{name} is not JSON; write a number or null")

    try:
        obj = json.loads(text, parse_constant=no_constants)
    except json.JSONDecodeError as exc:
        raise error(
            f"{what} file {str(p)!r} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
        ) from None
    except RecursionError:
        raise error(f"{what} file {str(p)!r} nests deeper than {MAX_JSON_DEPTH} levels; it is no {what}") from None
    except ValueError as exc:
        raise error(f"{what} file {str(p)!r}: {exc}") from None
    if not _depth(obj, MAX_JSON_DEPTH):
        raise error(f"{what} file {str(p)!r} nests deeper than {MAX_JSON_DEPTH} levels; it is no {what}")
    return obj
