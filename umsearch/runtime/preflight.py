"""Checks made before any process starts: a plan that cannot run is refused with the reason."""

from __future__ import annotations

import torch

from umsearch.cost_model import CostModel
from umsearch.errors import PlanError
from umsearch.plan import Plan, validate_plan
from umsearch.profile import LayerProfile, Link, Profile
from umsearch.runtime.model import ModelLike
from umsearch.simulator import simulate


def structural_cost(num_layers: int) -> CostModel:
    """A cost model with unit layer times and a free link.

    Whether a plan deadlocks depends only on its op orders and message spans,
    not on durations, so any positive times answer that question.
    """
    layers = tuple(
        LayerProfile(name=f"layer{i}", fwd_ms=(1.0, 1.0), bwd_ms=(2.0, 2.0), out_bytes=0.0,
                     stash_bytes=0.0, param_bytes=0.0)
        for i in range(num_layers)
    )  # fmt: skip
    profile = Profile(model="structural", device="none", dtype="none", microbatch_sizes=(1, 2),
                      input_bytes=0.0, layers=layers, link=Link(latency_ms=0.0, bandwidth_gb_per_s=1.0))  # fmt: skip
    return CostModel(profile)


def check_deadlock(plan: Plan, cost: CostModel | None = None) -> None:
    """Raise PlanError when the simulator finds that ``plan`` deadlocks."""
    res = simulate(plan, cost or structural_cost(plan.stages[-1].hi))
    if res.deadlock:
        raise PlanError(
            "the plan deadlocks (" + "; ".join(res.blocked) + "); raise the warmup of the stuck "
            "stages or align their microbatches with the neighbour's"
        )


def check_model(plan: Plan, model: ModelLike) -> None:
    """Raise PlanError when ``plan`` does not fit ``model``'s layers or batches."""
    try:
        validate_plan(plan, len(model.layers))
    except PlanError as exc:
        raise PlanError(f"the plan does not fit the model: {exc}") from None
    B = plan.global_batch
    inputs, targets = model.make_batch(B, torch.Generator().manual_seed(0))
    for what, t in (("inputs", inputs), ("targets", targets)):
        if not isinstance(t, torch.Tensor) or t.dim() == 0 or t.shape[0] != B:
            got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise PlanError(
                f"the model's make_batch({B}) returns {what} of shape {got}, not {B} samples on dim 0; "
                "fix make_batch so that it returns global_batch samples"
            )


def preflight(plan: Plan, model: ModelLike, cost: CostModel | None = None) -> None:
    """Every check :func:`umsearch.runtime.run.run_plan` makes before launching."""
    check_model(plan, model)
    check_deadlock(plan, cost)
