"""Memory in the cost model's own terms, measured on one process: what docs/model.md section 5 predicts.

The model predicts a rank's peak memory as its training state (``state_factor``
bytes per parameter byte: weights, gradients, optimizer states) plus the
highest level its stashed activations reach. A device's allocator counts more
than that (receive buffers, workspace, fragmentation) and a CPU has no such
counter at all, so :class:`MemoryTally` counts the model's terms themselves:

- **saved tensors**: the bytes autograd keeps for backwards, through
  :func:`torch.autograd.graph.saved_tensors_hooks` (thread-local, so wrapping
  a call is enough: the code inside is not changed). A saved tensor counts
  the bytes of its extent in its storage, not the whole storage (a
  microbatch's rows of the batch are that microbatch's bytes), and every
  byte of a storage counts once, however many saved tensors (overlapping
  views, the same tensor saved by two nodes) keep it: per storage, keyed by
  device and ``data_ptr``, the extents held are reference-counted and the
  count is the length of their union; each pack returns a small wrapper
  whose death (``weakref.finalize``) drops its extent, so bytes leave the
  count when autograd has freed the last saved view over them. Tensors a
  stage keeps outside autograd (a recomputing stage's inputs) are counted
  the same way while registered with :meth:`MemoryTally.hold`. Parameters are left out (they are state, not
  activations), as the profiler leaves them out of ``stash_bytes``
  (:func:`umsearch.measure.stash.saved_bytes`); what autocast saves (the
  low-precision copies of weights) counts, as there.
- **parameters**, each storage once (a weight tied between two stages of the rank, once);
- **gradients**, counted from when each first appears
  (``register_post_accumulate_grad_hook``; a gradient set by assignment, as
  torch's split backward sets a weight's, at the next event); gradients
  present when the tally starts count from the start;
- **optimizer states**, the tensors of ``optimizer.state`` at the start and at
  the end (an optimizer makes them at its first step; they stay after).

The peak is the largest ``parameters + optimizer states + gradients +
saved`` at any moment a saved tensor or a gradient appears.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from contextvars import ContextVar
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import torch

_ACTIVE: ContextVar[MemoryTally | None] = ContextVar("umsearch_memory_tally", default=None)
"""The tally counting in this thread (or task), if any: code that keeps tensors outside autograd registers
them through :func:`held` without knowing whether anything counts."""


def held(t: torch.Tensor) -> object | None:
    """Register ``t`` with the tally counting here (:meth:`MemoryTally.hold`) until the returned token is
    dropped; None when no tally counts."""
    tally = _ACTIVE.get()
    return None if tally is None else tally.hold(t)


StorageKey = tuple[str, int]
"""``(device, data_ptr)`` of a storage: pointers of different devices may coincide."""


Extent = tuple[int, int]
"""``[start, end)`` in bytes of a storage."""


def _key(t: torch.Tensor) -> tuple[StorageKey, int]:
    storage = t.untyped_storage()
    return (str(t.device), storage.data_ptr()), storage.nbytes()


def extent(t: torch.Tensor) -> Extent:
    """The bytes of its storage that ``t`` reaches: from its first element to one past its last (empty for no
    elements). Strides may leave gaps inside (a column of a matrix): those count, as an allocator's block would."""
    if t.numel() == 0:
        return 0, 0
    item = t.element_size()
    lo = hi = t.storage_offset()
    for size, stride in zip(t.shape, t.stride(), strict=True):
        if stride >= 0:
            hi += (size - 1) * stride
        else:
            lo += (size - 1) * stride
    return int(lo) * item, (int(hi) + 1) * item


def union_bytes(extents: Iterable[Extent]) -> int:
    """Length of the union of ``[start, end)`` extents."""
    total, reach = 0, None
    for lo, hi in sorted(e for e in extents if e[1] > e[0]):
        if reach is None or lo > reach:
            total += hi - lo
            reach = hi
        elif hi > reach:
            total += hi - reach
            reach = hi
    return total


def storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (each once)."""
    seen: dict[StorageKey, int] = {}
    for t in tensors:
        key, nbytes = _key(t)
        seen[key] = max(seen.get(key, 0), nbytes)
    return sum(seen.values())


def optimizer_state_bytes(optimizer: torch.optim.Optimizer | None) -> int:
    """Bytes of the tensors an optimizer keeps per parameter (momentum, Adam's moments), each storage once."""
    if optimizer is None:
        return 0
    return storage_bytes(v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor))


@dataclass(frozen=True, kw_only=True)
class Tally:
    """What a :class:`MemoryTally` counted over one span (bytes)."""

    param_bytes: int
    """Parameters."""
    grad_bytes: int
    """Gradients at their most (usually the end)."""
    optimizer_bytes: int
    """Optimizer states (the larger of the start and the end)."""
    saved_peak_bytes: int
    """The most bytes autograd held saved at once: the measured counterpart of the model's peak activations."""
    saved_end_bytes: int
    """Saved bytes still held when the span ended (0 once every backward has run)."""
    peak_bytes: int
    """Largest parameters + optimizer states + gradients + saved tensors at any moment."""

    @property
    def state_bytes(self) -> int:
        """Parameters, gradients and optimizer states: the measured counterpart of docs/model.md 5's
        ``state_factor * (P - T)`` (a weight tied between stages of the rank counts once here, as there)."""
        return self.param_bytes + self.grad_bytes + self.optimizer_bytes

    def to_json(self) -> dict[str, int]:
        return {"param_bytes": self.param_bytes, "grad_bytes": self.grad_bytes,
                "optimizer_bytes": self.optimizer_bytes, "saved_peak_bytes": self.saved_peak_bytes,
                "saved_end_bytes": self.saved_end_bytes, "peak_bytes": self.peak_bytes}  # fmt: skip


