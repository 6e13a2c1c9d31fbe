"""Progress of a long command wherever it runs: rich bars on a terminal, plain lines in a log, or nothing.

``--progress`` (:func:`progress_option`, on ``profile``, ``calibrate``, ``search``, ``tune`` and
``run``) picks the mode. ``auto`` is bars when stderr is a terminal, else lines, so that a batch
job (Slurm, nohup, CI) logs its progress too; with ``--json`` or ``--quiet`` it is none, as before.
Bars and lines both go to stderr: stdout (a JSON summary) stays clean.

A line says what step just finished, how long the command has run and, when the total is known,
about how long the rest takes at the phase's rate so far::

    [profile] 12/40 timing round 3 · elapsed 0:41 · about 1:35 left

At most one line is printed every :data:`INTERVAL_S` seconds, except a phase's last step, so a
100,000-step search does not flood a log.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from umsearch.cli.console import err_console, one_line
from umsearch.cli.flags import PROGRESS_MODES, shared

MODES = PROGRESS_MODES
"""The ``--progress`` choices."""
INTERVAL_S = 2.0
"""Fewest seconds between two lines (a phase's last step is always printed)."""
CLOCK: Callable[[], float] = time.monotonic
"""The clock a :class:`Reporter` reads unless given one (tests replace it)."""


progress_option: Callable[[Any], Any] = shared("progress")
"""Decorator: the ``--progress`` flag (passed to the command as ``progress``), the same on every command."""


def resolve(mode: str, *, quiet: bool = False, stream: Any = None) -> str:
    """``bars``, ``lines`` or ``none`` for ``mode``: a stated mode as it is; ``auto`` none when ``quiet``
    (``--json``, ``--quiet``), else bars when ``stream`` (default stderr) is a terminal, else lines."""
    if mode not in MODES:
        raise ValueError(f"progress mode {mode!r} is not one of {', '.join(MODES)}")
    if mode != "auto":
        return mode
    if quiet:
        return "none"
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    return "bars" if isatty is not None and isatty() else "lines"


def duration(seconds: float) -> str:
    """``seconds`` as ``m:ss``, or ``h:mm:ss`` from an hour on (rounded down to the second)."""
    s = max(0, int(seconds))
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def progress_line(label: str, done: int, total: int | None, what: str, *, info: str = "", elapsed_s: float,
                  left_s: float | None = None) -> str:  # fmt: skip
    """One progress line: ``[label] done/total what · info · elapsed m:ss · about m:ss left`` (no ``/total``
    when it is unknown, no info when empty, no estimate when ``left_s`` is None), always on one line."""
    count = f"{done}" if total is None else f"{done}/{total}"
    parts = [one_line(f"[{label}] {count} {what}")]
    if info:
        parts.append(one_line(info))
    parts.append(f"elapsed {duration(elapsed_s)}")
    if left_s is not None:
        parts.append(f"about {duration(left_s)} left")
    return " · ".join(parts)


def _stderr(text: str) -> None:
    sys.stderr.write(text + "\n")  # looked up now: the stream of the moment (tests capture it)
    sys.stderr.flush()


class Reporter:
    """One command's progress in a ``with`` block: :meth:`update` (or :meth:`advance`) after each step.

    Steps belong to phases (``phase``; one phase unless given): in bars mode each phase is a bar of
    its own; in lines mode the estimate of what remains is the current phase's rate so far (a phase
    starts when the previous one's last update came). ``mode`` is a ``--progress`` value, resolved
    by :func:`resolve` with ``quiet``.
    """

    def __init__(self, mode: str, label: str, *, quiet: bool = False, clock: Callable[[], float] | None = None,
                 write: Callable[[str], None] | None = None, interval_s: float = INTERVAL_S,
                 transient: bool = True) -> None:  # fmt: skip
        self.mode = resolve(mode, quiet=quiet)
        self.label = label
        self.clock = clock if clock is not None else CLOCK
        self.write = write if write is not None else _stderr
        self.interval_s = interval_s
        self.transient = transient
        self.done = 0
        self._bars: Progress | None = None
        self._tasks: dict[str, TaskID] = {}
        self._start = self._last = self._phase_start = self.clock()
        self._phase: str | None = None
        self._printed: float | None = None

    def __enter__(self) -> Reporter:
        self._start = self._last = self._phase_start = self.clock()
        if self.mode == "bars":
            self._bars = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                  TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=err_console,
                                  transient=self.transient)  # fmt: skip
            self._bars.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._bars is not None:
            self._bars.stop()
            self._bars = None

    def update(self, done: int, total: int | None, what: str, *, info: str = "", phase: str = "") -> None:
        """Step ``done`` of ``total`` (None: unknown) of ``phase`` is finished; ``what`` says what it was.

        Lines mode prints a line unless one was printed less than ``interval_s`` ago and this is not
        the phase's last step (``done == total``)."""
        now = self.clock()
        if phase != self._phase:
            self._phase, self._phase_start = phase, self._last
        self._last, self.done = now, done
        if self._bars is not None:
            if phase not in self._tasks:
                self._tasks[phase] = self._bars.add_task("", total=total, info="")
            self._bars.update(self._tasks[phase], completed=done, total=total, description=escape(what),
                              info=escape(info))  # fmt: skip
        if self.mode != "lines":
            return
        if done != total and self._printed is not None and now - self._printed < self.interval_s:
            return
        self._printed = now
        self.write(progress_line(self.label, done, total, what, info=info, elapsed_s=now - self._start,
                                 left_s=self.left_s(done, total, now)))  # fmt: skip

    def advance(self, what: str, *, total: int | None = None, info: str = "", phase: str = "") -> None:
        """One more step done: :meth:`update` with ``done`` one above the last."""
        self.update(self.done + 1, total, what, info=info, phase=phase)

    def left_s(self, done: int, total: int | None, now: float) -> float | None:
        """Seconds the phase's remaining steps take at its rate so far (None: total unknown, nothing done
        yet, all done, or no time gone by to have a rate)."""
        if total is None or done <= 0 or done >= total or now <= self._phase_start:
            return None
        return (now - self._phase_start) * (total - done) / done
