"""Click options from declared settings (:mod:`umsearch.core.options`): the one adapter every command uses.

``search``'s space keys, ``run``/``validate``'s run settings, ``tune``'s own
knobs and every other flag of every command (:mod:`umsearch.cli.flags`) become
click options here, so a setting has one flag, one help text and one set of
bounds wherever it appears. Each option made here is a :class:`DeclaredOption`
that knows its declaration (``tests/cli/test_options.py`` holds every command
to that).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

import click

from umsearch.core.options import KindRule, Setting, kind_rule
from umsearch.errors import UmsearchError

_CLICK_TYPES: dict[str, Any] = {"int": int, "float": float, "text": str, "file": click.Path(dir_okay=False),
                                "folder": click.Path(file_okay=False)}  # fmt: skip
"""Each :data:`~umsearch.core.options.ValueType` but ``choice`` (made from the setting's choices) as click's type."""


class DeclaredOption(click.Option):
    """A click option made from a declared :class:`~umsearch.core.options.Setting` (:attr:`setting`)."""

    def __init__(self, *args: Any, setting: Setting, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.setting = setting


class _Parsed(click.ParamType):
    """A click type that parses with the setting's own parser (its bounds and messages)."""

    def __init__(self, row: Setting) -> None:
        self.row = row
        self.name = row.option.metavar or row.dest

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str) or self.row.option.parse is None:
            return value  # a default, already a field value
        try:
            return self.row.option.parse(value)
        except (UmsearchError, ValueError) as exc:
            self.fail(str(exc), param, ctx)


def _split(rule: KindRule) -> Callable[[click.Context, click.Parameter, str | None], list[Any] | None]:
    """A callback reading a ``list`` form's comma-separated items with the kind's :attr:`~KindRule.item`."""

    def split(ctx: click.Context, param: click.Parameter, value: str | None) -> list[Any] | None:
        if value is None:
            return None
        try:
            return [rule.item(v.strip()) for v in value.split(",") if v.strip()]
        except ValueError:
            raise click.BadParameter(f"{value!r}: give {rule.items} separated by commas, e.g. 1,2,3") from None

    return split


_Made = Callable[[Setting, KindRule, tuple[str, ...], Any, dict[str, Any]], Callable[[Any], Any]]
"""Makes the click option of a setting (``row``, its kind's rule, its names, its default, the common keywords)."""


def _flag(row: Setting, rule: KindRule, names: tuple[str, ...], default: Any, common: dict[str, Any]) -> Callable[[Any], Any]:  # fmt: skip
    return click.option(*names, row.dest, is_flag=True, default=False, **common)


def _pair(row: Setting, rule: KindRule, names: tuple[str, ...], default: Any, common: dict[str, Any]) -> Callable[[Any], Any]:  # fmt: skip
    return click.option(f"{row.flag}/--no-{row.flag[2:]}", row.dest, default=default, **common)


def _list(row: Setting, rule: KindRule, names: tuple[str, ...], default: Any, common: dict[str, Any]) -> Callable[[Any], Any]:  # fmt: skip
    return click.option(*names, row.dest, callback=_split(rule), default=default,
                        **{**common, "help": common["help"] + rule.items_help})  # fmt: skip


def _value(row: Setting, rule: KindRule, names: tuple[str, ...], default: Any, common: dict[str, Any]) -> Callable[[Any], Any]:  # fmt: skip
    opt = row.option
    multiple = rule.shape == "repeated"
    if opt.parse is not None or multiple:
        return click.option(*names, row.dest, type=_Parsed(row), multiple=multiple, metavar=opt.metavar,
                            default=() if multiple else default,
                            show_default=not multiple and default is not None, **common)  # fmt: skip
    if rule.value_type == "choice":
        return click.option(*names, row.dest, type=click.Choice(list(opt.choices)), default=default,
                            show_default=default is not None, **common)  # fmt: skip
    return click.option(*names, row.dest, type=_CLICK_TYPES[rule.value_type], default=default, metavar=opt.metavar,
                        show_default=default is not None, **common)  # fmt: skip


_FORMS: dict[str, _Made] = {"flag": _flag, "pair": _pair, "list": _list, "value": _value}
"""Each :data:`~umsearch.core.options.Form` of a kind's rule as the click option it makes."""


def click_option(row: Setting, *, default: Any = None, help_suffix: str = "") -> Callable[[Any], Any]:
    """The click option of one setting, in the form its kind's rule says (:data:`~umsearch.core.options.KIND_RULES`).
    ``default`` None leaves the value unset unless given (a search space's keys: the TOML's value stands); a
    settings group passes its field's default."""
    opt, rule = row.option, kind_rule(row.option)
    text = opt.help.replace("`", "") + help_suffix
    common: dict[str, Any] = {"help": text, "hidden": opt.hidden, "cls": DeclaredOption, "setting": row}
    if default is dataclasses.MISSING:
        common["required"], default = True, None
    return _FORMS[rule.form](row, rule, (row.flag, *opt.aliases), default, common)


def click_options(rows: Iterable[Setting], *, defaults: dict[str, Any] | None = None,
                  use_field_defaults: bool = False, help_suffix: Callable[[Setting], str] | None = None,
                  ) -> Callable[[Any], Any]:  # fmt: skip
    """Decorator adding ``rows`` as click options, in order. A row's default: ``defaults[dest]`` if
    given, else its field's default with ``use_field_defaults``, else None (unset)."""
    rows = list(rows)
    defaults = defaults or {}

    def wrap(f: Any) -> Any:
        for row in reversed(rows):
            d = defaults.get(row.dest, row.default if use_field_defaults else None)
            f = click_option(row, default=d, help_suffix=help_suffix(row) if help_suffix else "")(f)
        return f

    return wrap
