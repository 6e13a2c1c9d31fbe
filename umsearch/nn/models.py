"""Models umsearch can profile and run: the zoo and user modules."""

from __future__ import annotations

import importlib

import torch

from umsearch.core.errors import ModelSpecError, ProfilingError
from umsearch.core.model_spec import ModelSpec, parse_arg
from umsearch.nn.spec import BuiltModel
from umsearch.nn.zoo import ZOO, build_zoo

__all__ = ["ZOO", "BuiltModel", "ModelSpec", "build_model", "parse_arg"]


def build_model(spec: ModelSpec, *, seed: int = 0) -> BuiltModel:
    """Build ``spec`` with weights fixed by ``seed`` (every rank builds the same model).

    User models: ``package.module:function``; ``function(**args)`` returns
    ``(layers, make_batch)`` or ``(layers, make_batch, loss)``, where ``layers``
    is an ``nn.Sequential`` or a list of modules, ``make_batch(b, generator)``
    returns ``(inputs, targets)`` for b independent samples, and ``loss(output,
    targets)`` the mean loss (default: cross-entropy for integer targets, else MSE).
    """
    if not spec.trusted:
        raise ModelSpecError(
            f"the model {spec.source!r} comes from a data file and would import and run that module's code; "
            "name it yourself (e.g. `umsearch run PLAN --model "
            f"{spec.source}`) or pass --trust-model-code if you trust the file"
        )
    torch.manual_seed(seed)
    if ":" not in spec.source:
        return build_zoo(spec.source, spec.args)
    module_name, func_name = spec.source.split(":", 1)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise ProfilingError(f"cannot import {module_name!r} for model {spec.source!r}: {type(exc).__name__}: {exc}") from None
    func = getattr(module, func_name, None)
    if not callable(func):
        raise ProfilingError(f"{module_name!r} has no function {func_name!r}; the model is given as package.module:function")
    got = func(**spec.args)
    if not isinstance(got, tuple) or len(got) not in (2, 3):
        raise ProfilingError(f"{spec.source} must return (layers, make_batch) or (layers, make_batch, loss), got {type(got).__name__}")
    layers = list(got[0])
    if not layers or not all(isinstance(m, torch.nn.Module) for m in layers):
        raise ProfilingError(f"{spec.source}: layers must be an nn.Sequential or a non-empty list of nn.Module")
    make_batch = got[1]

    def loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if y.dtype in (torch.int64, torch.int32):
            return torch.nn.functional.cross_entropy(out, y)
        return torch.nn.functional.mse_loss(out, y)

    names = [f"{type(m).__name__.lower()}{i}" for i, m in enumerate(layers)]
    return BuiltModel(layers, names, lambda b, g: make_batch(b, g), got[2] if len(got) == 3 else loss)
