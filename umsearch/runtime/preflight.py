"""Checks made before a plan runs: a plan that cannot run is refused with the reason.

The launching process runs :func:`preflight` (deadlock, layer count) before it
starts anything; every rank runs :func:`rank_preflight` on the model it has
built anyway (layer count, ``make_batch``, deadlock) before it talks to a
peer, so a plan started straight with torchrun is refused just the same.
"""

from __future__ import annotations

import torch

from umsearch.core.cost import CostModel
from umsearch.core.errors import PlanError
from umsearch.core.plan import Plan, validate_plan
from umsearch.core.profile import LayerProfile, Link, Profile
from umsearch.runtime.model import ModelFactory, ModelLike
from umsearch.sim.reference import SimResult, simulate


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


def check_deadlock(plan: Plan, cost: CostModel | None = None) -> SimResult:
    """Simulate ``plan`` (under ``cost``, else unit times); raise PlanError when it deadlocks."""
    res = simulate(plan, cost or structural_cost(plan.stages[-1].hi))
    if res.deadlock:
        raise PlanError(
            "the plan deadlocks (" + "; ".join(res.blocked) + "); raise the warmup of the stuck "
            "stages or align their microbatches with the neighbour's"
        )
    return res


def check_layers(plan: Plan, num_layers: int, what: str = "the model") -> None:
    """Raise PlanError unless ``plan``'s stages tile exactly ``num_layers`` layers of ``what``."""
    validate_plan(plan)
    covered = plan.stages[-1].hi
    if covered != num_layers:
        raise PlanError(
            f"the plan covers layers [0, {covered}) but {what} has {num_layers} layers; the last stage "
            f"must end at layer {num_layers} (search again with a profile of this model)"
        )


def check_batch(plan: Plan, model: ModelLike) -> None:
    """Raise PlanError unless ``model.make_batch(B)`` gives ``B`` samples on dim 0."""
    B = plan.global_batch
    inputs, targets = model.make_batch(B, torch.Generator().manual_seed(0))
    for what, t in (("inputs", inputs), ("targets", targets)):
        if not isinstance(t, torch.Tensor) or t.dim() == 0 or t.shape[0] != B:
            got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise PlanError(
                f"the model's make_batch({B}) returns {what} of shape {got}, not {B} samples on dim 0; "
                "fix make_batch so that it returns global_batch samples"
            )


def check_model(plan: Plan, model: ModelLike) -> None:
    """Raise PlanError when ``plan`` does not fit ``model``'s layers or batches."""
    check_layers(plan, len(model.layers))
    check_batch(plan, model)


def count_layers(factory: ModelFactory) -> int:
    """How many layers ``factory`` builds, cheaply where possible.

    Built on the ``meta`` device, modules allocate and initialise no weights, so
    counting the layers of a large model costs next to nothing; a builder that
    cannot run on ``meta`` (it reads tensor values, loads a file) is built for real.
    """
    try:
        with torch.device("meta"):
            return len(factory().layers)
    except Exception:  # noqa: BLE001 - any failure on meta: fall back to the real build below
        pass
    return len(factory().layers)


def preflight(plan: Plan, factory: ModelFactory, cost: CostModel | None = None) -> SimResult:
    """The launching process's checks: the plan fits the model's layers and does not deadlock.

    Returns the simulation under ``cost`` (unit times without one), so callers
    that also want the prediction simulate only once.
    """
    check_layers(plan, count_layers(factory))
    return check_deadlock(plan, cost)


def rank_preflight(plan: Plan, model: ModelLike) -> None:
    """A rank's checks on the model it built, before it talks to any peer."""
    check_model(plan, model)
    check_deadlock(plan)
