"""The ``umsearch`` command: one thin click module per command over the library (:mod:`umsearch.cli.main`);
the console script starts at :func:`umsearch.cli.entry.main`, which handles stop signals first."""

from umsearch.cli.entry import main

__all__ = ["main"]
