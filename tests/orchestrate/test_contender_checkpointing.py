"""A torch contender whose plan recomputes runs with full activation checkpointing.

Two gloo processes, torch's 1F1B and ZBV schedules on a small MLP whose layers save more than their input: each peer plan once plain and once
with every stage ``recompute`` (the search's full-AC baseline), on the very same ``PipelineStage``
objects. The checkpointed step gives the plain step's gradients exactly and a lower measured peak (the one
tune's memory limit reads); checkpointing is undone after the step.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import pytest
import torch

from tests.runtime.helpers import peer_plan
from umsearch.core.plan import Plan
from umsearch.nn.spec import BuiltModel
from umsearch.orchestrate.contenders import make_runners
from umsearch.runtime.checkpointing import checkpointed, is_checkpointed
from umsearch.runtime.config import LaunchConfig, RunConfig
from umsearch.runtime.launch import launch

pytestmark = pytest.mark.slow

CFG = RunConfig(warmup_steps=1, lr=0.0, launch=LaunchConfig(timeout_s=120))
# Batches large enough that saved activations, not the small weights, set the peak.
SCHEDULES = {"1F1B": peer_plan("1F1B", 2, 1, 4, 256, 6), "ZBVZeroBubble": peer_plan("ZBVZeroBubble", 2, 2, 4, 256, 8)}


def mlp_model(layers: int) -> BuiltModel:
    """``layers`` float64 blocks 6 -> 24 -> 6, each saving its hidden activations (more than its input, which
    is all a checkpointed block keeps), and a plain MSE loss."""
    torch.manual_seed(0)
    mods: list[torch.nn.Module] = [torch.nn.Sequential(torch.nn.Linear(6, 24), torch.nn.Tanh(), torch.nn.Linear(24, 6),
                                                       torch.nn.Tanh()).double() for _ in range(layers)]  # fmt: skip

    def batch(b: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(b, 6, generator=g, dtype=torch.float64), torch.randn(b, 6, generator=g, dtype=torch.float64)

    return BuiltModel(mods, [f"l{i}" for i in range(layers)], batch, torch.nn.functional.mse_loss)


def full_ac(plan: Plan) -> Plan:
    return dataclasses.replace(plan, stages=tuple(dataclasses.replace(st, recompute=True) for st in plan.stages))


def ac_worker(rank: int, world: int, schedule: str) -> dict[str, Any]:
    """Launch target: per variant (plain, full AC), this rank's peak and gradients of one step, and whether
    any layer is left checkpointed after the step."""
    plain = SCHEDULES[schedule]
    jobs = [("torch", plain, schedule), ("torch", full_ac(plain), schedule)]
    runners = make_runners(rank, world, jobs, functools.partial(mlp_model, max(st.hi for st in plain.stages)), CFG)
    out: dict[str, Any] = {"same_stages": runners[0].sched is not runners[1].sched and
                           runners[0].params == runners[1].params}  # fmt: skip
    for name, runner in zip(("plain", "ac"), runners, strict=True):
        out[name] = (runner.peak_step(0)[1], [p.grad.clone() for p in runner.params])
    out["left_wrapped"] = any(is_checkpointed(m) for m in runners[1].model.layers)
    return out


@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
def test_a_full_ac_torch_contender_checkpoints_its_layers(schedule: str) -> None:
    for got in launch(ac_worker, 2, (schedule,), CFG.launch):
        assert got["same_stages"]
        (plain_peak, plain_grads), (ac_peak, ac_grads) = got["plain"], got["ac"]
        assert len(plain_grads) == len(ac_grads) > 0
        for a, b in zip(plain_grads, ac_grads, strict=True):
            assert torch.equal(a, b)
        assert ac_peak < plain_peak
        assert not got["left_wrapped"]


def test_checkpointed_blocks_nest_and_restore_the_modules_own_forward() -> None:
    layer = torch.nn.Linear(3, 3)
    own = layer.forward
    with checkpointed([layer, layer]):
        assert is_checkpointed(layer)
        with checkpointed([layer]):  # an enclosing block already wraps it: not twice
            assert layer.forward.args == (own,)  # type: ignore[attr-defined]
        assert is_checkpointed(layer)
    assert not is_checkpointed(layer) and layer.forward == own
