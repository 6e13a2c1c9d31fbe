"""Search spaces: TOML and flags, the ranks/stages alias, and errors that name the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from umsearch.core.errors import SearchSpaceError
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
    assert space.stages_per_rank == (1, 3) and space.placements == ("vshape",)
    assert not space.split_backward and space.peers == ("GPipe", "ZBVZeroBubble")
    assert load_space(_write(tmp_path, "ranks = 2\nglobal_batch = 8\n")).placements == ("loop", "vshape")


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
