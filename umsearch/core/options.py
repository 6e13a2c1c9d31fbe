"""The one way a setting is declared: a dataclass field whose metadata is an :class:`Option`.

A setting (a search-space key, a run flag, a tune knob) is a field of a
keyword-only dataclass, one per TOML table or settings group, documented once
by its :class:`Option`: the help text, the kind of value, its bounds or
choices, and its flag. Everything else is generated from those fields, so it
cannot disagree with them: the search space's TOML checks
(:mod:`umsearch.search.space`), the click options of every command
(:mod:`umsearch.cli.options`), the torchrun entry point's argparse flags
(:mod:`umsearch.runtime.torchrun`) and the key table of ``search_spaces/README.md``.

A flag is named after its key (``time_budget_s`` is ``--time-budget-s``)
unless the key alone says too little (``[microbatch] max`` is
``--microbatch-max``); the older spellings stay accepted as aliases. A field
without a default is a required flag.

Flags that are no setting of a TOML table or settings group (``--json``,
``--out``, a command's own switches) are declared the same way, in
:mod:`umsearch.cli.flags` or beside their command: every flag of every
command comes from a declaration.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

ValueKind = Literal["text", "path", "folder", "int", "float", "size", "bool", "choice", "ints", "names", "link",
                   "switch", "multiple"]  # fmt: skip
"""``switch``: a flag present or not; ``multiple``: a repeatable flag (a tuple); ``path``: a file's path;
``folder``: a folder's; the rest: one value."""
Scope = Literal["ranks", "launcher"]


@dataclass(frozen=True, kw_only=True)
class Option:
    """How one setting is documented, bounded and spelled on a command line."""

    help: str
    """One sentence for ``--help`` and the documentation's tables."""
    kind: ValueKind
    """What value it takes (see :data:`ValueKind`)."""
    dest: str | None = None
    """Its name among flat values (click's parameter, a search space's flattened keys); default: the field's name."""
    flag: str | None = None
    """The flag; default ``--`` and :attr:`dest` with dashes."""
    aliases: tuple[str, ...] = ()
    """Older flag spellings still accepted."""
    bounds: tuple[float, float] | None = None
    """Inclusive bounds of a number (or of each number of ``ints``)."""
    choices: tuple[str, ...] = ()
    """Allowed values of a ``choice`` (or ``names``)."""
    default_doc: str | None = None
    """The default as documentation shows it, when not the value itself (``required``, ``B``)."""
    metavar: str | None = None
    """Placeholder in ``--help``."""
    parse: Callable[[str], Any] | None = None
    """Flag text to value, raising ``ValueError`` (or a :class:`~umsearch.core.errors.UmsearchError`) with the fix."""
    show: Callable[[Any], str] = str
    """Value to flag text that :attr:`parse` reads back to the same value."""
    invert: bool = False
    """For a ``switch``: present sets the field to False (``--no-pin-cores``)."""
    scope: Scope = "ranks"
    """For run settings: ``ranks`` travel to every rank's entry point; ``launcher`` stay with ``umsearch run``."""
    hidden: bool = False
    """Left out of ``--help``."""


def option(help: str, **kw: Any) -> dict[str, Option]:
    """Field metadata declaring a setting: ``field(default=..., metadata=option("...", kind="int", ...))``."""
    return {"option": Option(help=help, **kw)}


@dataclass(frozen=True)
class Setting:
    """One declared field: its dataclass, the field, and its :class:`Option` with names filled in."""

    owner: type
    field: dataclasses.Field[Any]
    option: Option

    @property
    def dest(self) -> str:
        return self.option.dest or self.field.name

    @property
    def flag(self) -> str:
        return self.option.flag or "--" + self.dest.replace("_", "-")

    @property
    def default(self) -> Any:
        """The field's default (``dataclasses.MISSING`` when it has none)."""
        f = self.field
        if f.default is not dataclasses.MISSING:
            return f.default
        if f.default_factory is not dataclasses.MISSING:
            return f.default_factory()
        return dataclasses.MISSING


def settings(owner: type) -> Iterator[Setting]:
    """Every declared field of the dataclass ``owner``, in order (fields without an :class:`Option` skipped)."""
    for f in dataclasses.fields(owner):
        opt = f.metadata.get("option")
        if isinstance(opt, Option):
            yield Setting(owner, f, opt)


def check_bounds(instance: Any, error: type[Exception]) -> None:
    """Raise ``error`` naming the flag, the value and the bounds for the first declared field of the
    dataclass ``instance`` outside its :attr:`Option.bounds` (or choices)."""
    for row in settings(type(instance)):
        value, opt = getattr(instance, row.field.name), row.option
        if opt.bounds is not None and isinstance(value, int | float) and not opt.bounds[0] <= value <= opt.bounds[1]:
            lo, hi = opt.bounds
            raise error(f"{row.flag} {value}: must be from {lo:g} to {hi:g}")
        if opt.kind == "choice" and value not in opt.choices:
            raise error(f"{row.flag} {value!r}: use one of {', '.join(opt.choices)}")


def int_at_least(lo: int, name: str) -> Callable[[str], int]:
    """A parser of integers ``>= lo``; messages name ``name``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"{name} takes an integer, got {text!r}") from None
        if value < lo:
            raise ValueError(f"{name} must be at least {lo}, got {value}")
        return value

    return parse


def int_in(name: str, lo: int, hi: int) -> Callable[[str], int]:
    """A parser of integers from ``lo`` to ``hi``; messages name ``name``."""
    at_least = int_at_least(lo, name)

    def parse(text: str) -> int:
        value = at_least(text)
        if value > hi:
            raise ValueError(f"{name} must be at most {hi}, got {value}")
        return value

    return parse


def float_in(name: str, lo: float, hi: float, *, lo_open: bool = False) -> Callable[[str], float]:
    """A parser of finite numbers in ``[lo, hi]`` (``(lo, hi]`` with ``lo_open``); messages name ``name``."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"{name} takes a number, got {text!r}") from None
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"{name} must be a finite number, got {text}")
        if value < lo or (lo_open and value == lo) or value > hi:
            if hi == float("inf"):
                need = "a positive finite number" if lo_open and lo == 0 else f"{lo:g} or more"
            else:
                need = f"{'above' if lo_open else 'from'} {lo:g} to {hi:g}"
            raise ValueError(f"{name} must be {need}, got {text}")
        return value

    return parse


def one_of(name: str, choices: tuple[str, ...]) -> Callable[[str], str]:
    """A parser accepting one of ``choices``; messages name ``name``."""

    def parse(text: str) -> str:
        if text not in choices:
            raise ValueError(f"{name} takes one of {', '.join(choices)}, got {text!r}")
        return text

    return parse


def nonempty(name: str) -> Callable[[str], str]:
    """A parser of non-empty text; messages name ``name``."""

    def parse(text: str) -> str:
        if not text:
            raise ValueError(f"{name} takes a non-empty value")
        return text

    return parse
