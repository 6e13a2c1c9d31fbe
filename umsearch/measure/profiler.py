"""Measure a model layer by layer into a ``umsearch.profile/2``, so that the machine's noise cancels.

1. Chain pass: every size runs the model once, layer by layer, each layer fed
   the real output of the one before. It records each layer's input (kept for
   the timing), its output bytes, the bytes autograd saves
   (:mod:`umsearch.measure.stash`), and its structural signature. Size 1 runs
   first; from its bytes per sample, a size whose pass would not fit the free
   memory (:mod:`umsearch.measure.memory`) is never allocated, and sizes that
   run out of memory anyway end the list.
2. Pooling: layers with equal signatures (:mod:`umsearch.measure.pooling`)
   form one group, measured together and given one estimate. The memory plan
   (:func:`umsearch.measure.memory.plan_memory`) gives each group, and each
   stage-sized range, its graphs in flight and the largest size that fits;
   the profile keeps the sizes every group fits.
3. Rounds (:mod:`umsearch.measure.rounds`): after ``warmup_rounds`` untimed
   rounds, up to ``repeats`` rounds each time every (group, size) cell still
   running once. A burst (:mod:`umsearch.measure.burst`) runs a window of
   ``context_layers`` consecutive layers, as a stage runs them, and times
   *every* layer in it: one burst gives a sample of every group with a member
   in the window. Per size a round runs the few windows that hold a member of
   every running group (:func:`~umsearch.measure.rounds.cover_windows`: a model
   of distinct layers is tiled, a pooled group costs no window of its own when
   its neighbours' windows hold a member, and the windows rotate over the
   rounds); the bursts of all sizes are shuffled. A cell's sample of a round is
   the median of every call of its members in that round. A cell stops once the
   median of each of its quantities is known to ``stop_precision_pct``
   (:mod:`umsearch.measure.stopping`, after ``min_repeats`` rounds); the
   rounds end when every cell has stopped. A few rounds (among the first
   ``min_repeats``, which every cell runs) also time stage-sized ranges (halves
   and quarters of the model) end to end: the calibration check. Every burst
   holds one window's graphs, all released before the next. Ctrl-C during the
   rounds keeps what was measured: :class:`ProfileInterrupted` carries the
   profile, marked ``partial``. On CPU, glibc's malloc is told to keep freed
   memory first (:mod:`umsearch.measure.host_memory`), so that a burst reuses
   buffers as a training step does instead of faulting in fresh pages.

   Timing every window layer instead of one among untimed neighbours changes
   no layer's context: between two calls of a layer the whole window runs
   either way, wherever the layer sits in it (a stage's first and last layers
   sit at its edges too). Before issue 31 each cell ran its own window of four
   layers and timed one, so three quarters of every burst went untimed.
4. Fit (:mod:`umsearch.measure.curves`): per group and quantity, the raw median
   and IQR of the rounds at each size, and the monotone fit over all rounds,
   which is the profile's value.
5. Quality (:mod:`umsearch.measure.quality`): spreads, pooled groups,
   calibration and a verdict.
"""

from __future__ import annotations

import os
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from umsearch.core.profile import LayerProfile, Link, Profile, TiedWeight
from umsearch.errors import ProfilingError
from umsearch.measure.burst import QUANTITIES, Unit, burst, burst_window, leaf
from umsearch.measure.curves import Curve, fit_curve, iqr, median
from umsearch.measure.host_memory import keep_freed_memory
from umsearch.measure.memory import (
    MemoryPlan,
    Need,
    available_bytes,
    chain_bytes,
    gigabytes,
    plan_memory,
)
from umsearch.measure.pooling import Signature, module_signature, pool_groups, tensor_signature
from umsearch.measure.quality import Thresholds, assess
from umsearch.measure.rounds import Cell, calibration_rounds, cover_windows, windows_holding
from umsearch.measure.stash import (
    Saved,
    fixed_and_per_sample,
    input_saved_bytes,
    saved_storages,
    shared_bytes,
    tensor_bytes,
    weight_saved_bytes,
)
from umsearch.measure.stopping import DEFAULT_PRECISION, MIN_ROUNDS, converged
from umsearch.nn.models import BuiltModel, ModelSpec
from umsearch.nn.precision import Precision, apply_switches
from umsearch.nn.tied import tied_layers

Step = Callable[[str], None]
"""Progress callback: called once per step with a description of the step just done."""

Tick = Callable[[str, int], None]
"""Progress callback with the total: ``tick(step just done, total steps of the whole run)``."""

DEFAULT_REPEATS = 15
"""Timed rounds by default: a median with a usable spread, and a 16-layer zoo model in about two minutes on two CPU cores."""

IN_FLIGHT = 8
"""Forwards per burst, every graph kept alive, as a pipeline stage keeps several."""

MIN_IN_FLIGHT = 2
"""Fewest graphs a burst keeps when memory is short (a pipeline stage keeps at least two, but the last)."""

DEFAULT_STOP_PRECISION_PCT = 100 * DEFAULT_PRECISION
"""Default of :attr:`ProfileConfig.stop_precision_pct` (percent)."""

MATERIAL = Thresholds().material
"""Share of the measured layers' time at a size under which a quantity's precision is judged against that
share instead of itself (the quality report's "matters" share)."""

CONTEXT_LAYERS = 4
"""Layers a burst runs together, the timed one among them (:mod:`umsearch.measure.burst`): a stage's
worth of neighbours, so that the cache holds what it holds inside a stage; 1 times each layer alone."""

ORDER = ("rounds; each times every (layer group, size) cell still running once, by bursts through windows of "
         "context layers that time every layer in them, in a seeded random order")

