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

What each kind of value means is said once, in :data:`KIND_RULES` (the one
switch on :attr:`Option.kind`): how a command line takes it
(:attr:`KindRule.shape`, and the form of its click option,
:attr:`KindRule.form`), what a parsed flag makes of the field
(:meth:`KindRule.field_value`), how a value is written back as flags
(:meth:`KindRule.argv`) and what a value of it must be (:func:`check_value`,
for a value already decoded: a TOML value, a flag's parsed text). No other
module compares a kind with a literal (``tests/core/test_options.py``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator, Mapping
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
    """Flag text to value, raising ``ValueError`` (or a :class:`~umsearch.errors.UmsearchError`) with the fix."""
    show: Callable[[Any], str] = str
    """Value to flag text that :attr:`parse` reads back to the same value."""
    invert: bool = False
    """For a ``switch``: present sets the field to False (``--no-pin-cores``)."""
    scope: Scope = "ranks"
    """For run settings: ``ranks`` travel to every rank's entry point; ``launcher`` stay with ``umsearch run``."""
    hidden: bool = False
    """Left out of ``--help``."""


Shape = Literal["switch", "repeated", "value"]
"""How a command line takes a setting: present or not, a flag given any number of times, or once with a value."""

Form = Literal["flag", "pair", "list", "value"]
"""The form of a click option (:mod:`umsearch.cli.options`): a flag present or not, a ``--x/--no-x`` pair, one
comma-separated value of several items, or a value (repeatable for the ``repeated`` shape)."""

ValueType = Literal["int", "float", "text", "file", "folder", "choice"]
"""What a ``value`` form takes when its setting has no parser of its own: a number, text, a file's or a folder's
path, one of the setting's choices."""


def _int(opt: Option, v: Any, key: str) -> int:
    lo, hi = (int(opt.bounds[0]), int(opt.bounds[1])) if opt.bounds is not None else (0, 2**31 - 1)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ValueError(f"{key} = {v!r}: must be an integer from {lo} to {hi}")
    return v


def _positive(opt: Option, v: Any, key: str) -> float:
    hi = opt.bounds[1] if opt.bounds is not None else math.inf
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or not 0 < v <= hi:
        raise ValueError(f"{key} = {v!r}: must be a finite positive number up to {hi:g}")
    return float(v)


def _bool(opt: Option, v: Any, key: str) -> bool:
    if not isinstance(v, bool):
        raise ValueError(f"{key} = {v!r}: use true or false")
    return v


def _choice(opt: Option, v: Any, key: str) -> Any:
    if v not in opt.choices:
        raise ValueError(f"{key} = {v!r}: use {', '.join(map(repr, opt.choices))}")
    return v


def _ints(opt: Option, v: Any, key: str) -> tuple[int, ...]:
    items = v if isinstance(v, list | tuple) else [v]
    if not items:
        raise ValueError(f"{key} = {v!r}: give at least one value, e.g. [1, 2]")
    return tuple(sorted({_int(opt, x, key) for x in items}))


def _names(opt: Option, v: Any, key: str) -> tuple[str, ...]:
    items = v if isinstance(v, list | tuple) else [v]
    for p in items:
        if p not in opt.choices:
            raise ValueError(f"{key} names {p!r}; known: {', '.join(opt.choices)}")
    return tuple(dict.fromkeys(items))


def _text(what: str) -> Callable[[Option, Any, str], str]:
    def check(opt: Option, v: Any, key: str) -> str:
        if not isinstance(v, str):
            raise ValueError(f"{key} = {v!r}: must be a {what}string")
        return v

    return check


def _as_given(opt: Option, v: Any, key: str) -> Any:
    return v


@dataclass(frozen=True)
class KindRule:
    """What one :data:`ValueKind` means wherever a setting is taken."""

    shape: Shape
    """How a command line takes it."""
    check: Callable[[Option, Any, str], Any] | None
    """A decoded value to the field's value, raising ValueError with the key and the fix; None: the
    parser of the settings that declare it (``size``, ``link``: their forms are the search space's)."""
    form: Form = "value"
    """The form of its click option."""
    value_type: ValueType = "text"
    """A ``value`` form's type without a parser of the setting's own."""
    item: Callable[[str], Any] = str
    """A ``list`` form's item from its text (raising ValueError)."""
    items: str = ""
    """A ``list`` form: what its items are, for errors (``integers``)."""
    items_help: str = ""
    """A ``list`` form: what its help adds (``, e.g. 1,2``)."""

    def field_value(self, opt: Option, raw: Any) -> Any:
        """The field value of what a parser gave (a parsed value, a switch's presence, a repeated flag's list)."""
        if self.shape == "switch":
            return bool(raw) != opt.invert
        if self.shape == "repeated":
            return tuple(raw or ())
        return raw

    def argv(self, row: Setting, value: Any) -> list[str]:
        """``value`` of ``row`` as flags, every value explicit; absent values (None where that is the default,
        an empty list, a switch off) left out."""
        opt = row.option
        if self.shape == "switch":
            return [row.flag] if value is (not opt.invert) else []
        if self.shape == "repeated":
            return [f"{row.flag}={opt.show(v)}" for v in value]
        # None is absent only where it is the default (--threads 0 means None, default 1).
        return [f"{row.flag}={opt.show(value)}"] if value is not None or row.default is not None else []


KIND_RULES: dict[str, KindRule] = {
    "int": KindRule("value", _int, value_type="int"), "float": KindRule("value", _positive, value_type="float"),
    "bool": KindRule("value", _bool, form="pair"), "choice": KindRule("value", _choice, value_type="choice"),
    "ints": KindRule("value", _ints, form="list", item=int, items="integers", items_help=", e.g. 1,2"),
    "names": KindRule("value", _names, form="list", items="names", items_help=", comma-separated"),
    "text": KindRule("value", _text("")), "path": KindRule("value", _text("path "), value_type="file"),
    "folder": KindRule("value", _text(""), value_type="folder"), "size": KindRule("value", None),
    "link": KindRule("value", None), "switch": KindRule("switch", _bool, form="flag"),
    "multiple": KindRule("repeated", _as_given),
}  # fmt: skip
"""The one switch on :attr:`Option.kind`: every :data:`ValueKind`'s :class:`KindRule`."""
assert set(KIND_RULES) == set(ValueKind.__args__)  # type: ignore[attr-defined]


def kind_rule(opt: Option) -> KindRule:
    """:data:`KIND_RULES`' rule of ``opt``'s kind."""
    return KIND_RULES[opt.kind]


def check_value(opt: Option, value: Any, key: str, error: type[Exception],
                parsers: Mapping[str, Callable[[Any, str], Any]] | None = None) -> Any:  # fmt: skip
    """``value`` (decoded: a TOML value, a flag's parsed text) as the field's value of ``opt``, or ``error``
    naming ``key``, the value and the fix. ``parsers``: by kind, the parsers (value, key) of the kinds
    whose forms their settings define (:attr:`KindRule.check` None)."""
    check = kind_rule(opt).check
    if check is None:
        parse = (parsers or {}).get(opt.kind)
        if parse is None:
            raise TypeError(f"{key}: a {opt.kind} value needs its parser")
        return parse(value, key)
    try:
        return check(opt, value, key)
    except ValueError as exc:
        raise error(str(exc)) from None


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
        if kind_rule(opt).value_type == "choice" and value not in opt.choices:
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
