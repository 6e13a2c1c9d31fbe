"""One stage's compute: the forward of a microbatch, and ``B``, ``I`` or ``W`` of a backward microbatch.

:class:`StageCompute` knows nothing of ranks, messages or schedules; the
executor (:mod:`umsearch.runtime.executor`) hands it input tensors and
gradients in the order its rank's action list says, and ships what it
returns. It keeps, per iteration, what the stage's backwards will need:

- without recompute, the autograd graph of every forward microbatch until its
  ``B`` (or its ``I``; ``W`` then holds the weight side until it runs);
- with recompute, only each forward microbatch's (detached) input and RNG
  state; each ``B``/``I`` rebuilds the graph for exactly the samples of its
  backward microbatch, which may span or split forward microbatches.

The last stage's forward includes its loss: ``loss_fn`` gives the mean loss
of a microbatch of ``n`` samples, weighted here by ``n / B``, so the summed
gradients of one iteration are exactly those of the full-batch mean loss.

A graph is built per layer (the layers cut apart by detached leaves) when its
backward is split or per-layer timing is on; otherwise as one piece. Cutting
keeps every weight-gradient call of ``W`` inside one layer's graph, so
``W``'s cost grows with the layers, not with their square (each autograd call
walks the whole graph below where it starts), and per-layer ``I``/``W`` are
exactly what the profiler measures with :mod:`umsearch.nn.backward`.

Forwards (and recomputations) run under the run's precision
(:class:`~umsearch.nn.precision.Precision`: autocast for bf16 and fp16), as
the profiler ran them; with fp16 the last stage's backward starts from the
loss times the loss scaler's scale (the loss it reports stays unscaled).

Recompute replays randomness like ``torch.utils.checkpoint``: the RNG state
(CPU, and the stage's GPU on CUDA) is stashed before each forward; a backward
microbatch that is exactly one forward microbatch replays its draws (dropout
masks). One that spans or splits forward microbatches cannot: if the stage
drew random numbers in such a forward, it refuses instead of back-propagating
through different masks. Layers with running statistics (BatchNorm) update
them twice on a recomputing stage, in the forward and in the recomputation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch

from umsearch.core.actions import Kind
from umsearch.core.plan import Stage
from umsearch.core.plan_rules import gradient_kind
from umsearch.core.samples import all_overlaps, cumulative
from umsearch.errors import RuntimeExecutionError
from umsearch.nn.backward import WeightWork, backward_full, backward_input, backward_weight
from umsearch.nn.precision import LossScaler, Precision
from umsearch.runtime.memory_tally import held
from umsearch.runtime.messages import Piece, assemble, releases
from umsearch.runtime.timing import LayerStamp, StampClock

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""``loss_fn(output, targets)`` -> the MEAN loss of the samples given (a scalar tensor)."""

RngState = tuple[torch.Tensor, torch.Tensor | None]
"""CPU generator state, and the stage GPU's (None on CPU)."""


@dataclass
class _Piece:
    """One autograd piece of a microbatch's graph: a layer, or the whole stage."""

    inp: torch.Tensor
    """The piece's input: a fresh leaf where a gradient must come out of it."""
    out: torch.Tensor
    """Its output; on the last piece of the last stage, the weighted loss."""
    layer: int | None
    """Global layer index, or None for the whole stage."""
    params: list[torch.Tensor]
    """Parameters used by the piece."""


@dataclass
class _Iteration:
    """Per-iteration state of one stage."""

    graphs: dict[int, list[_Piece]] = field(default_factory=dict)
    stash: dict[int, torch.Tensor] = field(default_factory=dict)
    held: dict[int, object | None] = field(default_factory=dict)
    """A recomputing stage's stashed inputs as a memory tally counts them (:func:`~umsearch.runtime.memory_tally.held`)."""
    rng: dict[int, RngState] = field(default_factory=dict)
    random: dict[int, bool] = field(default_factory=dict)
    weight: dict[int, list[tuple[int | None, WeightWork]]] = field(default_factory=dict)
    loss: torch.Tensor | None = None
    targets: torch.Tensor | None = None
    losses: dict[int, torch.Tensor] = field(default_factory=dict)
    """Last stage: each forward microbatch's loss as ``loss_fn`` returned it (detached, unscaled)."""
    outputs: dict[int, torch.Tensor] = field(default_factory=dict)
    """Last stage with ``keep_outputs``: each forward microbatch's output (detached)."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword inputs of the module's forward for the whole batch (tensors are cut per microbatch)."""