TIMING = {False: "wall clock around each call (the CPU runs it synchronously)",
          True: "CUDA events around each call, calls queued back to back on the stream, host syncs only before and after a burst"}  # fmt: skip
"""How a call is timed, by whether the device is a GPU (see :mod:`umsearch.measure.burst`)."""


@dataclass(frozen=True, kw_only=True)
class ProfileConfig:
    """How to measure."""

    sizes: tuple[int, ...]
    """Microbatch sizes, ascending, starting at 1."""
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    """Where to measure."""
    repeats: int = DEFAULT_REPEATS
    """Timed rounds: every cell gets one sample per round; values are medians over rounds."""
    in_flight: int = IN_FLIGHT
    """Forwards (graphs kept) per burst; the round's sample is the burst's median."""
    warmup_rounds: int = 1
    """Untimed rounds first (code paths, allocator and caches warm)."""
    calibration_rounds: int = 3
    """Rounds (spread over the run) that also time stage-sized ranges end to end (a range costs as
    much as all of its layers, so not every round)."""
    pool: bool = True
    """Measure structurally identical layers as one group with one estimate."""
    split: bool = True
    """Measure the split backward (``bwd_input_ms``, ``bwd_weight_ms``)."""
    seed: int = 0
    """Seed of the round order."""
    precision: Precision = field(default_factory=lambda: Precision("fp32"))
    """Training precision: autocast of the forwards, loss scaling, TF32 switches."""
    memory_cap_bytes: float | None = None
    """At most this many bytes for the profile (weights, kept inputs and bursts); None: the free memory."""
    min_in_flight: int = MIN_IN_FLIGHT
    """Fewest graphs in flight the memory plan may choose."""
    context_layers: int = CONTEXT_LAYERS
    """Layers each burst runs, every one of them timed among the others (1: alone)."""
    stop_precision_pct: float = DEFAULT_STOP_PRECISION_PCT
    """A (group, size) cell stops repeating once the 90% interval of each of its medians is within this many
    percent of it on either side (:mod:`umsearch.measure.stopping`); 0: every cell runs all ``repeats`` rounds."""
    min_repeats: int = MIN_ROUNDS
    """Fewest timed rounds of every cell (``repeats`` is the most)."""


def _is_oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.OutOfMemoryError) or (isinstance(exc, RuntimeError) and "out of memory" in str(exc))


def _release(device: torch.device) -> None:
    """Hand cached blocks back after an out-of-memory error, so that smaller cells still fit."""
    if device.type == "cuda":
        torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------ chain pass
@dataclass(frozen=True, kw_only=True)
class Chain:
    """What one pass of the model at every size leaves: real inputs, bytes, signatures."""

    sizes: tuple[int, ...]
    """Sizes that fit in memory (a prefix of the requested ones)."""
    inputs: dict[int, list[torch.Tensor]]
    """Per size, the real input of every layer (detached)."""
    targets: dict[int, torch.Tensor]
    """Per size, the loss targets."""
    out_bytes: tuple[float, ...]
    """Per layer, output bytes per sample (at the largest size)."""
    stash_bytes: tuple[float, ...]
    """Per layer, saved bytes per sample (at the largest size): what the memory plan of the bursts reads."""
    signatures: tuple[Signature, ...]
    """Per layer, everything that must match for two layers to be pooled."""
    input_bytes: float
    """Bytes of one input sample of layer 0."""
    in_bytes: tuple[float, ...] = ()
    """Per layer, input bytes per sample."""
    boundary_shared_bytes: tuple[float, ...] = ()
    """Per layer, bytes per sample saved both by it and by the layer before (0 for the first)."""
    input_saved_bytes: tuple[float, ...] = ()
    """Per layer, bytes per sample of its own input that it saves."""
    weight_stash_bytes: tuple[float, ...] = ()
    """Per layer, bytes per sample of what it saves that its graph still holds after ``I`` (what ``W`` needs),
    beyond :attr:`stash_fixed_bytes` (which ``W`` holds too), at most :attr:`stash_sample_bytes`."""
    stash_fixed_bytes: tuple[float, ...] = ()
    """Per layer, bytes saved per microbatch whatever its size: the fixed part of the line through the two
    largest sizes' saved bytes (:func:`~umsearch.measure.stash.fixed_and_per_sample`)."""
    stash_sample_bytes: tuple[float, ...] = ()
    """Per layer, the per-sample part of that line: the profile's ``stash_bytes``."""
    stopped: str | None = None
    """Why the sizes end before the requested ones do (memory), None when all ran."""

    def kept_bytes(self) -> float:
        """Bytes of the inputs the chain keeps for the timing, all sizes together."""
        return float(sum(tensor_bytes(t) for ts in self.inputs.values() for t in ts))


_Row = tuple[float, float, Signature, float, float, float, float]
"""Per layer at one size: output, stash and input bytes per sample, shapes and stash, and the bytes per sample
it saves that the layer before saved too, of its input that it saves, and that its graph still holds after
``I``."""


