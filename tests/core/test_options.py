"""One switch on :attr:`umsearch.core.options.Option.kind`: :data:`~umsearch.core.options.KIND_RULES` says how a
command line takes each kind and what a value of it must be; the search space's key checks and the torchrun
entry point's flags give the same answers through it."""

from __future__ import annotations

from typing import Any

import pytest

from umsearch.core.options import KIND_RULES, ValueKind, check_value, kind_rule
from umsearch.errors import SearchSpaceError
from umsearch.runtime.config import flags
from umsearch.runtime.torchrun import parser
from umsearch.search import space

SAMPLES: tuple[Any, ...] = (0, 1, 3, -2, 2**40, 0.5, 1e300, float("nan"), True, False, "x", "", "1,2", "80GiB",
                            "nvlink4", "1F1B", [], [1, 2], [2, 2, 1], ["1F1B", "GPipe"], ["nope"], None,
                            {"latency_ms": 0.005, "bandwidth_gb_per_s": 300})  # fmt: skip
PARSERS = {"size": space.parse_bytes, "link": space.parse_link}


def _outcome(call: Any) -> tuple[str, Any]:
    try:
        return "value", call()
    except SearchSpaceError as exc:
        return "refused", str(exc)


@pytest.mark.parametrize(("table", "f"), space._ENTRIES, ids=[f"{t}.{f.name}" for t, f in space._ENTRIES])
def test_every_search_space_key_is_checked_alike_through_the_switch(table: str, f: Any) -> None:
    key = space._where(table, f.name)
    for v in SAMPLES:
        ours = _outcome(lambda: check_value(space._opt(f), v, key, SearchSpaceError, PARSERS))  # noqa: B023
        theirs = _outcome(lambda: space._value(table, f, v))  # noqa: B023
        assert repr(ours) == repr(theirs), (key, v)


def test_every_kind_has_its_rule() -> None:
    assert set(KIND_RULES) == set(ValueKind.__args__)  # type: ignore[attr-defined]


def test_the_entry_points_flags_take_the_shape_of_their_kind() -> None:
    actions = {a.dest: a for a in parser()._actions}
    for row in flags("ranks"):
        shape = kind_rule(row.option).shape
        got = type(actions[row.dest]).__name__
        assert got == {"switch": "_StoreTrueAction", "repeated": "_AppendAction", "value": "_StoreAction"}[shape]
