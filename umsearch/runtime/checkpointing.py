"""Full activation checkpointing of torch's own schedules: every layer under non-reentrant ``torch.utils.checkpoint``.

umsearch's runtime recomputes a ``recompute`` stage itself; torch's schedule classes know nothing of it, so a
torch contender whose plan marks its stages ``recompute`` (torchtitan's ``activation_checkpoint.mode = "full"``)
runs with every layer of those stages wrapped while it steps: each layer keeps its input only and runs its
forward again in the backward. The wrapping is on the very modules (the same ``PipelineStage`` objects run
with and without it) and is undone when the block ends.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Sequence
from typing import Any


@contextlib.contextmanager
def checkpointed(layers: Sequence[Any]) -> Iterator[None]:
    """Every module of ``layers`` runs its forward under non-reentrant ``torch.utils.checkpoint`` inside the
    block (full activation checkpointing: each layer keeps its input only and recomputes in the backward);
    a module listed twice, or already checkpointed by an enclosing block, is wrapped once. On leaving, every
    module it wrapped runs its own ``forward`` again."""
    from torch.utils.checkpoint import checkpoint

    mods = [m for m in {id(m): m for m in layers}.values() if not is_checkpointed(m)]
    for m in mods:
        m.forward = functools.partial(checkpoint, m.forward, use_reentrant=False)
    try:
        yield
    finally:
        for m in mods:
            del m.forward


def is_checkpointed(module: Any) -> bool:
    """Whether ``module``'s forward runs under ``torch.utils.checkpoint`` (inside a :func:`checkpointed` block)."""
    from torch.utils.checkpoint import checkpoint

    own = vars(module).get("forward")
    return isinstance(own, functools.partial) and own.func is checkpoint


def stage_layers(stage_modules: Sequence[Any], recompute: Sequence[bool]) -> list[Any]:
    """The layers (children) of every stage module whose stage recomputes (``recompute``, stage for stage)."""
    return [layer for mod, rec in zip(stage_modules, recompute, strict=True) if rec for layer in mod.children()]
