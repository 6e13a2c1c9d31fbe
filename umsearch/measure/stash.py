"""Bytes a layer's forward keeps for its backward, as autograd really saves them."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence

import torch

from umsearch.nn.backward import backward_input


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


def weight_saved_bytes(
    module: torch.nn.Module, x: torch.Tensor, then: Callable[[torch.Tensor], torch.Tensor] | None = None
) -> int:
    """Bytes of the storages ``module(x)`` saved (parameters excluded) that its graph still holds after the
    input-gradient half ``I`` (:func:`umsearch.nn.backward.backward_input`): what ``W`` needs. ``then``
    (the loss, on the last layer) makes the scalar the backward starts from. Runs its own forward."""
    params = [p for p in module.parameters() if p.requires_grad]
    skip = {p.untyped_storage().data_ptr() for p in module.parameters()}
    packed: list[weakref.ref[torch.Tensor]] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.untyped_storage().data_ptr() in skip:
            return t
        alias = t.detach()  # only the graph holds this object: alive after I exactly while the graph keeps it
        packed.append(weakref.ref(alias))
        return alias

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = module(x)
        root = then(out) if then is not None else out
    _, work = backward_input(root, None if then is not None else torch.ones_like(root), [x], params)
    del out, root
    held = Saved()
    for ref in packed:
        alias = ref()
        if alias is not None:
            held.setdefault(alias.untyped_storage().data_ptr(), alias)
    total = held.total()
    del work, held
    return total


def fixed_and_per_sample(sizes: Sequence[int], saved: Sequence[float]) -> tuple[float, float]:
    """Bytes a forward saved at ``sizes`` (ascending, at least two) as ``fixed + per_sample * b``: the line
    through the two largest sizes (as docs/model.md 1 extends times), its fixed part (a mask, position ids, a
    loss's scalars: saved per microbatch whatever its size) within ``[0, saved[-1]]``. Returns ``(fixed,
    per_sample)``; the line gives exactly what the largest size saved."""
    (m1, s1), (m2, s2) = (sizes[-2], saved[-2]), (sizes[-1], saved[-1])
    fixed = min(max((s1 * m2 - s2 * m1) / (m2 - m1), 0.0), s2)  # the intercept, one rounding: 0 stays 0
    return fixed, (s2 - fixed) / m2
