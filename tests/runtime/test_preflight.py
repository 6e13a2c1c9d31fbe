"""Plans that cannot run are refused before any process starts."""

from __future__ import annotations

import pytest
import torch

from tests.runtime.helpers import TinyModel, plan_of, tiny_model
from umsearch.errors import PlanError
from umsearch.plan import Plan, StagePlan
from umsearch.runtime.model import plan_model_spec
from umsearch.runtime.preflight import check_deadlock, check_model, preflight
from umsearch.runtime.run import run_plan

MODEL_MD_DEADLOCK = Plan(
    global_batch=8,
    stages=(
        StagePlan(layers=(0, 2), forward=(1, 3, 4), backward=(2, 6), warmup=1, recompute=True),
        StagePlan(layers=(2, 4), forward=(4, 4), backward=(8,), warmup=2, recompute=True),
    ),
)


def test_model_md_deadlock_is_refused() -> None:
    with pytest.raises(PlanError, match="deadlocks .*stage 0 waits"):
        check_deadlock(MODEL_MD_DEADLOCK)
    # run_plan refuses it before launching anything.
    with pytest.raises(PlanError, match="deadlocks"):
        run_plan(MODEL_MD_DEADLOCK, tiny_model_4)


def tiny_model_4() -> TinyModel:
    return tiny_model(4)


def test_layer_count_mismatch() -> None:
    with pytest.raises(PlanError, match="does not fit the model.*4 layers"):
        check_model(plan_of(8, ((0, 2), [8], None, 1), ((2, 3), [8], None, 1)), tiny_model(4))


def test_make_batch_mismatch() -> None:
    good = tiny_model(2)
    bad = TinyModel(good.layers, lambda b, g: (torch.zeros(b + 1, 5), torch.zeros(b, 3)), good.loss)
    with pytest.raises(PlanError, match=r"make_batch\(8\) returns inputs of shape \(9, 5\)"):
        preflight(plan_of(8, ((0, 2), [8], None, 1)), bad)


def test_plan_without_model_names_the_fix() -> None:
    with pytest.raises(PlanError, match="names no model"):
        plan_model_spec(plan_of(8, ((0, 2), [8], None, 1)))
    plan = Plan(global_batch=8, stages=plan_of(8, ((0, 2), [8], None, 1)).stages,
                meta={"model": {"source": "mlp", "args": {"layers": 1}}})  # fmt: skip
    assert plan_model_spec(plan) == {"source": "mlp", "args": {"layers": 1}}
