"""Search spaces: TOML and flags, the ranks/stages alias, and errors that name the key."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from umsearch.errors import SearchSpaceError
from umsearch.search.space import build_space, load_space, parse_bytes


def _write(tmp_path: Path, body: str) -> Path:
    f = tmp_path / "s.toml"
    f.write_text('profile = "p.json"\n' + body)
    return f


def test_stages_is_an_alias_of_ranks(tmp_path: Path) -> None:
    assert load_space(_write(tmp_path, "stages = 4\nglobal_batch = 8\n")).ranks == 4
    assert load_space(_write(tmp_path, "ranks = 4\nglobal_batch = 8\n"), {"stages": 2}).ranks == 2
    with pytest.raises(SearchSpaceError, match="disagree"):
        build_space({"profile": "p.json", "ranks": 2, "stages": 3, "global_batch": 8})


def test_v2_schedule_keys(tmp_path: Path) -> None:
    space = load_space(_write(tmp_path, "ranks = 2\nglobal_batch = 8\n[schedule]\nstages_per_rank = [3, 1]\n"
                                        "placement = 'vshape'\nsplit_backward = false\npeers = ['GPipe', 'ZBVZeroBubble']\n"))
    assert space.schedule.stages_per_rank == (1, 3) and space.schedule.placements == ("vshape",)
    assert not space.schedule.split_backward and space.schedule.peers == ("GPipe", "ZBVZeroBubble")
    assert load_space(_write(tmp_path, "ranks = 2\nglobal_batch = 8\n")).schedule.placements == ("loop", "vshape")


def test_profile_is_relative_to_the_toml(tmp_path: Path) -> None:
    space = load_space(_write(tmp_path, "ranks = 2\nglobal_batch = 8\n"))
    assert Path(space.profile) == tmp_path / "p.json"


@pytest.mark.parametrize(
    "toml,match",
    [
        ("ranks = 2\nglobal_batch = 4\nbogus = 1\n", "unknown key 'bogus'"),
        ("ranks = 2\nglobal_batch = 4\n[microbatch]\nsize = 3\n", "unknown key microbatch.size"),
        ("ranks = 0\nglobal_batch = 4\n", "ranks = 0"),
        ("ranks = 2\nglobal_batch = 4\nmemory_limit = '12 parsecs'\n", "memory_limit"),
        ("ranks = 2\nglobal_batch = 4\nmemory_limit = inf\n", "memory_limit"),
        ("ranks = 2\nglobal_batch = 4\n[schedule]\nfamily = 'any'\n", "schedule.family was removed"),
        ("ranks = 2\nglobal_batch = 4\n[schedule]\npeers = ['ZB']\n", "schedule.peers names 'ZB'"),
        ("ranks = 2\nglobal_batch = 4\n[schedule]\nplacement = 'ring'\n", "schedule.placement"),
        ("ranks = 2\nglobal_batch = 4\n[schedule]\nstages_per_rank = []\n", "stages_per_rank"),
        ("ranks = 2\nglobal_batch = 4\n[nope]\nx = 1\n", r"unknown table \[nope\]"),
        ("ranks = 2\n", "global_batch"),
        ("ranks = 2\nglobal_batch = 1e30\n", "global_batch"),
        ("ranks = 2\nglobal_batch = 4\nname = '../../x'\n", "name"),
        ("ranks = 2\nglobal_batch = 4\nname = ''\n", "name"),
        ("ranks = 2\nglobal_batch = 4\nstate_factor = -1\n", "state_factor"),
        ("ranks = 2\nglobal_batch = 4\n[search]\ntime_budget_s = nan\n", "time_budget_s"),
    ],
)
def test_bad_spaces_name_the_key(tmp_path: Path, toml: str, match: str) -> None:
    with pytest.raises(SearchSpaceError, match=match):
        load_space(_write(tmp_path, toml))


def test_parse_bytes() -> None:
    assert parse_bytes("80GiB") == 80 * 2**30
    assert parse_bytes("16GB") == 16e9
    assert parse_bytes(1024) == 1024.0
    for bad in ("inf", float("inf"), float("nan"), -1, "0GiB", True):
        with pytest.raises(SearchSpaceError):
            parse_bytes(bad)


def test_the_readme_table_is_the_dataclasses() -> None:
    """search_spaces/README.md documents exactly the keys, defaults and help of the dataclasses."""
    from umsearch.search.space import markdown_table

    readme = (Path(__file__).resolve().parents[2] / "search_spaces" / "README.md").read_text(encoding="utf-8")
    assert markdown_table() in readme


def test_every_key_is_a_flag_of_search() -> None:
    from click.testing import CliRunner

    from umsearch.cli.search import search_command
    from umsearch.search.space import options

    text = CliRunner().invoke(search_command, ["--help"], terminal_width=200).output
    for o in options():
        assert o["flag"] in text, o["key"]


def test_flags_that_disagree_on_ranks_are_refused(tmp_path: Path) -> None:
    with pytest.raises(SearchSpaceError, match="ranks = 2 and its alias stages = 3 disagree"):
        load_space(_write(tmp_path, "ranks = 4\nglobal_batch = 8\n"), {"ranks": 2, "stages": 3})
    assert load_space(_write(tmp_path, "ranks = 4\nglobal_batch = 8\n"), {"ranks": 2, "stages": 2}).ranks == 2


def test_tables_are_dataclasses_with_the_toml_keys(tmp_path: Path) -> None:
    space = load_space(_write(tmp_path, "ranks = 2\nglobal_batch = 8\n[microbatch]\nmax = 4\nmax_count = 8\n"
                                        "[search]\nseed = 7\n"))  # fmt: skip
    assert (space.microbatch.max, space.microbatch.max_count, space.search.seed) == (4, 8, 7)
    assert space.to_json()["microbatch"] == {"min": 1, "max": 4, "multiple_of": 1, "max_count": 8}
    assert space.microbatch_sizes == [1, 2, 3, 4]


@pytest.mark.parametrize(("flags", "match"), [
    ({"ranks": 0}, "^flag --ranks: ranks = 0: must be an integer from 1 to 256"),
    ({"global_batch": 0}, "^flag --global-batch: global_batch = 0"),
    ({"memory_limit": "12 parsecs"}, "^flag --memory-limit: memory_limit = '12 parsecs' is not a size"),
])  # fmt: skip
def test_a_bad_flag_names_the_flag_not_the_toml(tmp_path: Path, flags: dict[str, object], match: str) -> None:
    toml = _write(tmp_path, "ranks = 2\nglobal_batch = 8\n")
    with pytest.raises(SearchSpaceError, match=match) as info:
        load_space(toml, flags)
    assert str(toml) not in str(info.value)
    with pytest.raises(SearchSpaceError, match=f"^{re.escape(str(toml))}: ranks = 0"):  # the same value in the TOML names the TOML
        load_space(_write(tmp_path, "ranks = 0\nglobal_batch = 8\n"))
