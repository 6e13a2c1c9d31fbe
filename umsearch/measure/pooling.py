"""Structural identity of layers: which layers are the same computation and share one estimate.

Two layers are identical when their module trees have the same types and
hyperparameters (``extra_repr``: kernel sizes, eps, head counts, ...), the
same parameter and buffer shapes and dtypes, the same role in the model (the
first layer gets data and owes no input gradient; the last one carries the
loss), and, at every measured size, the same input and output shapes and the
same stash bytes. Such layers cost the same up to noise, so they are measured
as one group (at whichever members a round's bursts hold:
:func:`umsearch.measure.rounds.cover_windows`) and all get the group's values:
identical layers get identical estimates, and the noise of one member is
averaged with the others'.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch

Signature = tuple[Hashable, ...]


def module_signature(module: torch.nn.Module) -> Signature:
    """Types, hyperparameters, parameter and buffer shapes of ``module``'s whole tree."""
    tree = tuple((name, f"{type(m).__module__}.{type(m).__qualname__}", m.extra_repr())
                 for name, m in module.named_modules())  # fmt: skip
    params = tuple((name, tuple(p.shape), str(p.dtype), p.requires_grad) for name, p in module.named_parameters())
    buffers = tuple((name, tuple(b.shape), str(b.dtype)) for name, b in module.named_buffers())
    return (tree, params, buffers)


def tensor_signature(t: torch.Tensor) -> Signature:
    """Shape, dtype and device of a tensor (not its values)."""
    return (tuple(t.shape), str(t.dtype), str(t.device))


def pool_groups(keys: Sequence[Hashable]) -> list[list[int]]:
    """Indices grouped by equal key, groups ordered by their first member (singletons included)."""
    groups: dict[Hashable, list[int]] = {}
    for i, key in enumerate(keys):
        groups.setdefault(key, []).append(i)
    return list(groups.values())
