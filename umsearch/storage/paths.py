"""The one check every path a command is given gets, input or output, before the file system sees it.

The file system answers some names with ``ValueError`` or ``OSError`` (a NUL byte, text it cannot
encode, a name or path over its limits) instead of a reason a user can act on; these are refused here,
in one line that names the path and the fix.
"""

from __future__ import annotations

import os

from umsearch.errors import UmsearchError

NAME_MAX = 255
"""Longest file or folder name, in bytes (Linux, macOS)."""
PATH_MAX = 4096
"""Longest path, in bytes (Linux's PATH_MAX)."""


def shown_path(text: str, limit: int = 80) -> str:
    """``text`` quoted for a message, cut to ``limit`` characters (a 100,000-character path is not echoed)."""
    return repr(text) if len(text) <= limit else f"{text[:limit]!r}... ({len(text)} characters)"


def path_text(path: str | os.PathLike[str], subject: str, error: type[UmsearchError]) -> str:
    """``path`` as text, or ``error`` when no file can have that name: empty, a NUL byte, not encodable,
    a path over :data:`PATH_MAX` or a name over :data:`NAME_MAX` bytes. ``subject`` starts the message
    (``"the profile path"``, ``"--gantt"``)."""
    text = os.fsdecode(path)
    if text == "":
        raise error(f"{subject} is an empty path; give a path")
    shown = shown_path(text)
    if "\0" in text:
        raise error(f"{subject} {shown} contains a NUL byte; give a path without one")
    try:
        raw = os.fsencode(text)
    except UnicodeEncodeError:
        raise error(f"{subject} {shown} cannot be encoded as a file name; use plain characters") from None
    if len(raw) > PATH_MAX:
        raise error(f"{subject} {shown} is too long ({len(raw)} bytes, over the limit of {PATH_MAX}); give a "
                    "shorter path")  # fmt: skip
    longest = max(raw.split(b"/"), key=len)
    if len(longest) > NAME_MAX:
        raise error(f"{subject} {shown}: a name in it is {len(longest)} bytes long, over the limit of {NAME_MAX}; "
                    "give a shorter name")  # fmt: skip
    return text
