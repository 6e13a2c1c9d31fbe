"""Adapters that turn library blocks (Hugging Face and the like) into pipeline layers.

A pipeline layer takes one tensor and returns one tensor: that tensor is what
crosses a stage boundary. Many library blocks return a tuple whose first
element is the hidden state (attention weights and caches follow) and take
masks, position ids or rotary embeddings as extra arguments.
:class:`HiddenState` wraps such a block: it passes the extra arguments
(fixed, or computed from the incoming hidden state on the stage that runs the
block, so nothing but the hidden state crosses ranks) and keeps the first
output. :func:`check_layer_outputs` runs a batch through the layers once and
names the first layer whose output cannot be sent between stages.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from umsearch.errors import ModelSpecError

KwargsFn = Callable[[torch.Tensor], dict[str, Any]]


def first_tensor(out: Any) -> Any:
    """The hidden state of a block's output: the output itself, or the first element of a tuple,
    list or ``ModelOutput`` (anything else is returned unchanged, for the check to name)."""
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)) and out:
        return out[0]
    to_tuple = getattr(out, "to_tuple", None)  # transformers' ModelOutput
    if callable(to_tuple):
        items = to_tuple()
        return items[0] if items else out
    return out


class HiddenState(nn.Module):
    """``block`` as a pipeline layer: one tensor in, the first element of its output out.

    ``kwargs`` are passed on every call; ``make_kwargs(hidden)`` adds arguments
    computed from the incoming hidden state (an attention mask or position
    embeddings for its sequence length), so they are rebuilt on whichever rank
    runs the block rather than sent.
    """

    def __init__(self, block: nn.Module, *, kwargs: dict[str, Any] | None = None,
                 make_kwargs: KwargsFn | None = None) -> None:  # fmt: skip
        super().__init__()
        self.block = block
        self.kwargs = dict(kwargs or {})
        self.make_kwargs = make_kwargs

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        extra = dict(self.kwargs)
        if self.make_kwargs is not None:
            extra.update(self.make_kwargs(hidden))
        out = first_tensor(self.block(hidden, **extra))
        if not isinstance(out, torch.Tensor):
            raise ModelSpecError(f"{type(self.block).__name__} returned {type(out).__name__}, whose first element "
                                 "is no tensor; write a small nn.Module that returns the hidden state")  # fmt: skip
        return out


def check_layer_outputs(layers: Sequence[nn.Module], names: Sequence[str], inputs: torch.Tensor) -> None:
    """Run ``inputs`` through ``layers`` without gradients; raise :class:`ModelSpecError` naming the first
    layer whose output is not one tensor (only a tensor can be sent to the next stage)."""
    x: Any = inputs
    with torch.no_grad():
        for i, (layer, name) in enumerate(zip(layers, names, strict=True)):
            x = layer(x)
            if isinstance(x, torch.Tensor):
                continue
            kind = type(x).__name__
            fix = ("wrap it as umsearch.nn.adapters.HiddenState(block) to keep the first element"
                   if first_tensor(x) is not x and isinstance(first_tensor(x), torch.Tensor)
                   else "make it return one tensor (the state the next layer takes)")  # fmt: skip
            raise ModelSpecError(f"layer {i} ({name}) returns a {kind}, which cannot be sent between stages; {fix}")
