"""Bytes a layer's forward keeps for its backward, as autograd really saves them."""

from __future__ import annotations

from collections.abc import Callable

import torch


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes of ``t``'s elements."""
    return t.numel() * t.element_size()


class Saved(dict[int, torch.Tensor]):
    """The storages a forward saved: ``data_ptr`` -> a tensor on that storage. Holding the tensors keeps the
    storages alive, so that a pointer seen again later is the same storage, never a reused address."""

    def nbytes(self, ptr: int) -> int:
        return self[ptr].untyped_storage().nbytes()

    def total(self) -> int:
        """Bytes of all the storages, each once."""
        return sum(self.nbytes(ptr) for ptr in self)


def saved_bytes(
    module: torch.nn.Module, x: torch.Tensor, then: Callable[[torch.Tensor], object] | None = None
) -> tuple[torch.Tensor, int]:
    """Run ``module(x)`` recording the bytes autograd saves, shared storage once, parameters excluded.

    ``then`` (the loss, on the last layer) runs on the output inside the recording: what the
    loss saves is also kept until the last stage's backward.
    """
    out, seen = saved_storages(module, x, then)
    return out, seen.total()


def saved_storages(
    module: torch.nn.Module, x: torch.Tensor, then: Callable[[torch.Tensor], object] | None = None
) -> tuple[torch.Tensor, Saved]:
    """:func:`saved_bytes`, storage by storage: which storages the forward saved (held while the result is)."""
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    seen = Saved()

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params:
            seen.setdefault(ptr, t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = module(x)
        if then is not None and isinstance(out, torch.Tensor):
            then(out)
    return out, seen


def shared_bytes(before: Saved, now: Saved) -> int:
    """Bytes of the storages both forwards saved (a layer's saved output that the next layer saves as its
    input: a stage running both keeps it once). ``before`` must still be held when ``now`` is recorded."""
    return sum(now.nbytes(ptr) for ptr in now if ptr in before)


def input_saved_bytes(saved: Saved, x: torch.Tensor) -> int:
    """Bytes of ``x``'s storage among what a forward saved: the part of its input a layer keeps itself."""
    ptr = x.untyped_storage().data_ptr()
    return saved.nbytes(ptr) if ptr in saved else 0