class StageCompute:
    """Stage ``index`` of a plan on ``module`` (its layers ``[lo, hi)``, an ``nn.Sequential`` to cut per layer).

    ``split[k]``: whether backward microbatch ``k`` runs as ``I`` + ``W``.
    ``backward_order``: the stage's backward microbatches in the order their
    ``B``/``I`` run (a recomputing stage drops stashed inputs after their last
    reader). ``clock``: per-layer timing into :attr:`layer_stamps` (None: off). ``precision``: the
    autocast of the forwards (None: fp32); ``scaler``: the loss scale of the last stage's backward.
    ``mean_loss``: ``loss_fn`` gives a microbatch's mean loss and the backward starts from it weighted by
    ``n / B`` (the gradients are the full-batch mean loss's); False: unweighted, so the gradients are
    those of the sum of ``loss_fn`` over the microbatches (torch's ``scale_grads=False``).
    ``keep_outputs``: the last stage keeps every forward microbatch's output (:meth:`outputs`).
    """

    def __init__(self, *, index: int, stage: Stage, module: torch.nn.Module, global_batch: int, first: bool,
                 last: bool, loss_fn: LossFn | None, device: torch.device, split: Sequence[bool],
                 backward_order: Sequence[int], clock: StampClock | None = None, precision: Precision | None = None,
                 scaler: LossScaler | None = None, mean_loss: bool = True,
                 keep_outputs: bool = False) -> None:  # fmt: skip
        if last and loss_fn is None:
            raise RuntimeExecutionError(f"stage {index} is the last; it needs loss_fn(output, targets) -> mean loss")
        self.precision, self.scaler = precision or Precision("fp32"), scaler
        self.index, self.stage, self.module = index, stage, module
        self.B, self.first, self.last, self.loss_fn, self.device = global_batch, first, last, loss_fn, device
        self.split = tuple(split)
        self.clock = clock
        self.mean_loss, self.keep_outputs = mean_loss, keep_outputs
        self.layers: list[tuple[int, torch.nn.Module, list[torch.Tensor]]] | None = None
        if isinstance(module, torch.nn.Sequential) and len(module) == stage.hi - stage.lo:
            self.layers = [(stage.lo + i, m, list[torch.Tensor](m.parameters())) for i, m in enumerate(module)]
        elif clock is not None:
            raise RuntimeExecutionError(
                f"per-layer timing needs stage {index} as an nn.Sequential of its {stage.hi - stage.lo} layers"
            )
        self.params: list[torch.Tensor] = list(module.parameters())
        self.cf, self.cb = cumulative(stage.forward), cumulative(stage.backward)
        if stage.recompute:
            self._stash_parts: list[list[Piece]] = all_overlaps(stage.forward, stage.backward)
            self._stash_done = releases(self._stash_parts, backward_order, len(stage.forward))
        self.layer_stamps: list[LayerStamp] = []
        self.run = _Iteration()

    # ------------------------------------------------------------------ helpers
    def start_iteration(self, targets: torch.Tensor | None, kwargs: dict[str, Any] | None = None) -> None:
        """Start a new iteration; ``targets``: the whole batch's targets (last stage only); ``kwargs``: keyword
        inputs of every forward, tensors holding the whole batch on dim 0 (each microbatch gets its samples'
        rows, as torch's schedules chunk them), other values as they are."""
        if kwargs and self.layers is not None and (self.clock is not None or any(self.split)):
            raise RuntimeExecutionError(
                f"stage {self.index} is cut per layer (split backward or per-layer timing) and cannot pass keyword "
                f"inputs {sorted(kwargs)} to each layer; give it a module that is not an nn.Sequential of its layers"
            )
        self.run = _Iteration(targets=targets, kwargs=dict(kwargs or {}))
        self.layer_stamps.clear()


    @property
    def loss(self) -> torch.Tensor | None:
        """Sum of the weighted microbatch losses so far (last stage): the full-batch mean loss (with
        ``mean_loss``), else the sum of the microbatches' losses."""
        return self.run.loss

    @property
    def microbatch_losses(self) -> list[torch.Tensor]:
        """Last stage: this iteration's losses as ``loss_fn`` gave them, in forward-microbatch order."""
        return [self.run.losses[k] for k in sorted(self.run.losses)]

    def outputs(self) -> torch.Tensor | None:
        """Last stage with ``keep_outputs``: this iteration's outputs of the whole batch, in sample order
        (None before any forward)."""
        outs = self.run.outputs
        return torch.cat([outs[k] for k in sorted(outs)]) if outs else None

    def _leaf(self, x: torch.Tensor) -> torch.Tensor:
        """A fresh autograd leaf on the stage input, so that its gradient can be sent back."""
        x = x.detach()
        if self.first:
            return x
        if not x.is_floating_point():
            raise RuntimeExecutionError(
                f"stage {self.index} receives a {x.dtype} tensor, which has no gradient; cut the model "
                f"elsewhere than after layer {self.stage.lo - 1}"
            )
        return x.requires_grad_(True)

    def _weighted_loss(self, out: torch.Tensor, targets: torch.Tensor | None, lo: int, n: int,
                       mb: int | None) -> torch.Tensor:  # fmt: skip
        """The backward's loss for samples ``[lo, lo+n)``; ``mb``: the forward microbatch whose loss to record
        (None in a recomputation, which must not record it twice)."""
        assert self.loss_fn is not None and targets is not None
        loss = self.loss_fn(out, targets.narrow(0, lo, n))
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise RuntimeExecutionError(f"loss_fn must return a scalar tensor (the mean loss), got {loss!r}")
        if mb is not None:
            self.run.losses[mb] = loss.detach().reshape(())
            if self.keep_outputs:
                self.run.outputs[mb] = out.detach()
        return loss * (n / self.B) if self.mean_loss else loss

    @contextmanager
    def _timed(self, layer: int | None, kind: Kind, mb: int, size: int, recompute: bool = False) -> Iterator[None]:
        if self.clock is None or layer is None:
            yield
            return
        start = self.clock.stamp()
        yield
        self.layer_stamps.append(LayerStamp(self.index, layer, kind, mb, size, recompute, start, self.clock.stamp()))

    def _build(self, x: torch.Tensor, targets: torch.Tensor | None, lo: int, n: int, mb: int, *, pieces: bool,
               recompute: bool) -> tuple[list[_Piece], torch.Tensor]:  # fmt: skip
        """Run the stage on ``x`` (samples ``[lo, lo+n)``), recording a graph: (its pieces, the output)."""
        leaf = self._leaf(x)
        autocast = self.precision.autocast(self.device)
        record = None if recompute else mb
        if not pieces or self.layers is None:
            with autocast:
                out = self.module(leaf, **rows_of(self.run.kwargs, lo, n))
                root = self._scaled(self._weighted_loss(out, targets, lo, n, record)) if self.last else out
            return [_Piece(leaf, root, None, self.params)], out
        built: list[_Piece] = []
        h = leaf
        for i, (layer, module, params) in enumerate(self.layers):
            inp = h if i == 0 or not h.requires_grad else h.detach().requires_grad_(True)
            with self._timed(layer, "F", mb, n, recompute), self.precision.autocast(self.device):
                h = module(inp)
                end = self.last and i == len(self.layers) - 1
                root = self._scaled(self._weighted_loss(h, targets, lo, n, record)) if end else h
            built.append(_Piece(inp, root, layer, params))
        return built, h

    def _scaled(self, loss: torch.Tensor) -> torch.Tensor:
        """The backward's root: the loss times the loss scale (fp16), else the loss."""
        return loss * self.scaler.scale if self.scaler is not None else loss

    def _unscaled(self, root: torch.Tensor) -> torch.Tensor:
        return root / self.scaler.scale if self.scaler is not None else root

    # ------------------------------------------------------------------ forward
    def forward(self, k: int, x: torch.Tensor) -> torch.Tensor | None:
        """Forward microbatch ``k`` on input ``x``; returns the output to hand on (None on the last stage)."""
        n, lo, targets = self.stage.forward[k], self.cf[k], self.run.targets
        timed = self.clock is not None
        if self.stage.recompute:
            self.run.stash[k] = x.detach()
            self.run.held[k] = held(self.run.stash[k])  # kept outside autograd: a tally counts it only so
            before = _rng_state(self.device)
            with torch.no_grad():
                built, out = self._build(x, targets, lo, n, k, pieces=timed, recompute=False)
            after = _rng_state(self.device)
            self.run.rng[k] = before
            self.run.random[k] = _drew(before, after)
        else:
            built, out = self._build(x, targets, lo, n, k, pieces=timed or self.split[k], recompute=False)
            self.run.graphs[k] = built
        if self.last:
            loss = self._unscaled(built[-1].out.detach())
            self.run.loss = loss if self.run.loss is None else self.run.loss + loss
            return None
        return out.detach()

    # ----------------------------------------------------------------- backward
    def backward(self, k: int, grad: torch.Tensor | None, split: bool) -> torch.Tensor | None:
        """``B`` (``split`` False) or ``I`` of backward microbatch ``k``, given the gradient of its output.

        Returns the gradient of the stage's input for the samples of the
        microbatch (None on the first stage, or where no gradient reaches the
        input). After ``I``, :meth:`weight` must run for ``k``.
        """
        kind = gradient_kind(split)
        n = self.stage.backward[k]
        built = self._rebuild(k, pieces=split or self.clock is not None) if self.stage.recompute else self.run.graphs.pop(k)
        works: list[tuple[int | None, WeightWork]] = []
        g = grad
        for i, piece in enumerate(reversed(built)):
            if g is None and not (self.last and i == 0):
                break  # nothing flows further down
            with self._timed(piece.layer, kind, k, n):
                if split:
                    (g,), work = backward_input(piece.out, g, [piece.inp], piece.params)
                    works.append((piece.layer, work))
                else:
                    (g,) = backward_full(piece.out, g, [piece.inp], piece.params)
        built.clear()
        if split:
            self.run.weight[k] = works
        return None if self.first else g

    def weight(self, k: int) -> None:
        """``W`` of backward microbatch ``k`` (after its ``I``): accumulate the weight gradients."""
        works = self.run.weight.pop(k, None)
        if works is None:
            raise RuntimeExecutionError(f"stage {self.index} runs {self.index}W{k} before {self.index}I{k}")
        n = self.stage.backward[k]
        for layer, work in works:
            with self._timed(layer, "W", k, n):
                backward_weight(work)

    def _rebuild(self, k: int, pieces: bool) -> list[_Piece]:
        """Recompute: the graph of backward microbatch ``k`` from the stashed inputs (replaying RNG)."""
        parts = self._stash_parts[k]
        missing = [j for j, _, _ in parts if j not in self.run.stash]
        if missing:
            raise RuntimeExecutionError(
                f"stage {self.index} runs its backward microbatch {k} before forward microbatch {missing[0]}, "
                "which holds some of its samples"
            )
        x = assemble(self.run.stash, parts)
        replay = self._replay_state(k)
        for j in self._stash_done[k]:
            self.run.stash.pop(j, None)
            self.run.held.pop(j, None)
            self.run.rng.pop(j, None)
        with _replaying(replay, self.device) if replay is not None else nullcontext():
            built, _ = self._build(x, self.run.targets, self.cb[k], self.stage.backward[k], k, pieces=pieces,
                                   recompute=True)  # fmt: skip
        return built

    def _replay_state(self, k: int) -> RngState | None:
        """The RNG state that replays backward microbatch ``k``'s forward; None if no randomness to replay."""
        parts = self._stash_parts[k]
        (j, offset, count), *rest = parts
        if not rest and offset == 0 and count == self.stage.forward[j]:
            return self.run.rng[j]  # exactly forward microbatch j: replay it
        if any(self.run.random.get(m, False) for m, _, _ in parts):
            lo, hi = self.cb[k], self.cb[k + 1]
            raise RuntimeExecutionError(
                f"stage {self.index} draws random numbers in its forward (dropout?) and recomputes backward "
                f"microbatch {k} (samples [{lo}, {hi})), which is not one of its forward microbatches, so the "
                f"recomputation cannot replay the forward's draws; give stage {self.index} a backward partition "
                "equal to its forward one, or no recompute"
            )
        return None


def rows_of(kwargs: dict[str, Any], lo: int, n: int) -> dict[str, Any]:
    """Keyword inputs of samples ``[lo, lo+n)``: tensors cut on dim 0, other values as they are."""
    return {k: v.narrow(0, lo, n) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}


def _rng_state(device: torch.device) -> RngState:
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return torch.get_rng_state(), cuda


def _drew(before: RngState, after: RngState) -> bool:
    """Whether the generators moved between the two states (the forward drew random numbers)."""
    if not torch.equal(before[0], after[0]):
        return True
    return before[1] is not None and after[1] is not None and not torch.equal(before[1], after[1])


@contextmanager
def _replaying(state: RngState, device: torch.device) -> Iterator[None]:
    """Run the block with the RNG at ``state``, then put the RNG back."""
    cuda = device.type == "cuda"
    index = (device.index if device.index is not None else torch.cuda.current_device()) if cuda else 0
    with torch.random.fork_rng(devices=[index] if cuda else []):
        torch.set_rng_state(state[0])
        if state[1] is not None:
            torch.cuda.set_rng_state(state[1], device)
        yield
