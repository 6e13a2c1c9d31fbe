"""Terminal output shared by the CLI commands: one rich console, one way to fail."""

from __future__ import annotations

import os
import sys
from typing import NoReturn

from rich.console import Console

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)


def debug_enabled() -> bool:
    """Tracebacks are shown only with ``UMSEARCH_DEBUG=1``."""
    return os.environ.get("UMSEARCH_DEBUG", "") not in ("", "0")


def abort(message: str, code: int = 1) -> NoReturn:
    """Print one red line to stderr and exit with ``code``: the CLI's only failure path."""
    err_console.print(f"[bold red]error:[/] {message}", markup=True, soft_wrap=True)
    sys.exit(code)
