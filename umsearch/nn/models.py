"""Models umsearch can profile and run: the zoo and user modules."""

from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType

import torch

from umsearch.core.model_spec import ModelSpec, parse_arg
from umsearch.errors import ModelSpecError, ProfilingError
from umsearch.nn.spec import BuiltModel
from umsearch.nn.zoo import ZOO, build_zoo

__all__ = ["ZOO", "BuiltModel", "ModelSpec", "build_model", "import_user_module", "parse_arg"]


def build_model(spec: ModelSpec, *, seed: int = 0) -> BuiltModel:
    """Build ``spec`` with weights fixed by ``seed`` (every rank builds the same model).

    User models: ``package.module:function``, the module looked up first in the
    current working directory, as ``python -m`` does (:func:`import_user_module`);
    ``function(**args)`` returns
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
    if spec.is_hf:
        from umsearch.nn.hf import build_hf

        return build_hf(spec.source, spec.args)
    if ":" not in spec.source:
        return build_zoo(spec.source, spec.args)
    module_name, func_name = spec.source.split(":", 1)
    try:
        module = import_user_module(module_name)
    except Exception as exc:
        raise ProfilingError(f"cannot import {module_name!r} for model {spec.source!r} (looked up in the current "
                             f"folder {os.getcwd()}, then on the Python path): {type(exc).__name__}: {exc}") from None  # fmt: skip
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


def import_user_module(name: str) -> ModuleType:
    """Import a user model's module as ``python -m`` would: the current working directory first on the path.

    The ``umsearch`` console script, unlike ``python -m umsearch``, does not put the
    working directory on ``sys.path``, so ``umsearch profile examples.hf_gpt2:build``
    from the repository root would not find ``examples``. The directory stays on the
    path (as under ``python -m``) for the imports the module makes later; the ranks of
    ``umsearch run`` start in the same directory with it on their ``PYTHONPATH``
    (:mod:`umsearch.runtime.launch`). Only trusted specs get here (:func:`build_model`).
    """
    cwd = os.getcwd()
    if not any(_same_dir(p, cwd) for p in sys.path):
        sys.path.insert(0, cwd)
        importlib.invalidate_caches()
    return importlib.import_module(name)


def _same_dir(entry: str, cwd: str) -> bool:
    try:
        return os.path.samefile(entry or os.curdir, cwd)
    except OSError:
        return False
