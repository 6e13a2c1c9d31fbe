"""Atomic, versioned JSON files.

Every file umsearch writes goes through :func:`write_json` (temp file in the
same directory, fsync, rename) so that a crash or Ctrl-C never leaves half a
plan behind.
"""

from __future__ import annotations

import json
import os
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


def read_json(path: str | os.PathLike[str], what: str, error: type[UmsearchError]) -> Any:
    """Parse a JSON file, raising ``error`` with the path and the reason when it cannot."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise error(f"{what} file {str(p)!r} does not exist; check the path") from None
    except OSError as exc:
        raise error(f"cannot read {what} file {str(p)!r}: {exc.strerror}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(
            f"{what} file {str(p)!r} is not valid JSON (line {exc.lineno}, column {exc.colno}: "
            f"{exc.msg})"
        ) from None