def _one_size(built: BuiltModel, b: int, g: torch.Generator, device: torch.device,
              precision: Precision) -> tuple[list[torch.Tensor], torch.Tensor, list[_Row]]:  # fmt: skip
    x, y = (t.to(device) for t in built.make_batch(b, g))
    L = len(built.layers)
    inputs: list[torch.Tensor] = []
    rows: list[_Row] = []
    before = Saved()
    for i, m in enumerate(built.layers):
        last = i == L - 1
        inp = leaf(x, i == 0)
        with precision.autocast(device):
            out, saved = saved_storages(m, inp, (lambda o: built.loss(o, y)) if last else None)
            stash = saved.total()
            if not isinstance(out, torch.Tensor):
                raise ProfilingError(f"layer {built.names[i]} ({type(m).__name__}) returned {type(out).__name__}, "
                                     "not a tensor; each layer must map one tensor to one tensor")  # fmt: skip
            root = built.loss(out, y) if last else out
        if root.requires_grad:  # one backward warms the code paths the bursts will take
            root.backward(None if last else torch.ones_like(root))
            with precision.autocast(device):  # what I leaves for W: a forward and an I of its own
                weight = weight_saved_bytes(m, leaf(x, i == 0), (lambda o: built.loss(o, y)) if last else None)
        else:
            weight = stash  # no backward at all: nothing is freed early
        m.zero_grad(set_to_none=True)
        inputs.append(x.detach())
        rows.append((tensor_bytes(out) / b, stash / b, (tensor_signature(x), tensor_signature(out), stash),
                     tensor_bytes(x) / b, shared_bytes(before, saved) / b, input_saved_bytes(saved, inp) / b,
                     min(weight, stash) / b))  # fmt: skip
        # The next layer's input is this output's storage (a detached view), so what both save is found by
        # storage; this layer's saved storages are held until then, so an address is never a reused one.
        before = saved
        x = out.detach()
    return inputs, y, rows


def _suggest(sizes: Sequence[int], top: int) -> str:
    kept = [b for b in sizes if b <= top]
    return ",".join(map(str, kept if len(kept) >= 2 else [1, max(2, top)]))


