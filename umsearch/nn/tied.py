"""Which model layers share a weight (tied input and output embeddings), as the model builder marks it.

The builder marks the shared parameter with the indexes of the model's layers that hold it; the runtime
(:mod:`umsearch.runtime.tied`) reads the mark on any rank that holds one of those layers, and from the plan
knows the other ranks to sum its gradient with. A mark is an attribute of the parameter object, so it
lives as long as the object does (a deep copy of the module drops it: name the tie to ``PlanSchedule`` then).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

MARK = "_umsearch_tied_layers"
"""The attribute :func:`mark_tied` sets on a shared parameter: the model layers that hold it."""


def mark_tied(param: torch.nn.Parameter, layers: Sequence[int]) -> None:
    """Record on ``param`` that model layers ``layers`` (indexes of the model's layer list) share it."""
    setattr(param, MARK, tuple(sorted(set(layers))))


def tied_layers(param: torch.Tensor) -> tuple[int, ...]:
    """The model layers :func:`mark_tied` recorded on ``param``; empty when it is not marked."""
    return tuple(getattr(param, MARK, ()))
