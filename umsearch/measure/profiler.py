"""Measure a model layer by layer into a ``umsearch.core.profile/1``.

Layer i is fed layer i-1's real output. Forward and backward are timed with
warm-up runs and the median of several repeats (CUDA events on GPU,
``perf_counter`` on CPU). Stash bytes are what autograd really saves
(``saved_tensors_hooks``), counting each storage once and leaving out the
layer's own parameters, which ``param_bytes`` already holds.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

import torch

from umsearch.core.errors import ProfilingError
from umsearch.core.profile import LayerProfile, Link, Profile
from umsearch.measure.models import BuiltModel, ModelSpec

Tick = Callable[[str, int], None]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


T = TypeVar("T")

IN_FLIGHT = 8
"""Fewest forwards whose graphs a measurement keeps alive at once, as a pipeline stage keeps several."""


def _timed(fn: Callable[[], T], device: torch.device) -> tuple[T, float]:
    """``fn()`` and its wall time in ms (device work included)."""
    _sync(device)
    t = time.perf_counter()
    out = fn()
    _sync(device)
    return out, (time.perf_counter() - t) * 1e3


def _pipelined_ms(fwd: Callable[[], torch.Tensor], device: torch.device, repeats: int, warmup: int) -> tuple[float, float]:
    """Median forward and backward ms of ``fwd``'s graph, timed the way a pipeline stage runs them.

    A stage keeps each forward's graph until that microbatch's backward, so
    every forward of an iteration writes memory the previous forwards do not
    free, and every backward reads stashes that have left the cache. Timing
    forwards in a loop that frees each output reuses hot memory instead: on
    this project's CPU such forwards came out 25-35% faster than the same
    forwards inside the runtime. So, after ``warmup`` forward-backward pairs
    (code paths warm), ``max(repeats, IN_FLIGHT)`` forwards run with every graph
    kept, then their backwards, last first. A layer whose output needs no
    gradient (a parameter-free first layer) has no backward.
    """
    for _ in range(warmup):
        o = fwd()
        if o.requires_grad:
            o.backward(torch.ones_like(o))
    outs: list[torch.Tensor] = []
    f_times: list[float] = []
    for _ in range(max(repeats, IN_FLIGHT)):
        out, ms = _timed(fwd, device)
        outs.append(out)
        f_times.append(ms)
    if not outs[0].requires_grad:
        return statistics.median(f_times), 0.0
    grad = torch.ones_like(outs[0])
    b_times = []
    while outs:
        o = outs.pop()
        b_times.append(_timed(lambda: o.backward(grad), device)[1])  # noqa: B023 - called at once
    return statistics.median(f_times), statistics.median(b_times)


def tensor_bytes(t: torch.Tensor) -> int:
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


def _as_input(x: torch.Tensor, first: bool) -> torch.Tensor:
    x = x.detach()
    if not first and x.is_floating_point():
        x.requires_grad_(True)
    return x


def measure_layer(
    module: torch.nn.Module, x: torch.Tensor, last: bool, loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    y: torch.Tensor, device: torch.device, repeats: int, warmup: int, *, first: bool,
) -> tuple[float, float, torch.Tensor, int]:  # fmt: skip
    """(forward ms, backward ms, output, stash bytes) of one layer on one microbatch.

    ``first``: the layer starts the model, so (as on stage 0) its input is data and needs no
    gradient; any other layer's floating-point input requires grad, as in a pipeline stage.
    """
    inp = _as_input(x, first)

    def fwd() -> torch.Tensor:
        out = module(inp)
        return loss(out, y) if last else out

    f_ms, b_ms = _pipelined_ms(fwd, device, repeats, warmup)
    out, stash = saved_bytes(module, inp, (lambda o: loss(o, y)) if last else None)
    if not isinstance(out, torch.Tensor):
        raise ProfilingError(f"layer {type(module).__name__} returned {type(out).__name__}, not a tensor; "
                             "each layer must map one tensor to one tensor")  # fmt: skip
    module.zero_grad(set_to_none=True)
    return f_ms, b_ms, out.detach(), stash


def profile_model(
    built: BuiltModel, spec: ModelSpec, *, sizes: Sequence[int], device: torch.device, repeats: int,
    warmup: int = 2, link: Link, tick: Tick | None = None,
) -> Profile:  # fmt: skip
    """Measure every layer at every size (sizes that run out of memory end the list)."""
    for m in built.layers:
        m.to(device)
    g = torch.Generator().manual_seed(0)
    L = len(built.layers)
    fwd: list[list[float]] = [[] for _ in range(L)]
    bwd: list[list[float]] = [[] for _ in range(L)]
    out_b = [0.0] * L
    stash_b = [0.0] * L
    input_bytes = 0.0
    done: list[int] = []
    for b in sizes:
        x, y = (t.to(device) for t in built.make_batch(b, g))
        try:
            row = []
            for i, m in enumerate(built.layers):
                row.append(measure_layer(m, x, i == L - 1, built.loss, y, device, repeats, warmup, first=i == 0))
                x = row[-1][2]
                if tick:
                    tick(built.names[i], b)
        except torch.OutOfMemoryError:
            break
        except RuntimeError as exc:
            if "out of memory" not in str(exc):
                raise
            break
        done.append(b)
        if b == 1:
            input_bytes = float(tensor_bytes(built.make_batch(1, torch.Generator().manual_seed(0))[0]))
        for i, (f, bw, out, stash) in enumerate(row):
            fwd[i].append(f)
            bwd[i].append(bw)
            out_b[i] = tensor_bytes(out) / b
            stash_b[i] = stash / b
    if len(done) < 2:
        raise ProfilingError(f"only sizes {done} fit in memory; at least 1 and 2 must run to extrapolate")
    layers = tuple(
        LayerProfile(name=built.names[i], fwd_ms=tuple(fwd[i]), bwd_ms=tuple(bwd[i]), out_bytes=out_b[i],
                     stash_bytes=stash_b[i], param_bytes=float(sum(tensor_bytes(p) for p in built.layers[i].parameters())))
        for i in range(L)
    )  # fmt: skip
    where = device_name(device)
    extra = {"model_spec": spec.to_json(), "largest_size_that_fit": done[-1], "requested_sizes": list(sizes),
             "calibration": calibrate(built, fwd, bwd, done, device, repeats, warmup)}  # fmt: skip
    return Profile(model=f"{spec.source} {spec.args}", device=where, dtype="float32", microbatch_sizes=tuple(done),
                   input_bytes=input_bytes, layers=layers, link=link, extra=extra)  # fmt: skip


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(device)}"
    cpu = "cpu"
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"cpu: {cpu}, {torch.get_num_threads()} thread(s)"


def calibrate(
    built: BuiltModel, fwd: list[list[float]], bwd: list[list[float]], sizes: Sequence[int],
    device: torch.device, repeats: int, warmup: int,
) -> list[dict[str, object]]:  # fmt: skip
    """Stage-sized ranges (halves and quarters) timed end to end vs the sum of their layers."""
    L = len(built.layers)
    size = sizes[len(sizes) // 2]
    k = sizes.index(size)
    g = torch.Generator().manual_seed(1)
    x0, y = (t.to(device) for t in built.make_batch(size, g))
    inputs = [x0]
    with torch.no_grad():
        for m in built.layers:
            inputs.append(m(inputs[-1]))
    out = []
    bounds = sorted({(0, L // 2), (L // 2, L), (0, L // 4), (L // 4, L // 2)} - {(0, 0)})
    for lo, hi in bounds:
        if hi <= lo:
            continue
        stage = torch.nn.Sequential(*built.layers[lo:hi])
        f, b, _, _ = measure_layer(stage, inputs[lo], hi == L, built.loss, y, device, repeats, warmup, first=lo == 0)
        total = sum(fwd[i][k] + bwd[i][k] for i in range(lo, hi))
        out.append({"layers": [lo, hi], "size": size, "measured_ms": f + b, "sum_ms": total,
                    "error": (f + b) / total - 1 if total > 0 else 0.0})  # fmt: skip
    return out
