"""Bytes a layer's forward keeps for its backward, as autograd really saves them."""

from __future__ import annotations

from collections.abc import Callable

import torch


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes of ``t``'s elements."""
    return t.numel() * t.element_size()


def saved_bytes(
    module: torch.nn.Module, x: torch.Tensor, then: Callable[[torch.Tensor], object] | None = None
) -> tuple[torch.Tensor, int]:
    """Run ``module(x)`` recording the bytes autograd saves, shared storage once, parameters excluded.

    ``then`` (the loss, on the last layer) runs on the output inside the recording: what the
    loss saves is also kept until the last stage's backward.
    """
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params:
            seen[ptr] = max(seen.get(ptr, 0), t.untyped_storage().nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = module(x)
        if then is not None and isinstance(out, torch.Tensor):
            then(out)
    return out, sum(seen.values())
