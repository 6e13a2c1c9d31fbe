"""The ``umsearch`` command: one thin click module per command over the library."""

from umsearch.cli.main import main

__all__ = ["main"]