class _Saved:
    """What autograd keeps instead of a saved tensor while the tally runs (its death releases the storage)."""

    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


def _unpack(saved: Any) -> torch.Tensor:
    return saved.tensor if isinstance(saved, _Saved) else saved


class MemoryTally:
    """Count the model's memory terms while the ``with`` block runs (module docstring).

    ``params``: the parameters of the stages the code runs; ``optimizer``: the one stepping them (None:
    no optimizer states). Use one tally per span; read :meth:`result` after (or during) the block.
    """

    def __init__(self, params: Iterable[torch.Tensor], optimizer: torch.optim.Optimizer | None = None) -> None:
        self.params = list(params)
        self.optimizer = optimizer
        self._exclude = {_key(p)[0] for p in self.params}
        self._held: dict[StorageKey, dict[Extent, int]] = {}  # storage -> extent -> references
        self._sizes: dict[StorageKey, int] = {}  # storage -> bytes of its extents' union
        self._graded: set[int] = set()
        self._ungraded: list[torch.Tensor] = []
        self.saved = 0
        self.grads = 0
        self.saved_peak = 0
        self._peak_dynamic = 0
        self._optimizer_start = 0
        self._optimizer_end: int | None = None
        self._hooks: Any = None
        self._active: Any = None
        self._handles: list[Any] = []

    # ------------------------------------------------------------------ counting
    def _bump(self) -> None:
        self._scan_grads()
        self.saved_peak = max(self.saved_peak, self.saved)
        self._peak_dynamic = max(self._peak_dynamic, self.saved + self.grads)

    def _recount(self, key: StorageKey) -> None:
        held = self._held.get(key)
        now = union_bytes(held) if held else 0
        self.saved += now - self._sizes.get(key, 0)
        if held:
            self._sizes[key] = now
        else:
            self._sizes.pop(key, None)
            self._held.pop(key, None)
        self._bump()

    def _add(self, t: torch.Tensor, owner: object) -> None:
        """Count ``t``'s extent until ``owner`` dies."""
        key, _ = _key(t)
        ext = extent(t)
        if ext[1] <= ext[0] or key in self._exclude:
            return
        held = self._held.setdefault(key, {})
        held[ext] = held.get(ext, 0) + 1
        self._recount(key)
        weakref.finalize(owner, self._release, key, ext)

    def _pack(self, t: torch.Tensor) -> _Saved:
        # Detached: a node that saves its own output would otherwise keep itself alive through the
        # wrapper (output -> grad_fn -> saved variable -> wrapper -> output), a cycle through C++.
        wrapper = _Saved(t.detach())
        self._add(t, wrapper)
        return wrapper

    def _release(self, key: StorageKey, ext: Extent) -> None:
        held = self._held[key]
        held[ext] -= 1
        if not held[ext]:
            del held[ext]
        self._recount(key)

    def hold(self, t: torch.Tensor) -> object:
        """Count ``t`` (a tensor kept outside autograd, such as a recomputing stage's input) until the returned
        token is dropped; its bytes count once with whatever saved tensors share them."""
        token = _Saved(t)
        self._add(t, token)
        return token

    def _count_grad(self, p: torch.Tensor) -> None:
        if self._add_grad(p):
            self._bump()

    def _add_grad(self, p: torch.Tensor) -> bool:
        """Count ``p``'s gradient once, if it has one now; whether it was counted now."""
        if id(p) in self._graded or p.grad is None:
            return False
        self._graded.add(id(p))
        self.grads += p.grad.numel() * p.grad.element_size()
        return True

    def _scan_grads(self) -> None:
        # torch's split backward sets a weight's gradient by assignment (``weight.grad = dw`` in
        # pipelining/_backward.py), which no accumulate hook sees: look for such gradients at every event.
        if self._ungraded:
            self._ungraded = [p for p in self._ungraded if not self._add_grad(p)]

    # ------------------------------------------------------------------ the span
    def __enter__(self) -> MemoryTally:
        for p in self.params:
            self._count_grad(p)
            if p.requires_grad:
                self._handles.append(p.register_post_accumulate_grad_hook(self._count_grad))
        self._ungraded = [p for p in self.params if id(p) not in self._graded]
        self._optimizer_start = optimizer_state_bytes(self.optimizer)
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)
        self._hooks.__enter__()
        self._active = _ACTIVE.set(self)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._bump()  # a gradient assigned after the last saved-tensor event
        self._hooks.__exit__(kind, exc, tb)
        _ACTIVE.reset(self._active)
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._optimizer_end = optimizer_state_bytes(self.optimizer)

    def result(self) -> Tally:
        """The counts so far (final once the block has ended)."""
        optimizer = max(self._optimizer_start, self._optimizer_end or 0)
        params = storage_bytes(self.params)
        return Tally(param_bytes=params, grad_bytes=self.grads, optimizer_bytes=optimizer,
                     saved_peak_bytes=self.saved_peak, saved_end_bytes=self.saved,
                     peak_bytes=params + optimizer + self._peak_dynamic)  # fmt: skip
