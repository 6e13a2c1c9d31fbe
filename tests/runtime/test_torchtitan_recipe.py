"""The PlanSchedule recipe ``umsearch export --format torchtitan`` writes, run the way torchtitan runs it.

A torchtitan-shaped model (``tok_embeddings``, ``layers.N``, ``norm``,
``output``, a forward that takes ``input_batch=``) is cut into stages the way
torchtitan's ``pipeline_module_split`` cuts one: a deep copy per stage with
every module not named in that stage's ``module_fqns_per_model_part`` removed.
Each rank wraps its stages in torch ``PipelineStage``s, builds the schedule
with the recipe's ``build_plan_schedule(stages, loss_fn)`` and steps as
torchtitan's trainer does; the gradients equal one process on the full batch.
"""

from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from click.testing import CliRunner

from tests.contract import EXAMPLE5
from tests.strategies import uniform_profile
from umsearch.cli.main import cli
from umsearch.core.actions import parse_actions
from umsearch.core.loader import load_plan_file
from umsearch.core.plan import Plan, placed_plan
from umsearch.core.plan_io import save_plan
from umsearch.core.profile import save_profile
from umsearch.core.schedules import one_f_one_b
from umsearch.formats.torchtitan import PLAN_FILE, RECIPE_FILE, plan_schedule_recipe
from umsearch.runtime.config import LaunchConfig
from umsearch.runtime.launch import launch

NAMES = ["tok_embeddings", "layers.0", "layers.1", "norm", "output"]
"""The plan's layers, as torchtitan's module paths."""
WIDTH, SEED = 4, 5


