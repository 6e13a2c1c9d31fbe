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

from umsearch.core.options import Setting
from umsearch.errors import UmsearchError

_CLICK_TYPES: dict[str, Any] = {"int": int, "float": float, "size": str, "text": str, "link": str,
                                "path": click.Path(dir_okay=False), "folder": click.Path(file_okay=False)}  # fmt: skip


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


def _int_list(ctx: click.Context, param: click.Parameter, value: str | None) -> list[int] | None:
    if value is None:
        return None
    try:
        return [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(f"{value!r}: give integers separated by commas, e.g. 1,2,3") from None


def _names(ctx: click.Context, param: click.Parameter, value: str | None) -> list[str] | None:
    return None if value is None else [v.strip() for v in value.split(",") if v.strip()]


def click_option(row: Setting, *, default: Any = None, help_suffix: str = "") -> Callable[[Any], Any]:
    """The click option of one setting. ``default`` None leaves the value unset unless given (a search
    space's keys: the TOML's value stands); a settings group passes its field's default."""
    opt, names, dest = row.option, (row.flag, *row.option.aliases), row.dest
    text = opt.help.replace("`", "") + help_suffix
    common: dict[str, Any] = {"help": text, "hidden": opt.hidden, "cls": DeclaredOption, "setting": row}
    if default is dataclasses.MISSING:
        common["required"], default = True, None
    if opt.kind == "switch":
        return click.option(*names, dest, is_flag=True, default=False, **common)
    if opt.kind == "bool":
        return click.option(f"{row.flag}/--no-{row.flag[2:]}", dest, default=default, **common)
    if opt.kind in ("ints", "names"):
        return click.option(*names, dest, callback=_int_list if opt.kind == "ints" else _names, default=default,
                            **{**common, "help": text + (", comma-separated" if opt.kind == "names" else ", e.g. 1,2")})  # fmt: skip
    if opt.parse is not None or opt.kind == "multiple":
        multiple = opt.kind == "multiple"
        return click.option(*names, dest, type=_Parsed(row), multiple=multiple, metavar=opt.metavar,
                            default=() if multiple else default,
                            show_default=not multiple and default is not None, **common)  # fmt: skip
    if opt.kind == "choice":
        return click.option(*names, dest, type=click.Choice(list(opt.choices)), default=default,
                            show_default=default is not None, **common)  # fmt: skip
    return click.option(*names, dest, type=_CLICK_TYPES[opt.kind], default=default, metavar=opt.metavar,
                        show_default=default is not None, **common)  # fmt: skip


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
