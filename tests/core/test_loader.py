"""One gate: a plan file is read through :func:`umsearch.core.loader.load_plan_file`, a plan built in code is
checked with :func:`umsearch.core.plan_rules.validate_plan`, and either way a plan is checked once per
process however many layers ask (counted here: the private check that does the work)."""

from __future__ import annotations

import dataclasses
import gc
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.contract import EXAMPLE5, EXAMPLE5_DEADLOCK, unit_profile
from umsearch.core import plan_rules
from umsearch.core.loader import load_plan_file
from umsearch.core.plan import Plan
from umsearch.core.plan_io import PlanDocument, save_document, save_plan
from umsearch.core.plan_rules import validate_plan
from umsearch.core.profile import save_profile
from umsearch.core.program import lower
from umsearch.errors import PlanError
from umsearch.sim.reference import simulate


@pytest.fixture
def checks(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Plan]]:
    """Every plan :func:`validate_plan` really checks (not the ones it has passed already), in order."""
    checked: list[Plan] = []
    original = plan_rules._check

    def counted(plan: Plan) -> None:
        checked.append(plan)
        original(plan)

    monkeypatch.setattr(plan_rules, "_check", counted)
    yield checked


def _fresh(plan: Plan) -> Plan:
    """An equal plan that is another object (one no check has seen)."""
    return dataclasses.replace(plan, stages=tuple(plan.stages))


def _plan_file(tmp: Path, plan: Plan = EXAMPLE5, **meta: object) -> Path:
    return save_plan(_fresh(plan), tmp / "plan.json", **meta)


def test_a_plan_loaded_through_the_gate_is_checked_once_in_the_process(tmp_path: Path, checks: list[Plan]) -> None:
    save_profile(unit_profile(4), tmp_path / "prof.json")
    path = _plan_file(tmp_path, profile="prof.json")
    checks.clear()  # saving checked the plan written; reading it back is what is counted
    loaded = load_plan_file(path)
    assert checks == [loaded.plan]
    # Every later layer asks again and pays nothing: simulate, lower, save, and validate_plan itself.
    simulate(loaded.plan, loaded.cost())
    lower(loaded.plan)
    save_document(loaded.document, tmp_path / "again.json")
    assert validate_plan(loaded.plan, 4) is loaded.plan
    assert checks == [loaded.plan]


def test_each_load_is_one_check(tmp_path: Path, checks: list[Plan]) -> None:
    path = _plan_file(tmp_path)
    checks.clear()
    first, second = load_plan_file(path), load_plan_file(path)
    assert first.plan == second.plan and first.plan is not second.plan
    assert checks == [first.plan, second.plan]


def test_a_plan_built_in_code_is_checked_once_and_an_equal_copy_again(checks: list[Plan]) -> None:
    plan = _fresh(EXAMPLE5)
    assert validate_plan(plan) is plan
    assert validate_plan(plan) is plan
    copy = _fresh(EXAMPLE5)
    validate_plan(copy)
    assert checks == [plan, copy] and checks[0] is plan and checks[1] is copy


def test_a_passed_plan_is_still_held_to_the_layer_count(checks: list[Plan]) -> None:
    plan = validate_plan(_fresh(EXAMPLE5), 4)
    with pytest.raises(PlanError, match=r"plan covers layers \[0, 4\) but the model has 5 layers"):
        validate_plan(plan, 5)
    assert len(checks) == 1


def test_a_refused_plan_is_refused_every_time(checks: list[Plan]) -> None:
    bad = dataclasses.replace(EXAMPLE5, global_batch=5)
    for _ in range(2):
        with pytest.raises(PlanError, match="sums to 4 but global_batch is 5"):
            validate_plan(bad)
    assert len(checks) == 2


def test_the_memory_of_passed_plans_lets_them_go() -> None:
    before = len(plan_rules._PASSED)
    plans = [validate_plan(_fresh(EXAMPLE5)) for _ in range(50)]
    assert len(plan_rules._PASSED) >= before + 50
    del plans
    gc.collect()
    assert len(plan_rules._PASSED) <= before


def test_the_gate_names_the_file_and_refuses_a_deadlock(tmp_path: Path) -> None:
    obj = EXAMPLE5.to_json()
    obj["global_batch"] = 5
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(obj))
    with pytest.raises(PlanError, match=rf"^{bad}: plan stages\[0\].forward sums to 4 but global_batch is 5"):
        load_plan_file(bad)
    stuck = _plan_file(tmp_path, EXAMPLE5_DEADLOCK)
    with pytest.raises(PlanError, match=rf"^{stuck}: the plan deadlocks"):
        load_plan_file(stuck)
    assert load_plan_file(stuck, allow_deadlock=True).plan == EXAMPLE5_DEADLOCK


def test_the_gate_checks_the_plan_against_its_profile(tmp_path: Path) -> None:
    save_profile(unit_profile(5), tmp_path / "prof.json")
    path = _plan_file(tmp_path, profile="prof.json")
    with pytest.raises(PlanError, match=f"{path} does not fit profile"):
        load_plan_file(path)


def test_a_document_saved_is_read_back_the_same(tmp_path: Path) -> None:
    doc = PlanDocument(plan=EXAMPLE5, predicted={"iteration_ms": 1.5}, meta={"seed": 3})
    back = load_plan_file(save_document(doc, tmp_path / "plan.json")).document
    assert back == doc
