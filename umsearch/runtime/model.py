"""Which model a plan runs, and the slice of it one stage keeps.

A plan made by the search carries the model spec under ``meta["model"]``; a
hand-written plan may instead name a profile whose ``model_spec`` says it.
"""

from __future__ import annotations

import functools
import os
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch

from umsearch.core.errors import PlanError
from umsearch.core.plan import Plan, resolve_profile_path
from umsearch.core.profile import load_profile


class ModelLike(Protocol):
    """What the runtime needs of a model (:class:`umsearch.measure.models.BuiltModel` is one)."""

    @property
    def layers(self) -> Sequence[torch.nn.Module]: ...
    @property
    def make_batch(self) -> Callable[[int, torch.Generator], tuple[torch.Tensor, torch.Tensor]]: ...
    @property
    def loss(self) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]: ...


ModelFactory = Callable[[], ModelLike]
"""Builds the same model (same weights) every time it is called; must be picklable."""


def plan_model_spec(plan: Plan, plan_path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """The ``{"source", "args"}`` spec of the plan's model: its own, else its profile's."""
    where = f"{plan_path}: " if plan_path else ""
    fix = 'write it as "model": {"source": "gpt", "args": {"layers": 14}} (a zoo name or package.module:function)'
    spec = plan.meta.get("model")
    origin = "the plan's 'model'"
    if spec is None and plan.profile is not None:
        prof_path = resolve_profile_path(plan, plan_path or ".")
        if prof_path is not None and prof_path.exists():
            spec = load_profile(prof_path).extra.get("model_spec")
            origin = f"the 'model_spec' of profile {prof_path}"
    if spec is None:
        raise PlanError(
            f"{where}the plan names no model to run (no 'model' key, and no profile with a "
            f"'model_spec'); add one: {fix}"
        )
    if not isinstance(spec, dict) or not isinstance(spec.get("source"), str):
        raise PlanError(f"{where}{origin} must be an object with a 'source' string and 'args', got {spec!r}; {fix}")
    if not isinstance(spec.get("args", {}), dict):
        raise PlanError(f"{where}{origin} has 'args' {spec['args']!r}, not an object of keyword arguments; {fix}")
    return spec


def _build(spec: dict[str, Any], seed: int) -> ModelLike:
    from umsearch.core.errors import ProfilingError
    from umsearch.measure.models import ModelSpec, build_model

    try:
        return build_model(ModelSpec.from_json(spec), seed=seed)
    except ProfilingError as exc:
        # The builder's errors speak of profiling; here the model comes from the plan.
        raise PlanError(f"cannot build the plan's model {spec.get('source')!r}: {exc}; fix the plan's "
                        "'model' entry (or its profile's 'model_spec')") from None  # fmt: skip


def spec_factory(spec: dict[str, Any], seed: int = 0) -> ModelFactory:
    """A picklable factory building ``spec`` with weights fixed by ``seed``."""
    return functools.partial(_build, dict(spec), seed)


def stage_module(model: ModelLike, lo: int, hi: int) -> torch.nn.Sequential:
    """Layers ``[lo, hi)`` as one module; parameter names keep the global layer index."""
    return torch.nn.Sequential(OrderedDict((str(i), model.layers[i]) for i in range(lo, hi)))
