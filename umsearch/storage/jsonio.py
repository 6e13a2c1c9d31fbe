"""Atomic, versioned JSON files, and the one input layer every file umsearch reads goes through.

Every file umsearch writes goes through :func:`write_json` (temp file in the
same directory, fsync, rename; see :mod:`umsearch.storage.outputs`) so that a
crash or Ctrl-C never leaves half a plan behind. Every file it reads goes
through :func:`read_text` (:func:`read_json`, :func:`read_toml`), which refuses
a bad path, a file that is not a regular UTF-8 file, and content nested too
deep or holding text that is not Unicode, each in one line.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from pathlib import Path
from typing import Any

from umsearch.errors import UmsearchError
from umsearch.storage.outputs import write_output_file
from umsearch.storage.paths import path_text
from umsearch.storage.reading import FileTooLarge, NotRegularFile, read_bounded


def write_text_atomic(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` so readers see the old file or the new one, never a mix.

    See :func:`umsearch.storage.outputs.write_output_file` (a device is written through, never replaced).
    """
    return write_output_file(path, text)


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (:func:`umsearch.storage.outputs.write_output_file`)."""
    return write_output_file(path, data)


def write_json(path: str | os.PathLike[str], obj: Any) -> Path:
    """Serialize ``obj`` (indent 2, trailing newline) and write it atomically."""
    return write_text_atomic(path, json.dumps(obj, indent=2, allow_nan=False) + "\n")


MAX_INPUT_BYTES = 512 * 2**20
"""Largest input file (profile, plan, space) any command reads."""
MAX_JSON_DEPTH = 64
"""Deepest nesting of JSON arrays and objects accepted (a plan or profile needs four)."""


def check_input_path(path: str | os.PathLike[str], what: str, error: type[UmsearchError]) -> Path:
    """``path`` as a :class:`Path`, or ``error`` when no file can have that name.

    Refused before the file system is asked (where they raise ``ValueError`` or
    ``OSError`` instead of answering): an empty path, a NUL byte, text the file
    system cannot encode, a path over :data:`~umsearch.storage.paths.PATH_MAX` bytes or a name
    over 255 bytes. ``what`` names the file in messages (``"profile"``).
    """
    return Path(path_text(path, f"the {what} path", error))


def read_text(path: str | os.PathLike[str], what: str, error: type[UmsearchError]) -> str:
    """The UTF-8 text of a regular file, raising ``error`` with the path and the reason when it cannot.

    The path must pass :func:`check_input_path`. FIFOs, sockets, devices,
    directories and links to them are refused without blocking or reading
    (:func:`umsearch.storage.reading.read_bounded`), and so are files over
    :data:`MAX_INPUT_BYTES`.
    """
    p = check_input_path(path, what, error)
    try:
        data = read_bounded(p, MAX_INPUT_BYTES)
    except FileNotFoundError:
        raise error(f"{what} file {str(p)!r} does not exist; check the path") from None
    except NotRegularFile as exc:
        kind = "a directory" if exc.what == "a folder" else f"{exc.what}, not a regular file"
        raise error(f"{what} path {str(p)!r} is {kind}; give a {what} file") from None
    except FileTooLarge as exc:
        raise error(f"{what} file {str(p)!r} has {exc.size} bytes, over the limit of {MAX_INPUT_BYTES}") from None
    except OSError as exc:
        raise error(f"cannot read {what} file {str(p)!r}: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        bom = " (it starts with a UTF-16 byte-order mark)" if data[:2] in (b"\xff\xfe", b"\xfe\xff") else ""
        raise error(f"{what} file {str(p)!r} is not UTF-8 text{bom}: byte {data[exc.start]:#04x} at offset "
                    f"{exc.start}; save it as UTF-8") from None  # fmt: skip


def _depth(obj: Any, limit: int) -> bool:
    """Whether ``obj`` nests no deeper than ``limit`` (iterative: deep inputs must not recurse).

    Only containers are pushed: a plan's millions of action strings are looked at once, not stacked.
    """
    stack = [(obj, 0)]
    while stack:
        item, d = stack.pop()
        if d > limit:
            return False
        if isinstance(item, dict | list):
            children = item.values() if isinstance(item, dict) else item
            stack.extend([(c, d + 1) for c in children if isinstance(c, dict | list)])
    return True


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
"""The only way JSON text can hold a lone surrogate: an escape in U+D800..U+DFFF (raw bytes would not be UTF-8)."""


def _not_unicode(obj: Any) -> str | None:
    """The first string (key or value) in ``obj`` holding a lone surrogate (JSON's ``"\\ud800"``), else None.

    Such text cannot be written as UTF-8 (a report, a table) or used as a file name.
    """
    stack = [obj]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return item
    return None


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
    bad = _not_unicode(obj) if _SURROGATE_ESCAPE.search(text) else None
    if bad is not None:
        raise error(f"{what} file {str(p)!r} holds the text {ascii(bad)[:80]}, which is not Unicode (a lone "
                    "surrogate escape such as \\ud800); write the character itself")  # fmt: skip
    return obj


def read_toml(path: str | os.PathLike[str], what: str, error: type[UmsearchError]) -> dict[str, Any]:
    """Parse a TOML file, raising ``error`` with the path and the reason when it cannot.

    Beyond :func:`read_text`'s checks: nesting at most :data:`MAX_JSON_DEPTH`
    deep (``tomllib`` recurses, so a file nested 100,000 deep would otherwise
    overflow the stack).
    """
    p = Path(path)
    text = read_text(p, what, error)
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{what} {str(p)!r} is not valid TOML: {exc}") from None
    except RecursionError:
        raise error(f"{what} {str(p)!r} nests deeper than {MAX_JSON_DEPTH} levels; it is no {what}") from None
    if not _depth(doc, MAX_JSON_DEPTH):
        raise error(f"{what} {str(p)!r} nests deeper than {MAX_JSON_DEPTH} levels; it is no {what}")
    return doc
