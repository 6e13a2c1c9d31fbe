"""Timing one cell once: a burst of forwards with their graphs kept, then their backwards.

A pipeline stage keeps each forward's graph until that microbatch's backward,
so its forwards write memory the previous ones have not freed and its
backwards read stashes that have left the cache. Timing forwards in a loop
that frees each output reuses hot memory instead: on this project's CPU such
forwards came out 25-35% faster than the same forwards inside the runtime. So
a burst runs ``in_flight`` forwards, every graph kept, then their backwards,
last first.

A layer is timed among its neighbours, as a stage runs it: with ``before``
and ``after`` context layers, every microbatch runs through the whole window
(forward layer by layer, backward in reverse) and only the timed layer's calls
are recorded. Timed alone, a layer keeps its weights and gradients hot in the
cache between calls, which inside a stage its neighbours' weights evict: on
this project's CPU a 1024-wide linear layer's forward at 1-2 samples took
1.4-2x as long inside a four-layer stage as alone, and the calibrated model's
held-out error on the same probe runs fell from a mean 16.8% to 12.7% over five
profiles each (issue 20's notes).

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

from umsearch.errors import ProfilingError
from umsearch.nn.backward import WeightWork, backward_full, backward_input, backward_weight
from umsearch.nn.precision import LossScaler, Precision

QUANTITIES = ("fwd", "bwd", "bwd_input", "bwd_weight")
"""What a burst times, named as the profile's ``{q}_ms`` fields."""

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class Unit:
    """What one burst runs: a module (one layer or a range of layers) on its real input, among the
    context layers a stage would run around it."""

    module: torch.nn.Module
    """The layer (or ``nn.Sequential`` of layers) to time."""
    x: torch.Tensor
    """The input of the window's first layer (``before[0]``, else ``module``): the real output of the
    layer before it (or the data)."""
    y: torch.Tensor
    """Targets of the loss (used when ``last``)."""
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    """The model's loss."""
    first: bool
    """The window starts the model: its input is data and needs no gradient (as on stage 0)."""
    last: bool
    """The window ends the model: the loss is part of its forward (as on the last stage)."""
    precision: Precision = Precision("fp32")
    """Autocast of the forwards, loss scaling of the last unit."""
    before: tuple[torch.nn.Module, ...] = ()
    """Layers run (untimed) before ``module`` on every microbatch, as a stage runs its earlier layers."""
    after: tuple[torch.nn.Module, ...] = ()
    """Layers run (untimed) after it, their backwards first."""

    @property
    def window(self) -> tuple[torch.nn.Module, ...]:
        """Every layer the burst runs, in order."""
        return (*self.before, self.module, *self.after)


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

    def times(self, *, sync: bool = True) -> list[float]:
        """Every call's ms, in call order (on CUDA after one synchronize, unless the caller did it)."""
        if self.device.type != "cuda":
            return list(self._ms)
        if sync:
            _sync(self.device)
        return [float(s.elapsed_time(e)) for s, e in self._events]


def leaf(x: torch.Tensor, first: bool) -> torch.Tensor:
    """A fresh autograd leaf on ``x``: requiring grad unless it is data (first layer) or not float."""
    x = x.detach()
    if not first and x.is_floating_point():
        x.requires_grad_(True)
    return x


def _forward(unit: Unit, module: torch.nn.Module, x: torch.Tensor, last: bool) -> torch.Tensor:
    with unit.precision.autocast(x.device):
        out = module(x)
        if not isinstance(out, torch.Tensor):
            raise ProfilingError(f"layer {type(module).__name__} returned {type(out).__name__}, not a tensor; "
                                 "each layer must map one tensor to one tensor")  # fmt: skip
        if not last:
            return out
        loss = unit.loss(out, unit.y)
    # A loss scaler's multiplication: the backward then runs on scaled gradients, as in training.
    return loss * LossScaler.INITIAL if unit.precision.scales_loss else loss


