"""The flags several commands share, declared once (:mod:`umsearch.core.options`), and how a command takes them.

A command's flags come from declarations only: the settings groups
(:mod:`umsearch.search.space`, :mod:`umsearch.runtime.config`,
:class:`~umsearch.orchestrate.tune.TuneConfig`), the shared flags of
:class:`Shared` here, and a keyword-only dataclass of its own flags beside the
command (``ExportFlags`` in :mod:`umsearch.cli.export`, ...). :func:`take`
turns chosen declarations into click options with their defaults, through the
one adapter :mod:`umsearch.cli.options`. So ``--json`` has one help text
everywhere, and ``--threads`` one bound (the run's).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from umsearch.cli.options import click_options
from umsearch.core.options import Setting, float_in, option, settings
from umsearch.runtime.config import LaunchConfig, ModelChoice

PROGRESS_MODES = ("auto", "bars", "lines", "none")
"""The ``--progress`` choices."""


@dataclass(frozen=True, kw_only=True)
class Shared:
    """Flags that mean the same on every command that takes them. Output paths are text here: each command
    checks its own before any work, with the way out (:mod:`umsearch.storage.outputs`)."""

    as_json: bool = field(default=False, metadata=option(
        "Print the command's result as one JSON object instead of tables.", kind="switch", flag="--json"))
    quiet: bool = field(default=False, metadata=option(
        "Print only the summary line and the files written.", kind="switch"))
    progress: str = field(default="auto", metadata=option(
        "How to show progress: bars; lines (one plain line per finished step on stderr, at most one every 2 s, for "
        "logs and batch jobs); none. auto: bars when stderr is a terminal, else lines (none with --json or --quiet).",
        kind="choice", choices=PROGRESS_MODES))
    state_factor: float | None = field(default=None, metadata=option(
        "Bytes of state per parameter byte (default: the plan's, else 4).", kind="float",
        parse=float_in("--state-factor", 0.0, 1e6, lo_open=True), metavar="X"))
    gantt: str | None = field(default=None, metadata=option(
        "Write the predicted timeline as a Gantt chart PNG here.", kind="text", metavar="FILE.png"))
    trace: str | None = field(default=None, metadata=option(
        "Write the timeline as Chrome-trace JSON here (open in https://ui.perfetto.dev).", kind="text",
        metavar="FILE.json"))


def rows(owner: type, *dests: str) -> list[Setting]:
    """The declared fields ``dests`` of the dataclass ``owner`` (all of them when none are named), in the
    order given."""
    declared = {row.dest: row for row in settings(owner)}
    if not dests:
        return list(declared.values())
    missing = [d for d in dests if d not in declared]
    if missing:
        raise KeyError(f"{owner.__name__} declares no {', '.join(missing)}")
    return [declared[d] for d in dests]


SHARED: dict[str, Setting] = {row.dest: row for row in (*settings(Shared), *settings(ModelChoice),
                                                          *rows(LaunchConfig, "threads"))}  # fmt: skip
"""The shared declarations by their ``dest``: :class:`Shared`'s, and the run's flags other commands take as they
are (``--profile``, ``--model``, ``--arg``, ``--trust-model-code``, ``--threads``)."""


def take(chosen: Iterable[Setting], *, defaults: dict[str, Any] | None = None,
         help_suffix: Callable[[Setting], str] | None = None) -> Callable[[Any], Any]:  # fmt: skip
    """Decorator: ``chosen`` as click options, each with its field's default unless ``defaults`` says
    otherwise for this command."""
    return click_options(chosen, defaults=defaults, use_field_defaults=True, help_suffix=help_suffix)


def shared(*dests: str, defaults: dict[str, Any] | None = None) -> Callable[[Any], Any]:
    """Decorator: the shared flags ``dests`` (:data:`SHARED`) as click options."""
    return take([SHARED[d] for d in dests], defaults=defaults)
