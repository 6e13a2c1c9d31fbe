"""Which model a profile or plan is for: a zoo name or an import path, plus its arguments."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from umsearch.core.errors import ProfilingError


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """A rebuildable model reference, recorded in profiles (``model_spec``) and plans (``model``)."""

    source: str
    """Zoo name (``gpt``, ``vgg16``, ``mlp``) or ``package.module:function``."""
    args: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments (JSON scalars) for the builder."""

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "args": dict(self.args)}

    @classmethod
    def from_json(cls, obj: Any) -> ModelSpec:
        if not isinstance(obj, dict) or not isinstance(obj.get("source"), str):
            raise ProfilingError(f"model spec must be {{'source': str, 'args': {{...}}}}, got {obj!r}")
        return cls(source=obj["source"], args=dict(obj.get("args") or {}))


def parse_arg(text: str) -> tuple[str, Any]:
    """``k=v`` with ints, floats and booleans auto-typed."""
    if "=" not in text:
        raise ProfilingError(f"--arg {text!r} must look like KEY=VALUE, e.g. --arg layers=14")
    key, raw = text.split("=", 1)
    value: Any = raw
    if raw.lower() in ("true", "false"):
        value = raw.lower() == "true"
    else:
        for cast in (int, float):
            try:
                value = cast(raw)
                break
            except ValueError:
                pass
    return key.strip(), value


@dataclass(frozen=True)
class BuiltModel:
    """A model split into pipeline layers, with its data and loss."""

    layers: list[torch.nn.Module]
    """Layers ``0..L-1`` (the nn.Sequential convention)."""
    names: list[str]
    """One name per layer."""
    make_batch: Callable[[int, torch.Generator], tuple[torch.Tensor, torch.Tensor]]
    """``(b, generator) -> (inputs, targets)`` for b independent samples."""
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    """Mean loss over the samples given."""
