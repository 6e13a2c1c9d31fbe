"""The console script's first instructions: stop signals are handled before anything heavy is imported.

Importing the commands (click, rich, numpy, sometimes torch) takes long enough
for a batch system's SIGTERM or a Ctrl-C to land in it. From here on SIGTERM
and SIGHUP raise :class:`~umsearch.errors.Interrupted` (a
``KeyboardInterrupt``), as Ctrl-C raises ``KeyboardInterrupt``: a long command
stops and keeps its work, and every command exits with 128 + the signal
(SIGTERM 143, Ctrl-C 130) and one line, never killed by the signal itself and
never with a traceback. Only the standard library is imported here.
"""

from __future__ import annotations

import signal
import sys
from types import FrameType

_STOPPING = (signal.SIGTERM, signal.SIGHUP)


def _raise(signum: int, frame: FrameType | None) -> None:
    from umsearch.errors import Interrupted

    raise Interrupted(signum)


def main(argv: list[str] | None = None) -> None:
    """The ``umsearch`` command: signals handled first, then the CLI (:func:`umsearch.cli.main.main`)."""
    for s in _STOPPING:
        signal.signal(s, _raise)
    try:
        from umsearch.cli.main import main as cli_main
    except KeyboardInterrupt as exc:
        from umsearch.cli.interrupts import exit_code

        sys.stderr.write("error: interrupted while starting\n")
        sys.exit(exit_code(exc))
    cli_main(argv)