def _too_big(b: int, need: float, have: float, per_sample: float, sizes: Sequence[int], capped: bool) -> str:
    top = int(have // per_sample) if per_sample > 0 else b - 1
    where = "under --memory-limit-gb" if capped else "free"
    return (f"size {b} would need about {gigabytes(need)} for the profiler's pass through the model (every "
            f"layer's input kept, one layer's graph), but {gigabytes(max(have, 0.0))} is {where}; measure sizes "
            f"up to about {max(top, 1)}, e.g. --sizes {_suggest(sizes, max(top, 1))}")  # fmt: skip


def run_chain(built: BuiltModel, sizes: Sequence[int], device: torch.device, tick: Step | None = None, *,
              precision: Precision | None = None, cap_bytes: float | None = None) -> Chain:  # fmt: skip
    """Run every size through the model once (see the module doc).

    From the bytes of the sizes already run, a size whose pass would need more than the free memory
    (at most ``cap_bytes`` with the weights and kept inputs) is not allocated: it ends the list, and
    when that leaves fewer than two sizes, :class:`ProfilingError` says how much it would need. Sizes
    that run out of memory anyway also end the list.
    """
    precision = precision or Precision("fp32")
    g = torch.Generator().manual_seed(0)
    L = len(built.layers)
    params = float(sum(tensor_bytes(p) for m in built.layers for p in m.parameters()))
    inputs: dict[int, list[torch.Tensor]] = {}
    targets: dict[int, torch.Tensor] = {}
    per_size: list[list[_Row]] = []
    widest: list[tuple[int, float]] = []
    kept = 0.0
    stopped = None
    for b in sizes:
        if per_size:
            per_sample_in = sum(r[3] for r in per_size[0])
            need = chain_bytes(b, per_sample_in, widest)
            have = available_bytes(device, cap_bytes=cap_bytes, resident_bytes=params + kept)
            if need > have:
                stopped = _too_big(b, need, have, need / b, sizes, cap_bytes is not None)
                break
        try:
            inputs[b], targets[b], rows = _one_size(built, b, g, device, precision)
        except Exception as exc:
            if not _is_oom(exc):
                raise
            _release(device)
            stopped = f"size {b} ran out of memory in the profiler's pass through the model"
            break
        per_size.append(rows)
        kept += sum(tensor_bytes(t) for t in inputs[b])
        widest.append((b, max(b * (r[0] + r[1] + r[3]) for r in rows)))
        if tick:
            tick(f"chain pass b={b}")
    done = tuple(inputs)
    if len(done) < 2:
        why = stopped or "the others ran out of memory"
        raise ProfilingError(f"only sizes {list(done)} of {list(sizes)} fit in memory ({why}); at least two must "
                             "run (times above the largest are extrapolated from the last two)")  # fmt: skip
    role = ["first" if i == 0 else "last" if i == L - 1 else "inner" for i in range(L)]
    if L == 1:
        role = ["only"]
    sigs = tuple((role[i], module_signature(built.layers[i]), tuple(rows[i][2] for rows in per_size)) for i in range(L))
    first = built.make_batch(1, torch.Generator().manual_seed(0))[0]
    # Rows hold bytes per sample; times the size they are the integer bytes saved again.
    fits = [fixed_and_per_sample(done, [round(rows[i][1] * b) for b, rows in zip(done, per_size, strict=True)])
            for i in range(L)]  # fmt: skip
    top = done[-1]
    return Chain(sizes=done, inputs=inputs, targets=targets,
                 out_bytes=tuple(per_size[-1][i][0] for i in range(L)),
                 stash_bytes=tuple(per_size[-1][i][1] for i in range(L)),
                 signatures=sigs, input_bytes=float(tensor_bytes(first) / first.shape[0]),
                 in_bytes=tuple(per_size[-1][i][3] for i in range(L)),
                 boundary_shared_bytes=tuple(per_size[-1][i][4] for i in range(L)),
                 input_saved_bytes=tuple(per_size[-1][i][5] for i in range(L)),
                 weight_stash_bytes=tuple(min(max(per_size[-1][i][6] - fits[i][0] / top, 0.0), fits[i][1])
                                          for i in range(L)),
                 stash_fixed_bytes=tuple(f for f, _ in fits), stash_sample_bytes=tuple(s for _, s in fits),
                 stopped=stopped)  # fmt: skip


# ---------------------------------------------------------------------------------------- rounds
@dataclass(frozen=True, kw_only=True)
class Target:
    """What a cell times: a group of identical layers (every member in the round's windows) or a layer range."""

    name: str
    """For progress and reports."""
    layers: tuple[int, ...]
    """The group's members, or the range's layers (ascending, contiguous)."""
    span: bool = False
    """The layers run together as one stage-sized range."""
    in_flight: int | None = None
    """Graphs a burst keeps (from the memory plan); None: the config's."""


def group_name(names: Sequence[str], members: Sequence[int]) -> str:
    """``block3`` for one layer, ``block0..block13 (14 pooled)`` for a group."""
    if len(members) == 1:
        return names[members[0]]
    return f"{names[members[0]]}..{names[members[-1]]} ({len(members)} pooled)"


def context_window(layer: int, num_layers: int, width: int) -> tuple[int, int]:
    """``[lo, hi)``: the ``width`` consecutive layers (at most all) that hold ``layer``, centred on it
    where the model's ends allow."""
    w = max(1, min(width, num_layers))
    lo = min(max(layer - (w - 1) // 2, 0), num_layers - w)
    return lo, lo + w


def measured_context(profile: Profile) -> int:
    """The context layers ``profile`` was measured with (1 for profiles from before they existed), so that
    a check re-measures it as it was measured."""
    got = (profile.extra.get("measurement") or {}).get("context_layers", 1)
    return got if isinstance(got, int) and not isinstance(got, bool) and got >= 1 else 1


def _span_unit(target: Target, b: int, built: BuiltModel, chain: Chain, config: ProfileConfig) -> Unit:
    L = len(built.layers)
    lo, hi = target.layers[0], target.layers[-1] + 1
    return Unit(module=torch.nn.Sequential(*built.layers[lo:hi]), x=chain.inputs[b][lo], y=chain.targets[b],
                loss=built.loss, first=lo == 0, last=hi == L, precision=config.precision)  # fmt: skip


def _window_unit(lo: int, hi: int, b: int, built: BuiltModel, chain: Chain, config: ProfileConfig) -> Unit:
    """The layers ``[lo, hi)`` as one burst's window (every one of them timed by :func:`burst_window`)."""
    L = len(built.layers)
    return Unit(module=built.layers[lo], x=chain.inputs[b][lo], y=chain.targets[b], loss=built.loss, first=lo == 0,
                last=hi == L, precision=config.precision, after=tuple(built.layers[lo + 1 : hi]))  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class Measured:
    """Per-round samples of every cell."""

    samples: dict[Cell, dict[str, list[float]]]
    """Per cell, per quantity, one sample (ms) per timed round: the median of the round's calls of the
    cell's layers (every member of a pooled group timed in that round, every call of a burst)."""
    sizes: tuple[int, ...]
    """Sizes measured in every round (a size whose burst ran out of memory ends the list)."""
    cpu_share: tuple[float, ...]
    """Per timed round: process CPU time over wall time."""
    duration_s: float
    """Wall time of all rounds."""
    host_allocator: str | None = None
    """What :func:`~umsearch.measure.host_memory.keep_freed_memory` set (CPU), None where nothing was."""
    rounds: int = 0
    """Timed rounds run (some cells may have stopped earlier, see :mod:`umsearch.measure.stopping`)."""
    bursts: int = 0
    """Bursts run, warm-up included."""
    stopped: dict[Cell, int] = field(default_factory=dict)
    """Cells that stopped before ``repeats`` rounds, with their rounds then."""
    interrupted: KeyboardInterrupt | None = None
    """The Ctrl-C (or stop signal) that ended the rounds early; None when they ran to the end."""

    def rounds_of(self, cell: Cell) -> int:
        """Timed rounds that gave ``cell`` a forward sample."""
        return len(self.samples[cell]["fwd"])


def _judged(config: ProfileConfig) -> tuple[str, ...]:
    return QUANTITIES if config.split else ("fwd", "bwd")


def _settled(samples: dict[Cell, dict[str, list[float]]], cells: Sequence[Cell], targets: Sequence[Target],
             config: ProfileConfig, min_rounds: int) -> list[Cell]:  # fmt: skip
    """The cells of ``cells`` whose medians are known to the config's precision (:func:`converged`);
    a quantity under 1% of the measured layers' time at its size is judged against that 1%."""
    wanted = _judged(config)
    total: dict[int, float] = {}
    for c in samples:
        if not targets[c.target].span:
            s = samples[c]
            total[c.size] = total.get(c.size, 0.0) + len(targets[c.target].layers) * (median(s["fwd"]) + median(s["bwd"]))
    return [c for c in cells
            if converged({q: samples[c][q] for q in wanted}, precision=config.stop_precision_pct / 100,
                         min_rounds=min_rounds, floor_ms=MATERIAL * total.get(c.size, 0.0))]  # fmt: skip


def measure_cells(
    targets: Sequence[Target], cells: Sequence[Cell], built: BuiltModel, chain: Chain, config: ProfileConfig, *,
    extra: Sequence[Cell] = (), tick: Step | None = None,
) -> Measured:  # fmt: skip
    """Run the rounds of ``cells`` (and ``extra`` in the calibration rounds); see the module doc.

    Per round and size, the layer cells still running are timed by the bursts of
    :func:`~umsearch.measure.rounds.cover_windows` (one burst per window, every layer in it timed), shuffled
    with the calibration cells of the round. A cell stops once :func:`_settled` (at least
    ``min_repeats`` rounds); the rounds end when every cell has. Ctrl-C ends them too: what was measured is
    returned, with ``interrupted`` set.
    """
    warm, R = config.warmup_rounds, config.repeats
    L = len(built.layers)
    min_rounds = max(1, min(config.min_repeats, R))
    adaptive = config.stop_precision_pct > 0
    allocator = keep_freed_memory() if config.device.type == "cpu" else None
    over = min_rounds if adaptive else R  # calibration rounds among those every cell runs
    marked = {warm + r for r in calibration_rounds(over, config.calibration_rounds)} if extra else set()
    rng = random.Random(config.seed)
    samples: dict[Cell, dict[str, list[float]]] = {c: {q: [] for q in QUANTITIES} for c in [*cells, *extra]}
    owner = {i: t for t, tg in enumerate(targets) if not tg.span for i in tg.layers}
    all_sizes = sorted({c.size for c in cells})
    stopped: dict[Cell, int] = {}
    too_big: int | None = None
    shares: list[float] = []
    bursts = timed_rounds = 0
    interrupted: KeyboardInterrupt | None = None
    calls: dict[Cell, dict[str, list[float]]] = {}
    r = 0

    def fits(b: int) -> bool:
        return too_big is None or b < too_big

    def commit() -> None:
        for c, qs in calls.items():
            for q, xs in qs.items():
                if xs:
                    samples[c][q].append(median(xs))

    start = time.perf_counter()
    try:
        for r in range(warm + R):
            running = [c for c in cells if c not in stopped and fits(c.size)]
            spans = [c for c in extra if r in marked and fits(c.size)]
            if r >= warm and not running and not spans:
                break
            jobs: list[tuple[int, tuple[int, int] | None, Cell | None]] = []
            for b in all_sizes:
                need = sorted({c.target for c in running if c.size == b})
                if need:
                    windows = cover_windows([targets[t].layers for t in need], L, config.context_layers, rotation=r)
                    jobs += [(b, w, None) for w in windows]
            jobs += [(c.size, None, c) for c in spans]
            rng.shuffle(jobs)
            calls = {}
            wall, cpu = time.perf_counter(), time.process_time()
            phase = f"warm-up {r + 1}/{warm}" if r < warm else f"round {r - warm + 1}/{R}"
            for b, window, span in jobs:
                if not fits(b):
                    continue
                try:
                    if span is not None:
                        target = targets[span.target]
                        got = {span: burst(_span_unit(target, b, built, chain, config), device=config.device,
                                           in_flight=target.in_flight or config.in_flight, split=config.split)}  # fmt: skip
                        name = target.name
                    else:
                        lo, hi = window or (0, 0)
                        held = [owner[i] for i in range(lo, hi) if i in owner]
                        flight = min((targets[t].in_flight or config.in_flight for t in held), default=config.in_flight)
                        timed = tuple(i - lo for i in range(lo, hi) if i in owner)
                        per = burst_window(_window_unit(lo, hi, b, built, chain, config), device=config.device,
                                           in_flight=flight, split=config.split, timed=timed)  # fmt: skip
                        got = {}
                        for p, qs in per.items():
                            cell = Cell(owner[lo + p], b)
                            got.setdefault(cell, {q: [] for q in QUANTITIES})
                            for q, xs in qs.items():
                                got[cell][q] += xs
                        name = f"layers {lo}..{hi - 1}" if hi - lo > 1 else built.names[lo]
                except Exception as exc:
                    if not _is_oom(exc):
                        raise
                    _release(config.device)
                    too_big = b
                    continue
                bursts += 1
                for cell, qs in got.items():
                    into = calls.setdefault(cell, {q: [] for q in QUANTITIES})
                    for q, xs in qs.items():
                        into[q] += xs
                if tick:
                    tick(f"{phase}: {name} b={b}")
            if r >= warm:
                commit()
                calls = {}
                timed_rounds += 1
                shares.append((time.process_time() - cpu) / max(time.perf_counter() - wall, 1e-9))
                if adaptive:
                    for c in _settled(samples, running, targets, config, min_rounds):
                        if timed_rounds < R:
                            stopped[c] = timed_rounds
    except KeyboardInterrupt as exc:
        interrupted = exc
        if r >= warm and calls:
            commit()  # the round's finished bursts count; the burst that was running is lost
            timed_rounds += 1
    sizes = tuple(b for b in all_sizes if fits(b))
    return Measured(samples=samples, sizes=sizes, cpu_share=tuple(shares), duration_s=time.perf_counter() - start,
                    host_allocator=allocator, rounds=timed_rounds, bursts=bursts, stopped=stopped,
                    interrupted=interrupted)  # fmt: skip


def steps(config: ProfileConfig, cells: int, extra: int) -> int:
    """Progress steps of :func:`measure_cells` at most (one per cell per round; bursts that time several
    cells at once and cells that stop early make fewer)."""
    marked = len(calibration_rounds(config.repeats, config.calibration_rounds)) if extra else 0
    return (config.warmup_rounds + config.repeats) * cells + marked * extra


def window_steps(config: ProfileConfig, groups: Sequence[Sequence[int]], num_layers: int, sizes: int,
                 extra: int) -> int:  # fmt: skip
    """Progress steps (bursts) of :func:`measure_cells` when no cell stops early."""
    per_size = len(cover_windows(groups, num_layers, config.context_layers))
    marked = len(calibration_rounds(config.repeats, config.calibration_rounds)) if extra else 0
    return (config.warmup_rounds + config.repeats) * per_size * sizes + marked * extra


# ------------------------------------------------------------------------------------ the profile
def calibration_spans(L: int) -> list[tuple[int, int]]:
    """Stage-sized ranges checked end to end: the halves and the first two quarters."""
    return sorted(s for s in {(0, L // 2), (L // 2, L), (0, L // 4), (L // 4, L // 2)} if s[1] > s[0])


def _curves(measured: Measured, g: int, split: bool) -> dict[str, Curve]:
    wanted = QUANTITIES if split else ("fwd", "bwd")
    return {q: fit_curve([measured.samples[Cell(g, b)][q] for b in measured.sizes]) for q in wanted}


def _layer(built: BuiltModel, chain: Chain, i: int, curves: dict[str, Curve]) -> LayerProfile:
    def fitted(q: str) -> tuple[float, ...] | None:
        return curves[q].fitted if q in curves else None

    stash = chain.stash_sample_bytes[i]  # per sample beyond the fixed part, which no other field shares
    return LayerProfile(
        name=built.names[i], fwd_ms=curves["fwd"].fitted, bwd_ms=curves["bwd"].fitted,
        bwd_input_ms=fitted("bwd_input"), bwd_weight_ms=fitted("bwd_weight"),
        out_bytes=chain.out_bytes[i], stash_bytes=stash, stash_fixed_bytes=chain.stash_fixed_bytes[i],
        boundary_shared_bytes=min(chain.boundary_shared_bytes[i], stash),
        input_saved_bytes=min(chain.input_saved_bytes[i], stash),
        weight_stash_bytes=chain.weight_stash_bytes[i] if chain.weight_stash_bytes else None,
        param_bytes=float(sum(tensor_bytes(p) for p in built.layers[i].parameters())),
        spread_ms={q: c.spread for q, c in curves.items()}, raw_ms={q: c.raw for q, c in curves.items()},
    )  # fmt: skip


def _calibration(measured: Measured, layers: Sequence[LayerProfile], spans: Sequence[tuple[int, int]],
                 first_range: int, size: int) -> list[dict[str, Any]]:  # fmt: skip
    if size not in measured.sizes:
        return []
    k = measured.sizes.index(size)
    out = []
    for n, (lo, hi) in enumerate(spans):
        s = measured.samples[Cell(first_range + n, size)]
        if not s["fwd"]:
            continue  # interrupted before this range's round
        got = median(s["fwd"]) + median(s["bwd"])
        total = sum(layers[i].fwd_ms[k] + layers[i].bwd_ms[k] for i in range(lo, hi))
        out.append({"layers": [lo, hi], "size": size, "measured_ms": got, "spread_ms": iqr(s["fwd"]) + iqr(s["bwd"]),
                    "sum_ms": total, "error": got / total - 1 if total > 0 else 0.0})  # fmt: skip
    return out


def device_name(device: torch.device) -> str:
    """Where the profile was measured, honestly: GPU name, or CPU model and thread count."""
    if device.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(device)}"
    cpu = "cpu"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"cpu: {cpu}, {torch.get_num_threads()} thread(s)"


def _loadavg() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def cpu_share_of(measured: Measured, device: torch.device) -> float | None:
    """Median CPU share per round, judged only for a single-threaded CPU profile."""
    if device.type != "cpu" or torch.get_num_threads() != 1 or not measured.cpu_share:
        return None
    return float(statistics.median(measured.cpu_share))


def tied_weights(built: BuiltModel) -> tuple[TiedWeight, ...]:
    """The weights the model builder marked as shared by several layers (:func:`~umsearch.nn.tied.mark_tied`),
    each once, in the order the layers hold them: every holder counts it in its ``param_bytes``."""
    found: dict[int, TiedWeight] = {}
    for m in built.layers:
        for p in m.parameters():
            layers = tied_layers(p)
            if len(layers) > 1 and id(p) not in found:
                found[id(p)] = TiedWeight(layers=layers, bytes=float(tensor_bytes(p)))
    return tuple(found.values())


def _param_bytes(built: BuiltModel, layers: Sequence[int]) -> float:
    return float(sum(tensor_bytes(p) for i in layers for p in built.layers[i].parameters()))


def burst_needs(built: BuiltModel, chain: Chain, groups: Sequence[Sequence[int]],
                spans: Sequence[tuple[int, int]], context_layers: int) -> list[Need]:  # fmt: skip
    """What a burst of each group and of each stage-sized range keeps, from the chain's bytes: a window of
    context layers keeps every window layer's stash and output (each layer is its own graph); a group
    counts the fullest window that holds one of its members (any may be chosen,
    :func:`~umsearch.measure.rounds.cover_windows`); a range keeps its stash and its last output."""
    L, out, stash, inp = len(built.layers), chain.out_bytes, chain.stash_bytes, chain.in_bytes

    def need(name: str, lo: int, hi: int, *, every_output: bool) -> Need:
        kept = sum(stash[lo:hi]) + (sum(out[lo:hi]) if every_output else out[hi - 1])
        return Need(name=name, kept_per_sample=kept, transient_per_sample=out[hi - 1] + inp[lo],
                    fixed=_param_bytes(built, range(lo, hi)))  # fmt: skip

    needs = [max((need(group_name(built.names, g), lo, hi, every_output=True)
                  for i in g for lo, hi in windows_holding(i, L, context_layers)),
                 key=lambda n: (n.kept_per_sample, n.fixed)) for g in groups]  # fmt: skip
    return needs + [need(f"layers {lo}..{hi - 1}", lo, hi, every_output=False) for lo, hi in spans]


def plan_bursts(built: BuiltModel, chain: Chain, groups: Sequence[Sequence[int]], spans: Sequence[tuple[int, int]],
                config: ProfileConfig) -> tuple[MemoryPlan, tuple[int, ...], list[Need]]:  # fmt: skip
    """The memory plan of every group and range, the sizes every group fits (at least two, else
    :class:`ProfilingError` naming the group that does not fit) and the needs it planned for."""
    needs = burst_needs(built, chain, groups, spans, config.context_layers)
    resident = _param_bytes(built, range(len(built.layers))) + chain.kept_bytes()
    have = available_bytes(config.device, cap_bytes=config.memory_cap_bytes, resident_bytes=resident)
    mp = plan_memory(needs, have, chain.sizes, max_in_flight=config.in_flight,
                     min_in_flight=min(config.min_in_flight, config.in_flight))  # fmt: skip
    sizes = mp.common_sizes(chain.sizes, range(len(groups)))
    if len(sizes) < 2:
        g = min(range(len(groups)), key=lambda t: mp.largest[t] or 0)
        fits = f"fits only size {mp.largest[g]}" if mp.largest[g] else "fits no size"
        raise ProfilingError(
            f"with {mp.in_flight[g]} graphs in flight, {needs[g].name} {fits} in the {gigabytes(mp.budget_bytes)} "
            f"the profiler may use ({gigabytes(needs[g].kept_per_sample)} kept per sample); at least two sizes must "
            "fit: free memory (or raise --memory-limit-gb) or profile a smaller model"
        )  # fmt: skip
    return mp, sizes, needs


def memory_note(mp: MemoryPlan, needs: Sequence[Need], groups: int, requested: Sequence[int],
                sizes: Sequence[int], chain_stop: str | None, planned: Sequence[int] = ()) -> str | None:  # fmt: skip
    """What did not fit, per group (``sizes above 16 did not fit in memory: largest that fits: 16 for ...``);
    None when every requested size was measured."""
    if tuple(sizes) == tuple(requested):
        return None
    by_size: dict[int | None, list[str]] = {}
    for t in range(groups):
        by_size.setdefault(mp.largest[t], []).append(needs[t].name)
    parts = [f"{b} for {', '.join(names)}" for b, names in sorted(by_size.items(), key=lambda kv: kv[0] or 0)]
    text = f"sizes above {sizes[-1]} did not fit in memory: largest that fits: {'; '.join(parts)}"
    if planned and len(sizes) < len(planned):
        text += f"; sizes above {sizes[-1]} ran out of memory while measuring, although the estimate let them in"
    return text + (f" ({chain_stop})" if chain_stop else "")


def profile_model(
    built: BuiltModel, spec: ModelSpec, config: ProfileConfig, *, link: Link, tick: Tick | None = None
) -> Profile:
    """Measure every layer at every size of ``config`` into a profile with its quality report.

    The precision's switches are set first (and recorded); sizes that do not fit the memory are
    left out (said in ``measurement.memory.note``), never allocated where the estimate says so.
    """
    from umsearch.nn.adapters import check_layer_outputs

    switches = apply_switches(config.precision)
    for m in built.layers:
        m.to(config.device)
    sample = built.make_batch(1, torch.Generator().manual_seed(config.seed))[0]
    check_layer_outputs(built.layers, built.names, sample.to(config.device))
    load_before, start = _loadavg(), time.perf_counter()
    L = len(built.layers)
    all_spans = calibration_spans(L)
    total = [len(config.sizes) + steps(config, L * len(config.sizes), len(all_spans))]  # at most; exact below

    def step(what: str) -> None:
        if tick:
            tick(what, total[0])

    chain = run_chain(built, config.sizes, config.device, step, precision=config.precision,
                      cap_bytes=config.memory_cap_bytes)  # fmt: skip
    groups = pool_groups(chain.signatures) if config.pool else [[i] for i in range(L)]
    mp, sizes, needs = plan_bursts(built, chain, groups, all_spans, config)
    mid = sizes[len(sizes) // 2]
    G = len(groups)
    spans = [sp for n, sp in enumerate(all_spans) if (mp.largest[G + n] or 0) >= mid]
    kept_span = [G + n for n, sp in enumerate(all_spans) if sp in spans]
    targets = [Target(name=group_name(built.names, g), layers=tuple(g), in_flight=mp.in_flight[t])
               for t, g in enumerate(groups)]  # fmt: skip
    targets += [Target(name=f"layers {lo}..{hi - 1}", layers=tuple(range(lo, hi)), span=True, in_flight=mp.in_flight[t])
                for (lo, hi), t in zip(spans, kept_span, strict=True)]  # fmt: skip
    cells = [Cell(t, b) for t in range(G) for b in sizes]
    extra = [Cell(G + n, mid) for n in range(len(spans))]
    total[0] = len(chain.sizes) + window_steps(config, groups, L, len(sizes), len(extra))
    measured = measure_cells(targets, cells, built, chain, config, extra=extra, tick=step)
    if measured.interrupted is not None:
        measured = _usable(measured, G)
    if len(measured.sizes) < 2:
        raise ProfilingError(f"only sizes {list(measured.sizes)} fit in memory with {min(mp.in_flight)} or more "
                             "graphs alive; at least two must run; use a smaller model")  # fmt: skip
    curves = [_curves(measured, g, config.split) for g in range(G)]
    group_of = {i: g for g, members in enumerate(groups) for i in members}
    layers = tuple(_layer(built, chain, i, curves[group_of[i]]) for i in range(L))
    calibration = _calibration(measured, layers, spans, G, mid)
    share = cpu_share_of(measured, config.device)
    per_cell = [measured.rounds_of(Cell(g, b)) for g in range(G) for b in measured.sizes]
    # The rounds the noisiest cells got (a noisy cell runs them all): what a suggested --repeats doubles.
    quality = assess(layers, groups=groups, calibration=calibration, rounds=max(per_cell), cpu_share=share,
                     device_type=config.device.type)  # fmt: skip
    memory = {
        "budget_bytes": mp.budget_bytes, "cap_bytes": config.memory_cap_bytes,
        "in_flight": {needs[t].name: mp.in_flight[t] for t in range(len(needs))},
        "largest_that_fits": {needs[t].name: mp.largest[t] for t in range(len(needs))},
        "ranges_left_out": [list(sp) for sp in all_spans if sp not in spans],
        "note": memory_note(mp, needs, G, config.sizes, measured.sizes, chain.stopped, sizes),
    }  # fmt: skip
    flights = sorted({mp.in_flight[t] for t in range(G)})
    measurement = {
        "method": "interleaved rounds, pooled identical layers, "
                  + ("each timed among its neighbours, " if config.context_layers > 1 else "")
                  + "monotone fit (umsearch.measure.profiler)",
        "context_layers": config.context_layers,
        "rounds": max(per_cell), "repeats": config.repeats, "warmup_rounds": config.warmup_rounds,
        "stopping": {"rule": "a (layer group, size) cell stops once each quantity's median is known to "
                             "stop_precision_pct of it (or of 1% of the layers' time at that size) at 90%: "
                             "1.645 * 0.93 * IQR / sqrt(rounds) (umsearch.measure.stopping)",
                     "stop_precision_pct": config.stop_precision_pct, "min_repeats": min(config.min_repeats,
                                                                                          config.repeats),
                     "rounds_per_cell": {"min": min(per_cell), "median": statistics.median(per_cell),
                                         "max": max(per_cell)},
                     "cells_stopped_early": len(measured.stopped), "cells": len(per_cell),
                     "rounds_run": measured.rounds, "bursts": measured.bursts},
        "in_flight": flights[0] if len(flights) == 1 else f"{flights[0]}-{flights[-1]}", "order": ORDER,
        "seed": config.seed,
        "calibration_rounds": len(calibration_rounds(config.repeats, config.calibration_rounds)),
        "threads": torch.get_num_threads(), "device": str(config.device), "pooling": config.pool,
        "split_backward": "umsearch.nn.backward: B backward_full, I backward_input, W backward_weight (deferred)"
        if config.split else None,
        "timing": TIMING[config.device.type == "cuda"], "host_allocator": measured.host_allocator,
        "precision": switches, "memory": memory,
        "duration_s": time.perf_counter() - start, "rounds_s": measured.duration_s, "cpu_share": share,
        "cpu_share_per_round": list(measured.cpu_share), "loadavg_1m": [load_before, _loadavg()],
    }  # fmt: skip
    extra_json = {"model_spec": spec.to_json(), "largest_size_that_fit": measured.sizes[-1],
                  "requested_sizes": list(config.sizes), "calibration": calibration, "quality": quality,
                  "pooled": quality["pooled"], "measurement": measurement,
                  "precision": config.precision.name}  # fmt: skip
    if measured.interrupted is not None:
        extra_json["partial"] = partial_record(measured, config, per_cell)
    prof = Profile(model=f"{spec.source} {spec.args}", device=device_name(config.device),
                   dtype=config.precision.dtype_text, microbatch_sizes=measured.sizes, input_bytes=chain.input_bytes,
                   layers=layers, link=link, tied_weights=tied_weights(built), extra=extra_json)  # fmt: skip
    if measured.interrupted is not None:
        raise ProfileInterrupted(prof, measured.interrupted)
    return prof


class ProfileInterrupted(KeyboardInterrupt):
    """Ctrl-C (or a stop signal) during the timing rounds: :attr:`profile` is what was measured, marked
    partial (``partial`` in its JSON, :func:`umsearch.core.profile.profile_partial`).

    A ``KeyboardInterrupt``, so that a caller that does not catch it stops as before; ``cause`` is the
    interrupt itself (an :class:`~umsearch.errors.Interrupted` carries the signal).
    """

    def __init__(self, profile: Profile, cause: KeyboardInterrupt) -> None:
        super().__init__(f"interrupted; partial profile of {len(profile.microbatch_sizes)} sizes kept")
        self.profile = profile
        self.cause = cause


def _usable(measured: Measured, groups: int) -> Measured:
    """An interrupted measurement cut to the sizes every group has a sample of (at least 1 and one more),
    else the interrupt goes on: there is nothing to keep."""
    assert measured.interrupted is not None
    sizes = tuple(b for b in measured.sizes if all(measured.rounds_of(Cell(g, b)) for g in range(groups)))
    if len(sizes) < 2 or sizes[0] != 1:
        raise measured.interrupted
    return replace(measured, sizes=sizes)


def partial_record(measured: Measured, config: ProfileConfig, per_cell: Sequence[int]) -> dict[str, Any]:
    """The profile's ``partial`` field: why and how far the rounds got."""
    cause = measured.interrupted
    what = "Ctrl-C" if cause is None or type(cause) is KeyboardInterrupt else str(cause) or type(cause).__name__
    return {"reason": f"interrupted ({what}) after {measured.rounds} of at most {config.repeats} timed rounds; "
                      f"cells have {min(per_cell)}-{max(per_cell)} rounds, sizes {list(measured.sizes)} of "
                      f"{list(config.sizes)}",
            "rounds": measured.rounds, "repeats": config.repeats, "min_rounds_per_cell": min(per_cell),
            "sizes": list(measured.sizes)}  # fmt: skip
