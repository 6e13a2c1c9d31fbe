"""Plans that cannot run are refused before any process starts, and again in every rank."""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch

from tests.runtime.helpers import TinyModel, plan_of, tiny_model
from umsearch.core.errors import PlanError
from umsearch.core.plan import Plan, StagePlan
from umsearch.runtime.config import RunConfig
from umsearch.runtime.model import plan_model_spec, spec_factory
from umsearch.runtime.preflight import check_deadlock, check_model, count_layers, preflight
from umsearch.runtime.run import run_plan
from umsearch.runtime.worker import stage_worker

MODEL_MD_DEADLOCK = Plan(
    global_batch=8,
    stages=(
        StagePlan(layers=(0, 2), forward=(1, 3, 4), backward=(2, 6), warmup=1, recompute=True),
        StagePlan(layers=(2, 4), forward=(4, 4), backward=(8,), warmup=2, recompute=True),
    ),
)


def tiny_model_4() -> TinyModel:
    return tiny_model(4)


def test_model_md_deadlock_is_refused() -> None:
    with pytest.raises(PlanError, match="deadlocks .*stage 0 waits"):
        check_deadlock(MODEL_MD_DEADLOCK)
    # run_plan refuses it before launching anything.
    with pytest.raises(PlanError, match="deadlocks"):
        run_plan(MODEL_MD_DEADLOCK, tiny_model_4)


def test_a_rank_checks_the_plan_before_talking_to_peers() -> None:
    """stage_worker (what every torchrun rank runs) refuses without a process group."""
    with pytest.raises(PlanError, match="deadlocks"):
        stage_worker(0, 2, MODEL_MD_DEADLOCK.to_json(), tiny_model_4, RunConfig(steps=1))
    with pytest.raises(PlanError, match=r"covers layers \[0, 4\) but the model has 6 layers"):
        stage_worker(1, 2, MODEL_MD_DEADLOCK.to_json(), functools.partial(tiny_model, 6), RunConfig(steps=1))


def test_layer_count_mismatch() -> None:
    with pytest.raises(PlanError, match=r"covers layers \[0, 3\) but the model has 4 layers"):
        check_model(plan_of(8, ((0, 2), [8], None, 1), ((2, 3), [8], None, 1)), tiny_model(4))
    with pytest.raises(PlanError, match=r"covers layers \[0, 3\) but the model has 4 layers"):
        preflight(plan_of(8, ((0, 2), [8], None, 1), ((2, 3), [8], None, 1)), tiny_model_4)


def test_make_batch_mismatch() -> None:
    good = tiny_model(2)
    bad = TinyModel(good.layers, lambda b, g: (torch.zeros(b + 1, 5), torch.zeros(b, 3)), good.loss)
    with pytest.raises(PlanError, match=r"make_batch\(8\) returns inputs of shape \(9, 5\)"):
        check_model(plan_of(8, ((0, 2), [8], None, 1)), bad)


built_on: list[str] = []


def _recording_factory(readable: bool) -> TinyModel:
    """A 3-layer model that notes the device it was built on; ``readable`` reads a weight's value."""
    model = tiny_model(3)
    weight = next(model.layers[0].parameters())
    built_on.append(weight.device.type)
    if readable:
        float(weight.detach().sum())  # impossible on meta: forces the real build
    return model


def test_count_layers_builds_on_meta_and_falls_back() -> None:
    built_on.clear()
    assert count_layers(functools.partial(_recording_factory, False)) == 3
    assert built_on == ["meta"]  # no weights allocated
    built_on.clear()
    assert count_layers(functools.partial(_recording_factory, True)) == 3
    assert built_on == ["meta", "cpu"]


def _plan_with(model: Any) -> Plan:
    return Plan(global_batch=8, stages=plan_of(8, ((0, 2), [8], None, 1)).stages, meta={"model": model})


def test_plan_model_spec_errors_name_the_fix() -> None:
    with pytest.raises(PlanError, match="names no model"):
        plan_model_spec(plan_of(8, ((0, 2), [8], None, 1)))
    assert plan_model_spec(_plan_with({"source": "mlp", "args": {"layers": 1}})) == {"source": "mlp", "args": {"layers": 1}}
    with pytest.raises(PlanError, match=r"'model' must be an object with a 'source' string and 'args', got 'gpt'"):
        plan_model_spec(_plan_with("gpt"))
    with pytest.raises(PlanError, match="has 'args' 3, not an object"):
        plan_model_spec(_plan_with({"source": "gpt", "args": 3}))


def test_bad_model_args_point_at_the_plan() -> None:
    factory = spec_factory({"source": "mlp", "args": {"depth": 3}})
    with pytest.raises(PlanError, match=r"cannot build the plan's model 'mlp': bad argument .*'depth'.*it takes "
                                        r"layers, width, inputs, classes; fix the plan's 'model' entry") as info:  # fmt: skip
        count_layers(factory)
    assert "umsearch profile" not in str(info.value)
