"""One options mechanism (issue 32 item 2): every flag of search, run, validate and tune comes from a
declared setting (umsearch.core.options), so a setting has one flag, one help text and one set of bounds
wherever it appears, and a flag is named after its key."""

from __future__ import annotations

import click
import pytest

from umsearch.cli.main import cli
from umsearch.cli.tune import _RUN_KEYS as TUNE_RUN_KEYS
from umsearch.core.options import settings
from umsearch.orchestrate.tune import TuneConfig
from umsearch.runtime.config import FLAGS
from umsearch.search.space import options, space_settings

DECLARED = {"search": space_settings(), "run": list(FLAGS), "validate": list(FLAGS),
            "tune": [*space_settings(), *settings(TuneConfig), *(r for r in FLAGS if r.dest in TUNE_RUN_KEYS)]}
"""The declared settings each command draws its flags from (tune's seed is the search's)."""


def _params(name: str) -> dict[str, click.Parameter]:
    command = cli.get_command(click.Context(cli), name)
    assert command is not None
    return {p.name: p for p in command.params if p.name is not None}


@pytest.mark.parametrize("command", ["search", "run", "validate", "tune"])
def test_every_flag_of_a_declared_setting_is_spelled_as_declared(command: str) -> None:
    declared = {row.dest: row for row in DECLARED[command]}
    for dest, param in _params(command).items():
        row = declared.get(dest)
        if row is None:
            continue  # a command's own argument (--out, --json, ...)
        names = {row.flag, *row.option.aliases}
        if row.option.kind == "bool":
            names.add("--no-" + row.flag[2:])
        assert set(param.opts) | set(getattr(param, "secondary_opts", [])) == names, (command, dest)
        assert row.option.help.replace("`", "") in (getattr(param, "help", "") or ""), (command, dest)


def test_tune_shares_the_search_and_run_settings_instead_of_redeclaring_them() -> None:
    tune, search, run = _params("tune"), _params("search"), _params("run")
    for dest in ("ranks", "global_batch", "memory_limit", "stages_per_rank", "time_budget_s", "seed"):
        assert tune[dest].opts == search[dest].opts
    for dest in ("threads", "warmup_steps", "model", "model_args", "trust_model_code"):
        assert tune[dest].opts == run[dest].opts


def test_a_flag_is_named_after_its_key() -> None:
    for o in options():
        table, _, key = o["key"].rpartition(" ")
        dashed = key.replace("_", "-")
        expected = f"--microbatch-{dashed}" if table == "[microbatch]" else f"--{dashed}"
        assert o["flag"] == expected, o["key"]


def test_an_out_of_bounds_tune_setting_names_its_flag(capsys: pytest.CaptureFixture[str]) -> None:
    from tests.cli.helpers import run_cli

    code, _, err = run_cli(capsys, "tune", "x.json", "--k", "0")
    assert code == 1 and "--k 0: must be from 1 to 32" in err, err


# ------------------------------------------------------------------------------------------------ issue 39 item 3
def test_every_option_of_every_command_comes_from_a_declaration() -> None:
    """No flag is typed by hand: each is a DeclaredOption made from a declared setting (help, kind, bounds)."""
    from umsearch.cli.options import DeclaredOption

    ctx = click.Context(cli)
    typed = []
    for name in cli.list_commands(ctx):
        command = cli.get_command(ctx, name)
        assert command is not None
        for param in command.params:
            if isinstance(param, click.Option) and not isinstance(param, DeclaredOption):
                typed.append(f"{name} {'/'.join(param.opts)}")
    assert typed == []


def test_threads_has_one_declaration_and_one_bound_everywhere() -> None:
    from umsearch.cli.options import DeclaredOption

    ctx = click.Context(cli)
    found = {}
    for name in cli.list_commands(ctx):
        command = cli.get_command(ctx, name)
        assert command is not None
        for param in command.params:
            if "--threads" in getattr(param, "opts", ()):
                assert isinstance(param, DeclaredOption)
                found[name] = param.setting
    assert set(found) >= {"run", "validate", "calibrate", "profile", "replay"}
    assert len({id(s.field) for s in found.values()}) == 1
    parse = next(iter(found.values())).option.parse
    assert parse is not None and parse("1024") == 1024 and parse("0") is None
    with pytest.raises(ValueError, match="at most 1024"):
        parse("1025")
