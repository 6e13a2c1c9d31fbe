"""Plan files: a plan too large for any command is refused from the raw JSON's list lengths, before
any stage or action is built, in one line naming the count, the limit and the fix (the gate's parse,
:func:`umsearch.core.plan_io._parse_document`, is what refuses them)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from tests.contract import EXAMPLE3
from umsearch.core import plan_io
from umsearch.core.plan import MAX_ACTIONS, MAX_MICROBATCHES, MAX_PLAN_STAGES, MAX_RANKS
from umsearch.core.plan_io import _parse_document
from umsearch.core.plan_rules import validate_plan
from umsearch.errors import PlanError
from umsearch.search.space import MAX_RANKS as SPACE_MAX_RANKS
from umsearch.search.space import options


def _never(what: str) -> Any:
    def built(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"{what} was built before the plan's size was checked")

    return built


@pytest.fixture
def no_action_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Parsing an action fails the test: the size must be refused first."""
    monkeypatch.setattr(plan_io, "parse_action", _never("an action"))


@pytest.fixture
def nothing_built(monkeypatch: pytest.MonkeyPatch, no_action_parsed: None) -> None:
    """Building a stage or parsing an action fails the test: the size must be refused first."""
    monkeypatch.setattr(plan_io, "Stage", _never("a stage"))


def _refused(obj: dict[str, Any], num_layers: int | None = None) -> str:
    with pytest.raises(PlanError) as info:
        _parse_document(obj, num_layers)
    message = str(info.value)
    assert "\n" not in message
    return message


def _plan(stages: list[Any], actions: list[Any], ranks: int = 1, batch: int = 1) -> dict[str, Any]:
    return {"schema": "umsearch.plan/2", "global_batch": batch, "ranks": ranks, "stages": stages, "actions": actions}


@pytest.mark.usefixtures("nothing_built")
def test_a_million_stage_plan_is_refused_before_any_stage_is_built() -> None:
    stage = {"layers": [0, 1], "rank": 0, "forward": [1]}  # one object a million times: 8 MB, not 500
    message = _refused(_plan([stage] * 1_000_000, ["0F0 0B0"]))
    assert f"plan has 1000000 stages; at most {MAX_PLAN_STAGES} are supported" in message
    assert "give each stage more layers" in message


@pytest.mark.usefixtures("nothing_built")
def test_more_stages_than_the_model_has_layers_is_refused_before_any_stage_is_built() -> None:
    stages = [{"layers": [j, j + 1], "rank": 0, "forward": [1]} for j in range(5)]
    assert "plan has 5 stages but the model has 4 layers" in _refused(_plan(stages, ["0F0"]), num_layers=4)


@pytest.mark.usefixtures("nothing_built")
def test_too_many_ranks_are_refused_before_any_stage_is_built() -> None:
    message = _refused(_plan([{"layers": [0, 1], "rank": 0, "forward": [1]}], [[]] * 300, ranks=300))
    assert f"plan has 300 ranks; at most {MAX_RANKS} are supported" in message
    v1 = {"schema": "umsearch.plan/1", "global_batch": 1,
          "stages": [{"layers": [0, 1], "forward": [1], "warmup": 1}] * 300}  # fmt: skip
    assert f"plan has 300 ranks; at most {MAX_RANKS}" in _refused(v1)
    # The limits are the search space's: every plan a space can describe is within them.
    bounds = {o["key"]: o["bounds"] for o in options()}
    assert SPACE_MAX_RANKS == MAX_RANKS == bounds["ranks"][1]
    assert bounds["[microbatch] max_count"][1] == MAX_MICROBATCHES
    assert MAX_RANKS * bounds["[schedule] stages_per_rank"][1] == MAX_PLAN_STAGES


@pytest.mark.usefixtures("nothing_built")
def test_too_many_microbatches_over_all_stages_are_refused_before_any_stage_is_built() -> None:
    sizes = [1] * MAX_MICROBATCHES  # within the per-stage limit; 11 stages of them need 2.2M actions
    stages = [{"layers": [j, j + 1], "rank": 0, "forward": sizes} for j in range(11)]
    message = _refused(_plan(stages, ["0F0"], batch=MAX_MICROBATCHES))
    assert f"{11 * 2 * MAX_MICROBATCHES} forward and backward microbatches" in message
    assert f"at most {MAX_ACTIONS} actions" in message


@pytest.mark.usefixtures("no_action_parsed")
def test_too_many_actions_are_refused_before_any_is_parsed() -> None:
    message = _refused(_plan([{"layers": [0, 1], "rank": 0, "forward": [1]}], [["0F0"] * (MAX_ACTIONS + 1)]))
    assert f"plan lists {MAX_ACTIONS + 1} actions over its ranks; at most {MAX_ACTIONS}" in message


def test_one_stage_may_list_at_most_max_microbatches() -> None:
    sizes = [1] * (MAX_MICROBATCHES + 1)
    message = _refused(_plan([{"layers": [0, 1], "rank": 0, "forward": sizes}], ["0F0"], batch=len(sizes)))
    assert f"lists {MAX_MICROBATCHES + 1} microbatches; at most {MAX_MICROBATCHES}" in message


def test_validate_plan_checks_the_size_of_plans_built_in_code() -> None:
    with pytest.raises(PlanError, match=f"plan has 300 ranks; at most {MAX_RANKS}"):
        validate_plan(dataclasses.replace(EXAMPLE3, ranks=300))
