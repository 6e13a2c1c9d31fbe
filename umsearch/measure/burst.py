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

On the CPU each call is timed by the wall clock. On a GPU a host sync around
every call would expose the host's launch time that a stage running its layers
back to back hides (a launch-bound layer timed that way looked twice as slow
as inside a stage), so calls are queued back to back on the stream between
CUDA events, and the host waits once, at the end of the burst
(:class:`Stopwatch`). Forwards run under the precision's autocast, and with
fp16 the loss is scaled as a loss scaler scales it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from umsearch.core.errors import ProfilingError
from umsearch.nn.backward import WeightWork, backward_full, backward_input, backward_weight
from umsearch.nn.precision import LossScaler, Precision

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
    precision: Precision = Precision("fp32")
    """Autocast of the forwards, loss scaling of the last unit."""


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


class Stopwatch:
    """Times a sequence of calls on ``device``; :meth:`times` gives their ms in call order.

    CPU: each call between two syncs (no-ops) on the wall clock, as :func:`timed`. CUDA: each call
    between two events recorded on the current stream, no host sync in between; :meth:`times`
    synchronizes once and reads the events.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._ms: list[float] = []
        self._events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []

    def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)``, timed."""
        if self.device.type != "cuda":
            out, ms = timed(self.device, fn, *args)
            self._ms.append(ms)
            return out
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = fn(*args)
        end.record()
        self._events.append((start, end))
        return out

    def times(self) -> list[float]:
        """Every call's ms, in call order (on CUDA after one synchronize)."""
        if self.device.type != "cuda":
            return list(self._ms)
        _sync(self.device)
        return [float(s.elapsed_time(e)) for s, e in self._events]


def leaf(x: torch.Tensor, first: bool) -> torch.Tensor:
    """A fresh autograd leaf on ``x``: requiring grad unless it is data (first layer) or not float."""
    x = x.detach()
    if not first and x.is_floating_point():
        x.requires_grad_(True)
    return x


def _forward(unit: Unit, x: torch.Tensor) -> torch.Tensor:
    with unit.precision.autocast(x.device):
        out = unit.module(x)
        if not isinstance(out, torch.Tensor):
            raise ProfilingError(f"layer {type(unit.module).__name__} returned {type(out).__name__}, not a tensor; "
                                 "each layer must map one tensor to one tensor")  # fmt: skip
        if not unit.last:
            return out
        loss = unit.loss(out, unit.y)
    # A loss scaler's multiplication: the backward then runs on scaled gradients, as in training.
    return loss * LossScaler.INITIAL if unit.precision.scales_loss else loss


def burst(unit: Unit, *, device: torch.device, in_flight: int, split: bool) -> dict[str, list[float]]:
    """Samples (ms) of every quantity from ``in_flight`` forwards and their backwards.

    Forwards: ``in_flight`` samples. Backwards, last forward first: the odd ones run
    ``I`` (when ``split``), the others ``B``; then the ``W`` of every ``I``. A unit whose output
    needs no gradient (a parameter-free first layer) has no backward: its backward samples are 0.
    Every graph, gradient and weight-gradient closure is released before it returns.
    """
    params = [p for p in unit.module.parameters() if p.requires_grad]
    leaves = [leaf(unit.x, unit.first) for _ in range(in_flight)]
    roots: list[torch.Tensor] = []
    watch = {q: Stopwatch(device) for q in QUANTITIES}
    _sync(device)  # nothing queued before the burst runs inside its first interval
    for x in leaves:
        roots.append(watch["fwd"].run(_forward, unit, x))
    if not roots[0].requires_grad:
        n = in_flight - in_flight // 2 if split else in_flight
        fwd = watch["fwd"].times()
        roots.clear()
        return {"fwd": fwd, "bwd": [0.0] * n, "bwd_input": [0.0] * (in_flight - n), "bwd_weight": [0.0] * (in_flight - n)}
    grad = None if unit.last else torch.ones_like(roots[0])
    works: list[WeightWork] = []
    for j in reversed(range(in_flight)):
        # Popped, so that each graph is freed by its backward as in a pipeline stage.
        root, x = roots.pop(), leaves.pop()
        if split and j % 2 == 1:
            works.append(watch["bwd_input"].run(backward_input, root, grad, [x], params)[1])
        else:
            watch["bwd"].run(backward_full, root, grad, [x], params)
        del root, x
    for work in works:
        watch["bwd_weight"].run(backward_weight, work)
    works.clear()
    out = {q: w.times() for q, w in watch.items()}
    unit.module.zero_grad(set_to_none=True)
    return out
