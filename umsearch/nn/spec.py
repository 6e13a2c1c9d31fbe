"""A built model: its pipeline layers, how to make a batch, and its loss."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


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
    notes: tuple[str, ...] = ()
    """What the user should know about how the model was built (a weight untied, ...)."""
