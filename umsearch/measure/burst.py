"""Timing one cell once: a burst of forwards with their graphs kept, then their backwards.

A pipeline stage keeps each forward's graph until that microbatch's backward,
so its forwards write memory the previous ones have not freed and its
backwards read stashes that have left the cache. Timing forwards in a loop
that frees each output reuses hot memory instead: on this project's CPU such
forwards came out 25-35% faster than the same forwards inside the runtime. So
a burst runs ``in_flight`` forwards, every graph kept, then their backwards,
last first.

The backwards alternate between a full backward ``B`` and the split ``I`` of
zero-bubble schedules; the ``W`` of each split one runs after all of the
burst's ``B`` and ``I``, deferred as a zero-bubble schedule defers it. All
three use the runtime's own functions (:mod:`umsearch.nn.backward`), so
the profile times exactly what the runtime runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from umsearch.core.errors import ProfilingError
from umsearch.nn.backward import WeightWork, backward_full, backward_input, backward_weight

QUANTITIES = ("fwd", "bwd", "bwd_input", "bwd_weight")
"""What a burst times, named as the profile's ``{q}_ms`` fields."""

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class Unit:
    """What one burst runs: a module (one layer or a range of layers) on its real input."""

    module: torch.nn.Module
    """The layer (or ``nn.Sequential`` of layers) to time."""
    x: torch.Tensor
    """Its input: the real output of the layer before (or the data)."""
    y: torch.Tensor
    """Targets of the loss (used when ``last``)."""
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    """The model's loss."""
    first: bool
    """The unit starts the model: its input is data and needs no gradient (as on stage 0)."""
    last: bool
    """The unit ends the model: the loss is part of its forward (as on the last stage)."""


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(device: torch.device, fn: Callable[..., T], *args: Any) -> tuple[T, float]:
    """``fn(*args)`` and its wall time in ms, device work included."""
    _sync(device)
    t = time.perf_counter()
    out = fn(*args)
    _sync(device)
    return out, (time.perf_counter() - t) * 1e3


def leaf(x: torch.Tensor, first: bool) -> torch.Tensor:
    """A fresh autograd leaf on ``x``: requiring grad unless it is data (first layer) or not float."""
    x = x.detach()
    if not first and x.is_floating_point():
        x.requires_grad_(True)
    return x


def _forward(unit: Unit, x: torch.Tensor) -> torch.Tensor:
    out = unit.module(x)
    if not isinstance(out, torch.Tensor):
        raise ProfilingError(f"layer {type(unit.module).__name__} returned {type(out).__name__}, not a tensor; "
                             "each layer must map one tensor to one tensor")  # fmt: skip
    return unit.loss(out, unit.y) if unit.last else out


def burst(unit: Unit, *, device: torch.device, in_flight: int, split: bool) -> dict[str, list[float]]:
    """Samples (ms) of every quantity from ``in_flight`` forwards and their backwards.

    Forwards: ``in_flight`` samples. Backwards, last forward first: the odd ones run
    ``I`` (when ``split``), the others ``B``; then the ``W`` of every ``I``. A unit whose output
    needs no gradient (a parameter-free first layer) has no backward: its backward samples are 0.
    """
    params = [p for p in unit.module.parameters() if p.requires_grad]
    leaves = [leaf(unit.x, unit.first) for _ in range(in_flight)]
    roots: list[torch.Tensor] = []
    out: dict[str, list[float]] = {q: [] for q in QUANTITIES}
    for x in leaves:
        root, ms = timed(device, _forward, unit, x)
        roots.append(root)
        out["fwd"].append(ms)
    if not roots[0].requires_grad:
        n = in_flight - in_flight // 2 if split else in_flight
        out.update(bwd=[0.0] * n, bwd_input=[0.0] * (in_flight - n), bwd_weight=[0.0] * (in_flight - n))
        return out
    grad = None if unit.last else torch.ones_like(roots[0])
    works: list[WeightWork] = []
    for j in reversed(range(in_flight)):
        # Popped, so that each graph is freed by its backward as in a pipeline stage.
        root, x = roots.pop(), leaves.pop()
        if split and j % 2 == 1:
            (_, work), ms = timed(device, backward_input, root, grad, [x], params)
            works.append(work)
            out["bwd_input"].append(ms)
        else:
            out["bwd"].append(timed(device, backward_full, root, grad, [x], params)[1])
        del root, x
    for work in works:
        out["bwd_weight"].append(timed(device, backward_weight, work)[1])
    works.clear()
    unit.module.zero_grad(set_to_none=True)
    return out