def _call(watch: Stopwatch | None, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``, timed by ``watch`` unless it is None (a context layer)."""
    return fn(*args) if watch is None else watch.run(fn, *args)


_Graph = list[tuple[torch.Tensor, torch.Tensor]]
"""One microbatch through the window: per layer, its input leaf and its output."""


def burst(unit: Unit, *, device: torch.device, in_flight: int, split: bool) -> dict[str, list[float]]:
    """Samples (ms) of every quantity of ``unit.module`` from ``in_flight`` forwards and their backwards.

    Forwards: ``in_flight`` samples, every microbatch through the whole window. Backwards, last forward
    first, each through the window in reverse: the odd ones run ``I`` (when ``split``), the others
    ``B``; then the ``W`` of every ``I``. A module whose output needs no gradient (a parameter-free
    first layer) has no backward: its backward samples are 0. Every graph, gradient and
    weight-gradient closure is released before it returns.
    """
    t = len(unit.before)
    return burst_window(unit, device=device, in_flight=in_flight, split=split, timed=(t,))[t]


def burst_window(unit: Unit, *, device: torch.device, in_flight: int, split: bool,
                 timed: tuple[int, ...]) -> dict[int, dict[str, list[float]]]:  # fmt: skip
    """:func:`burst`, timing every window position in ``timed`` (indices into ``unit.window``) at once.

    The window runs exactly as for one timed layer; each call of a timed position is recorded, so that
    one burst gives samples of every layer in it (a layer among its neighbours is then timed in the
    same context whichever of them is "the" timed one). Positions whose output needs no gradient get
    backward samples of 0; when the window's last output needs none, no backward runs.
    """
    window = unit.window
    n = len(window)
    wanted = set(timed)
    params = [[p for p in m.parameters() if p.requires_grad] for m in window]
    watch = {(i, q): Stopwatch(device) for i in wanted for q in QUANTITIES}
    graphs: list[_Graph] = []
    _sync(device)  # nothing queued before the burst runs inside its first interval
    for _ in range(in_flight):
        x, graph = unit.x, []
        for i, m in enumerate(window):
            lf = leaf(x, unit.first and i == 0)
            x = _call(watch[i, "fwd"] if i in wanted else None, _forward, unit, m, lf, unit.last and i == n - 1)
            graph.append((lf, x))
        graphs.append(graph)
    grads = [graphs[0][i][1].requires_grad for i in range(n)]
    k = in_flight - in_flight // 2 if split else in_flight
    if grads[-1]:
        _backwards(graphs, params, watch, unit.last, split, in_flight)
    graphs.clear()
    out: dict[int, dict[str, list[float]]] = {}
    _sync(device)  # once: every interval of the burst has ended
    for i in sorted(wanted):
        if grads[i] and grads[-1]:
            out[i] = {q: watch[i, q].times(sync=False) for q in QUANTITIES}
        else:
            out[i] = {"fwd": watch[i, "fwd"].times(sync=False), "bwd": [0.0] * k,
                      "bwd_input": [0.0] * (in_flight - k), "bwd_weight": [0.0] * (in_flight - k)}  # fmt: skip
    for m in window:
        m.zero_grad(set_to_none=True)
    return out


def _backwards(graphs: list[_Graph], params: list[list[torch.nn.Parameter]], watch: dict[tuple[int, str], Stopwatch],
               last: bool, split: bool, in_flight: int) -> None:  # fmt: skip
    """Every graph's backward, last first (``I`` on the odd ones when ``split``), then the deferred ``W``."""
    works: list[tuple[int, WeightWork]] = []
    for j in reversed(range(in_flight)):
        # Popped, so that each graph is freed by its backward as in a pipeline stage.
        graph = graphs.pop()
        grad: torch.Tensor | None = None if last else torch.ones_like(graph[-1][1])
        for i in reversed(range(len(graph))):
            lf, out = graph.pop()
            if not out.requires_grad:
                break  # nothing before a parameter-free, data-fed layer needs a gradient
            if split and j % 2 == 1:
                got, work = _call(watch.get((i, "bwd_input")), backward_input, out, grad, [lf], params[i])
                works.append((i, work))
            else:
                got = _call(watch.get((i, "bwd")), backward_full, out, grad, [lf], params[i])
            grad = got[0]
            del lf, out
            if grad is None:
                break
        del graph
    for i, work in works:
        _call(watch.get((i, "bwd_weight")), backward_weight, work)
    works.clear()