class TitanLike(torch.nn.Module):
    """A torchtitan-shaped model: parts may be None after the split; ``input_batch`` reaches every stage."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.tok_embeddings: torch.nn.Module | None = torch.nn.Linear(3, WIDTH).double()
        self.layers = torch.nn.ModuleDict({str(i): torch.nn.Linear(WIDTH, WIDTH).double() for i in range(2)})
        self.norm: torch.nn.Module | None = torch.nn.LayerNorm(WIDTH).double()
        self.output: torch.nn.Module | None = torch.nn.Linear(WIDTH, 2).double()

    def forward(self, h: torch.Tensor, input_batch: torch.Tensor | None = None) -> torch.Tensor:
        if self.tok_embeddings is not None:
            h = self.tok_embeddings(h)
        for layer in self.layers.values():
            h = torch.tanh(layer(h)) * (1.0 + 0.1 * input_batch.sum(dim=1, keepdim=True))  # type: ignore[union-attr]
        if self.norm is not None:
            h = self.norm(h)
        return self.output(h) if self.output is not None else h


def split(model: TitanLike, fqns: list[str]) -> TitanLike:
    """One stage as torchtitan cuts it: a deep copy keeping only the modules named in ``fqns``."""
    part = copy.deepcopy(model)
    for name in ("tok_embeddings", "norm", "output"):
        if name not in fqns:
            setattr(part, name, None)
    for key in list(part.layers):
        if f"layers.{key}" not in fqns:
            del part.layers[key]
    return part


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(SEED)
    return torch.randn(4, 3, generator=g, dtype=torch.float64), torch.randn(4, 2, generator=g, dtype=torch.float64)


def _plan() -> Plan:
    """Section 8.5's unequal interleaved plan, its four stages over the five named layers."""
    from dataclasses import replace

    cuts = [0, 1, 2, 3, 5]
    return replace(EXAMPLE5, stages=tuple(replace(s, layers=(cuts[j], cuts[j + 1])) for j, s in enumerate(EXAMPLE5.stages)))


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("plan_schedule_recipe", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def titan_worker(rank: int, world: int, folder: str) -> dict[str, torch.Tensor]:
    """Launch target: torchtitan's steps with the recipe's schedule; this rank's gradients."""
    from torch.distributed.pipelining import PipelineStage

    recipe = _load(Path(folder) / RECIPE_FILE)
    model = TitanLike()
    fqns = recipe.MODULE_FQNS_PER_MODEL_PART
    mine = [j for j, r in enumerate(recipe.STAGE_RANKS) if r == rank]
    parts = {j: split(model, fqns[j]) for j in mine}
    stages = [PipelineStage(parts[j], j, len(fqns), torch.device("cpu")) for j in mine]
    schedule = recipe.build_plan_schedule(stages, torch.nn.functional.mse_loss)
    x, y = batch()
    first, last = 0 in mine, len(fqns) - 1 in mine
    losses: list[torch.Tensor] | None = [] if last else None
    if first:
        schedule.step(x, target=y if last else None, losses=losses, input_batch=x)
    else:
        schedule.step(target=y if last else None, losses=losses, input_batch=x)
    grads = {f"{j}:{n}": p.grad.clone() for j in mine for n, p in parts[j].named_parameters() if p.grad is not None}
    if losses is not None:
        grads["loss"] = torch.stack(losses).mean()
    return grads


def test_the_recipe_names_each_stages_modules_where_the_plan_cuts() -> None:
    text = plan_schedule_recipe(_plan(), NAMES, "runs/x/plan.json")
    namespace: dict[str, Any] = {"__file__": "/somewhere/plan_schedule.py"}
    exec(compile(text, RECIPE_FILE, "exec"), namespace)  # the file is plain Python
    assert namespace["MODULE_FQNS_PER_MODEL_PART"] == [["tok_embeddings"], ["layers.0"], ["layers.1"], ["norm", "output"]]
    assert namespace["STAGE_RANKS"] == [0, 1, 0, 1] and namespace["PIPELINE_PARALLEL_DEGREE"] == 2
    assert str(namespace["PLAN"]) == f"/somewhere/{PLAN_FILE}"
    assert 'pipeline_parallel_schedule = "PipelineScheduleMulti"' in text


def test_export_writes_the_plan_and_its_recipe_beside_the_settings(tmp_path: Path) -> None:
    save_profile(uniform_profile(), tmp_path / "prof.json")  # layers l0..l3
    plan = placed_plan([0, 1, 2, 3, 4], [0, 1, 0, 1], 8, [[2, 6], [4, 4], [8], [3, 5]],
                       [parse_actions(a) for a in ("0F0 0F1 2F0 2B0 0B0 0B1", "1F0 1F1 3F0 3F1 3B0 3B1 1B0 1B1")])
    save_plan(plan, tmp_path / "plan.json", profile="prof.json")
    res = CliRunner().invoke(cli, ["export", str(tmp_path / "plan.json"), "--format", "torchtitan",
                                   "--out", str(tmp_path / "unequal"), "--json"])  # fmt: skip
    # Unequal microbatches and no baselines beside the plan: no stock settings, but the recipe runs it.
    assert res.exit_code == 0, res.output
    got = json.loads(res.output)
    assert sorted(Path(f).name for f in got["files"]) == sorted([PLAN_FILE, RECIPE_FILE])
    assert any("no torchtitan.toml" in n and "unequal microbatches" in n for n in got["notes"])
    assert not (tmp_path / "unequal" / "torchtitan.toml").exists()
    save_plan(placed_plan([0, 1, 2, 3, 4], [0, 1, 2, 3], 8, [[1] * 8] * 4, one_f_one_b(4, 8)), tmp_path / "eq.json",
              profile="prof.json")  # fmt: skip
    res = CliRunner().invoke(cli, ["export", str(tmp_path / "eq.json"), "--format", "torchtitan",
                                   "--out", str(tmp_path / "tt"), "--json"])  # fmt: skip
    assert res.exit_code == 0, res.output
    files = json.loads(res.output)["files"]
    assert sorted(Path(f).name for f in files) == sorted(["torchtitan.toml", PLAN_FILE, RECIPE_FILE])
    recipe = _load(tmp_path / "tt" / RECIPE_FILE)
    assert recipe.MODULE_FQNS_PER_MODEL_PART == [["l0"], ["l1"], ["l2"], ["l3"]]
    assert load_plan_file(recipe.PLAN).plan == load_plan_file(tmp_path / "eq.json").plan


@pytest.mark.slow
def test_torchtitan_steps_with_the_recipe_give_single_process_gradients(tmp_path: Path) -> None:
    plan = _plan()
    (tmp_path / RECIPE_FILE).write_text(plan_schedule_recipe(plan, NAMES, "plan.json"))
    (tmp_path / PLAN_FILE).write_text(json.dumps(plan.to_json()))
    per_rank = launch(titan_worker, 2, (str(tmp_path),), LaunchConfig(timeout_s=60))
    model = TitanLike()
    x, y = batch()
    loss = torch.nn.functional.mse_loss(model(x, input_batch=x), y)
    loss.backward()
    want = dict(model.named_parameters())
    got = {k: v for r in per_rank for k, v in r.items()}
    torch.testing.assert_close(got.pop("loss"), loss.detach(), rtol=1e-12, atol=0)
    assert len(got) == len(want)
    for key, grad in got.items():
        name = key.split(":", 1)[1]
        torch.testing.assert_close(grad, want[name].grad, rtol=1e-10, atol=1e-12, msg=key)
