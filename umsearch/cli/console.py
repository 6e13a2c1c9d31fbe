"""Terminal output shared by the CLI commands: one rich console, one way to fail."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any, NoReturn

from rich.console import Console
from rich.text import Text

from umsearch.errors import OutputError
from umsearch.storage.outputs import OutputWriteError, check_output_file

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)


def debug_enabled() -> bool:
    """Tracebacks are shown only with ``UMSEARCH_DEBUG=1``."""
    return os.environ.get("UMSEARCH_DEBUG", "") not in ("", "0")


def one_line(text: str) -> str:
    """``text`` on one line (runs of whitespace, newlines included, become one space)."""
    return " ".join(str(text).split())


def warn(*lines: str) -> None:
    """Print each line to stderr after a yellow ``warning:`` (text, not markup, as :func:`abort`)."""
    for line in lines:
        err_console.print(Text.assemble(("warning:", "bold yellow"), " ", line), soft_wrap=True)


def abort(message: str, code: int = 1) -> NoReturn:
    """Print one red line to stderr and exit with ``code``: the CLI's only failure path."""
    # Text, not markup: messages quote paths and rank errors ("runs/[/b].json", "[/.../pair.cc:553]")
    # that rich would parse as tags.
    err_console.print(Text.assemble(("error:", "bold red"), " ", one_line(message)), soft_wrap=True)
    sys.exit(code)


def write_output(path: str, flag: str, write: Callable[[str], Any]) -> None:
    """``write(path)`` (a writer going through :func:`umsearch.storage.outputs.write_output_file`), with
    ``path`` checked first under ``flag``'s name and a failure as one line, nothing partial left."""
    check_output_file(path, flag)
    try:
        write(path)
    except OutputWriteError as exc:
        raise OutputError(f"{flag} {path!r} could not be written: {exc.reason}; nothing was left there") from None
    except OSError as exc:
        raise OutputError(f"{flag} {path!r} could not be written: {exc.strerror or exc}; nothing was "
                          "left there") from None  # fmt: skip
