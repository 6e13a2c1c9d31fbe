"""Plans that cannot run are refused before any process starts, and again in every rank; which
model a plan runs, and the slices its stages keep."""

from __future__ import annotations

import functools
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings

from tests.contract import (
    EXAMPLE2,
    EXAMPLE3,
    EXAMPLE4,
    EXAMPLE5,
    EXAMPLE5_DEADLOCK,
    example1,
    unit_profile,
)
from tests.strategies import plans, uniform_profile
from umsearch.core.cost import CostModel
from umsearch.core.deps import find_deadlock
from umsearch.core.loader import LoadedPlan, load_plan_file
from umsearch.core.plan import Plan
from umsearch.core.plan_io import save_plan
from umsearch.core.profile import save_profile
from umsearch.errors import ModelSpecError, PlanError
from umsearch.nn.spec import BuiltModel
from umsearch.runtime.config import ModelChoice
from umsearch.runtime.model_source import (
    require_trusted,
    spec_factory,
    stage_module,
    user_model,
)
from umsearch.runtime.preflight import (
    check_deadlock,
    check_model,
    count_layers,
    preflight,
    rank_preflight,
)


def _linear_model(layers: int, batch_extra: int = 0) -> BuiltModel:
    mods: list[torch.nn.Module] = [torch.nn.Linear(3, 3) for _ in range(layers)]

    def batch(b: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(b + batch_extra, 3, generator=g), torch.randn(b, 3, generator=g)

    return BuiltModel(mods, [f"l{i}" for i in range(layers)], batch, torch.nn.functional.mse_loss)


@pytest.mark.parametrize("plan", [EXAMPLE2, EXAMPLE5_DEADLOCK], ids=["example2", "example5-moved"])
def test_model_md_deadlocks_are_refused_naming_every_stuck_rank(plan: Plan) -> None:
    with pytest.raises(PlanError, match="^the plan deadlocks") as info:
        check_deadlock(plan)
    for line in find_deadlock(plan):
        assert line in str(info.value)
    assert "rank 0 is stuck at" in str(info.value) or "rank 1 is stuck at" in str(info.value)
    with pytest.raises(PlanError, match="deadlocks"):
        preflight(plan)  # no model, no profile needed


@pytest.mark.parametrize("plan", [example1("gpipe"), example1("1f1b"), EXAMPLE3, EXAMPLE4, EXAMPLE5])
def test_model_md_plans_pass(plan: Plan) -> None:
    preflight(plan, functools.partial(_linear_model, plan.num_layers), CostModel(unit_profile(plan.num_layers)))
    rank_preflight(plan, _linear_model(plan.num_layers))


@settings(max_examples=40, deadline=None)
@given(plans(num_layers=4))
def test_the_deadlock_check_is_the_action_lists_alone(plan: Plan) -> None:
    """No profile and no timing: refused exactly when find_deadlock finds a stuck rank."""
    if find_deadlock(plan):
        with pytest.raises(PlanError, match="deadlocks"):
            check_deadlock(plan)
    else:
        check_deadlock(plan)


def test_the_profile_check_covers_layers_and_the_iw_split() -> None:
    with pytest.raises(PlanError, match=r"covers layers \[0, 4\) but the profile has 6 layers"):
        preflight(EXAMPLE4, None, CostModel(unit_profile(6)))
    with pytest.raises(PlanError, match="stage 0 uses I/W but layer 0 has no bwd_input_ms"):
        preflight(EXAMPLE4, None, CostModel(unit_profile(4, split=False)))
    preflight(EXAMPLE3, None, CostModel(unit_profile(4, split=False)))  # no I/W: no split needed


def test_layer_count_and_batch_mismatch() -> None:
    with pytest.raises(PlanError, match=r"covers layers \[0, 4\) but the model has 5 layers"):
        check_model(EXAMPLE3, _linear_model(5))
    with pytest.raises(PlanError, match=r"covers layers \[0, 4\) but the model has 5 layers"):
        preflight(EXAMPLE3, functools.partial(_linear_model, 5))
    with pytest.raises(PlanError, match=r"make_batch\(4\) returns inputs of shape \(5, 3\)"):
        rank_preflight(EXAMPLE3, _linear_model(4, batch_extra=1))


built_on: list[str] = []


def _recording_factory(readable: bool) -> BuiltModel:
    """A 3-layer model that notes the device it was built on; ``readable`` reads a weight's value."""
    model = _linear_model(3)
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


def test_stage_modules_keep_global_layer_names() -> None:
    model = _linear_model(4)
    names = [n for n, _ in stage_module(model, 1, 3).named_parameters()]
    assert names == ["1.weight", "1.bias", "2.weight", "2.bias"]


# ---------------------------------------------------------------------------
# Which model, under which rule
# ---------------------------------------------------------------------------


def resolve_plan(path: Path, choice: ModelChoice) -> LoadedPlan:
    """The plan file through its gate with the user's model choice, as ``run``, ``replay`` and every rank pass it."""
    return load_plan_file(path, profile=choice.profile, model=user_model(choice), trust_model_code=choice.trust_model_code)


def _plan_file(tmp: Path, **meta: Any) -> Path:
    plan = replace(EXAMPLE5, stages=tuple(replace(s, layers=(j, j + 1)) for j, s in enumerate(EXAMPLE5.stages)))
    return save_plan(plan, tmp / "plan.json", **meta)


def test_the_plans_own_zoo_model_is_trusted(tmp_path: Path) -> None:
    loaded = resolve_plan(_plan_file(tmp_path, model={"source": "mlp", "args": {"layers": 3}}), ModelChoice())
    spec = require_trusted(loaded)
    assert (spec.source, spec.args, spec.trusted) == ("mlp", {"layers": 3}, True)


def test_a_files_user_model_needs_the_user(tmp_path: Path) -> None:
    path = _plan_file(tmp_path, model={"source": "pkg.mod:build", "args": {"n": 2}})
    with pytest.raises(ModelSpecError, match="not a zoo model: building it would import and run"):
        require_trusted(resolve_plan(path, ModelChoice()))
    trusted = require_trusted(resolve_plan(path, ModelChoice(trust_model_code=True)))
    assert (trusted.source, trusted.args) == ("pkg.mod:build", {"n": 2})
    # Named again on the command line: trusted, and without --arg the file's arguments are kept.
    named = require_trusted(resolve_plan(path, ModelChoice(model="pkg.mod:build")))
    assert (named.source, named.args, named.trusted) == ("pkg.mod:build", {"n": 2}, True)
    # With --arg, the user's arguments, and only those.
    argued = require_trusted(resolve_plan(path, ModelChoice(model="pkg.mod:build", model_args=("m=1.5",))))
    assert argued.args == {"m": 1.5}
    # Another model: the file's arguments are not carried over.
    other = require_trusted(resolve_plan(path, ModelChoice(model="gpt")))
    assert (other.source, other.args) == ("gpt", {})


def test_a_profiles_model_spec_is_used_under_the_same_rule(tmp_path: Path) -> None:
    prof = replace(uniform_profile(layers=4), extra={"model_spec": {"source": "pkg.mod:build", "args": {}}})
    save_profile(prof, tmp_path / "prof.json")
    path = _plan_file(tmp_path, profile="prof.json")
    with pytest.raises(ModelSpecError, match="not a zoo model"):
        require_trusted(resolve_plan(path, ModelChoice()))
    assert require_trusted(resolve_plan(path, ModelChoice(trust_model_code=True))).source == "pkg.mod:build"


def test_model_errors_name_the_fix(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match="names no model to run .*--model"):
        require_trusted(resolve_plan(_plan_file(tmp_path), ModelChoice()))
    with pytest.raises(PlanError, match=r"'model' must be an object with a 'source' string and 'args', got 'gpt'"):
        resolve_plan(_plan_file(tmp_path, model="gpt"), ModelChoice())
    with pytest.raises(ModelSpecError, match="--arg 'layers=2' needs --model"):
        user_model(ModelChoice(model_args=("layers=2",)))
    with pytest.raises(ModelSpecError, match="--model names 'nosuch', which is no zoo model"):
        user_model(ModelChoice(model="nosuch"))


def test_bad_model_args_point_at_the_plan() -> None:
    factory = spec_factory(user_model(ModelChoice(model="mlp", model_args=("depth=3",))))  # type: ignore[arg-type]
    with pytest.raises(PlanError, match=r"cannot build the model 'mlp': bad argument .*'depth'.*fix the plan's "
                                        r"'model' entry") as info:  # fmt: skip
        count_layers(factory)
    assert "umsearch profile" not in str(info.value)


def exploding(**kwargs: Any) -> Any:
    raise RuntimeError("model code broke [/x/y.py:1]")


def test_a_user_models_own_failure_is_one_domain_error() -> None:
    factory = spec_factory(user_model(ModelChoice(model=f"{__name__}:exploding")))  # type: ignore[arg-type]
    with pytest.raises(PlanError, match=r"building the model '.*:exploding' failed: RuntimeError: model code broke"):
        factory()


# ---------------------------------------------------------------------------
# Device and precision of the run against the profile's measurement
# ---------------------------------------------------------------------------


def _measured(device: str = "cuda: NVIDIA H200", precision: str | None = "bf16") -> Any:
    extra = {"precision": precision} if precision is not None else {}
    return replace(uniform_profile(layers=4), device=device, extra=extra)


def test_the_profiles_precision_is_the_runs_unless_another_is_asked_for() -> None:
    from umsearch.runtime.preflight import check_measured_on

    on = check_measured_on(_measured(), device_type="cuda", precision=None)
    assert (on.precision, on.warnings, on.device_differs) == ("bf16", (), False)
    assert check_measured_on(_measured(), device_type="cuda", precision="bf16").precision == "bf16"
    with pytest.raises(PlanError, match=r"measured in bf16 but this run asks for --dtype fp32: .*run with --dtype "
                                        r"bf16 .* umsearch profile \.\.\. --dtype fp32"):  # fmt: skip
        check_measured_on(_measured(), device_type="cuda", precision="fp32")


def test_another_device_type_is_said_plainly_and_is_not_the_models_fault() -> None:
    from umsearch.runtime.preflight import check_measured_on

    on = check_measured_on(_measured("cpu: Xeon, 1 thread(s)", "fp32"), device_type="cuda", precision=None)
    assert on.device_differs and len(on.warnings) == 1
    assert "measured on cpu (cpu: Xeon, 1 thread(s)) but this run uses cuda" in on.warnings[0]
    assert "not because the model is wrong" in on.warnings[0]
    # A device the profile's text does not name is not guessed at.
    assert not check_measured_on(_measured("none", "fp32"), device_type="cpu", precision=None).device_differs


def test_a_profile_without_precision_runs_with_a_warning() -> None:
    from umsearch.runtime.preflight import check_measured_on

    on = check_measured_on(_measured("cuda: H200", None), device_type="cuda", precision="tf32")
    assert on.precision == "tf32" and "does not record its precision" in on.warnings[0]
    assert check_measured_on(None, device_type="cpu", precision=None).precision is None


# ---------------------------------------------------------------------------
# The NCCL path, as far as a machine without GPUs goes
# ---------------------------------------------------------------------------


def _mlp_plan(tmp: Path, precision: str | None = None, device: str = "cuda: NVIDIA H200") -> Path:
    prof = replace(uniform_profile(layers=4), device=device, extra={"precision": precision} if precision else {})
    save_profile(prof, tmp / "prof.json")
    return _plan_file(tmp, profile="prof.json", model={"source": "mlp", "args": {"layers": 3, "width": 8}})


def test_nccl_refuses_fewer_gpus_than_ranks_with_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from umsearch.cli.run import run_command

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    res = CliRunner().invoke(run_command, [str(_mlp_plan(tmp_path)), "--backend", "nccl", "--steps", "1"])
    assert res.exit_code == 1
    assert "backend nccl needs one GPU per rank: 2 ranks but 1 GPU(s) here; use --backend gloo or a plan with " \
           "fewer ranks" in res.output  # fmt: skip


def test_each_rank_takes_the_gpu_of_its_local_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    from umsearch.runtime.launch import local_rank_device

    monkeypatch.setenv("LOCAL_RANK", "3")
    assert local_rank_device("nccl") == torch.device("cuda", 3)
    assert local_rank_device("gloo") == torch.device("cpu")


def test_print_launch_for_several_nodes_carries_the_profiles_precision(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from umsearch.cli.run import run_command

    path = str(_mlp_plan(tmp_path, "bf16"))
    res = CliRunner().invoke(run_command, [path, "--print-launch", "--backend", "nccl", "--nnodes", "2",
                                           "--rdzv-endpoint", "node0:29400"])  # fmt: skip
    assert res.exit_code == 0, res.output
    line = res.stdout.strip().splitlines()[-1]
    assert "--nnodes=2" in line and "--nproc-per-node=1" in line and "--backend=nccl" in line
    assert "--dtype=bf16" in line  # the ranks run the profile's precision
    refused = CliRunner().invoke(run_command, [path, "--print-launch", "--backend", "nccl", "--dtype", "fp16"])
    assert refused.exit_code == 1 and "measured in bf16 but this run asks for --dtype fp16" in refused.output


@pytest.mark.slow
def test_validate_on_another_device_type_is_not_called_a_model_error(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from umsearch.cli.run import validate_command

    path = str(_mlp_plan(tmp_path, "fp32", device="cuda: NVIDIA H200"))  # a GPU profile, run here on the CPU
    res = CliRunner().invoke(validate_command, [path, "--rounds", "2", "--threads", "1"])
    assert res.exit_code == 0, res.output
    assert "measured on cuda (cuda: NVIDIA H200) but this run uses cpu" in res.stderr
    assert "not a model error" in res.stdout
