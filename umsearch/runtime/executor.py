"""One pipeline stage executing its static op order on real tensors.

:class:`StageExecutor` is the library entry point for trainers: build the
stage's module, a :class:`~umsearch.runtime.comm.Comm` and (optionally) an
optimizer, then call :meth:`StageExecutor.run_iteration` once per global
batch. After one iteration every parameter holds exactly the gradient of the
full-batch mean loss: each microbatch's mean loss is weighted by its share
``b / B`` of the batch.

Per iteration: every receive of the iteration is posted up front (one buffer
per message, shapes from the plan and the one-off shape header), all stages
meet at a barrier, then the ops run in :func:`umsearch.schedule.op_order`.
A forward waits only for the messages holding its samples, slices and
concatenates them (:mod:`umsearch.runtime.messages`), runs, and hands its output
to an ``isend`` that completes in the background; send handles are waited on
lazily. A recomputing stage keeps only its (detached) inputs and rebuilds each
backward microbatch's graph from them, so its backward partition may differ
from its forward one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from umsearch.errors import RuntimeExecutionError
from umsearch.plan import Plan, StagePlan, validate_plan
from umsearch.runtime.comm import Comm, Handle, Peer
from umsearch.runtime.messages import Piece, assemble, pieces, releases
from umsearch.runtime.shapes import HEADER_LEN, SampleShape, decode, encode, of_tensor, probe
from umsearch.runtime.timing import StampClock
from umsearch.schedule import cumulative, op_order
from umsearch.simulator import OpRecord

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
HEADER_TAG = 1 << 24
"""Tag of the shape header; message tags are message indices, always smaller."""


OpTiming = OpRecord
"""A measured op: the simulator's record, times in ms after the iteration's barrier."""


@dataclass(frozen=True, kw_only=True)
class IterationStats:
    """What one stage measured in one iteration."""

    stage: int
    """Stage index."""
    loss: float | None
    """Full-batch mean loss (last stage only)."""
    ops: tuple[OpTiming, ...]
    """Every op, in execution order."""
    pipeline_ms: float
    """End of this stage's last op: the measured counterpart of the simulator's stage end."""
    step_ms: float
    """Wall time from the barrier to the end of the optimizer step (all sends completed)."""
    peak_memory_bytes: int | None = None
    """Peak allocated device memory during the iteration (CUDA only)."""


@dataclass
class _Inbox:
    """Posted receives of one direction for one iteration."""

    buffers: dict[int, torch.Tensor] = field(default_factory=dict)
    handles: dict[int, Handle] = field(default_factory=dict)

    def take(self, parts: tuple[Piece, ...], done: list[int]) -> torch.Tensor:
        """Wait for the messages of ``parts``, build the microbatch, drop the ``done`` messages."""
        for p in parts:
            handle = self.handles.pop(p.message, None)
            if handle is not None:
                handle.wait()
        out = assemble(self.buffers, parts)
        for m in done:
            self.buffers.pop(m, None)
        return out


class StageExecutor:
    """Runs stage ``stage_index`` of ``plan`` on ``stage_module`` (its layers ``[lo, hi)``).

    ``loss_fn(output, targets)`` must return the MEAN loss of the samples
    given; only the last stage needs it. ``comm`` is needed when the plan has
    more than one stage. With ``optimizer``, each iteration zeroes the stage's
    gradients first and steps at the end; without, gradients accumulate and
    stepping is the caller's business.
    """

    def __init__(
        self,
        plan: Plan,
        stage_index: int,
        stage_module: torch.nn.Module,
        loss_fn: LossFn | None = None,
        comm: Comm | None = None,
        *,
        optimizer: torch.optim.Optimizer | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        validate_plan(plan)
        if not 0 <= stage_index < plan.num_stages:
            raise RuntimeExecutionError(
                f"stage index {stage_index} is outside the plan's {plan.num_stages} stages"
            )
        self.plan = plan
        self.s = stage_index
        self.st: StagePlan = plan.stages[stage_index]
        self.first = stage_index == 0
        self.last = stage_index == plan.num_stages - 1
        if self.last and loss_fn is None:
            raise RuntimeExecutionError("the last stage needs loss_fn(output, targets) -> mean loss")
        if plan.num_stages > 1 and comm is None:
            raise RuntimeExecutionError(f"a {plan.num_stages}-stage plan needs a comm to reach its neighbours")
        self.module = stage_module
        self.loss_fn = loss_fn
        self.comm = comm
        self.optimizer = optimizer
        self.device = torch.device(device) if device is not None else (
            comm.device if comm is not None else torch.device("cpu")
        )  # fmt: skip
        self.order = op_order(self.st.forward, self.st.backward, self.st.warmup)
        self.cf, self.cb = cumulative(self.st.forward), cumulative(self.st.backward)
        self.prev = plan.stages[stage_index - 1] if not self.first else None
        self.next = plan.stages[stage_index + 1] if not self.last else None
        self.in_shape: SampleShape | None = None
        self.out_shape: SampleShape | None = None
        self._fwd_parts, self._fwd_done = self._assembly(self.prev, forward=True)
        self._bwd_parts, self._bwd_done = self._assembly(self.next, forward=False)
        if self.st.recompute:
            self._stash_parts = [
                pieces(self.st.forward, self.st.backward, k) for k in range(len(self.st.backward))
            ]
            self._stash_done = releases(self.st.forward, self.st.backward)
        self.clock = StampClock(self.device)

    def _assembly(
        self, peer: StagePlan | None, forward: bool
    ) -> tuple[list[tuple[Piece, ...]], list[list[int]]]:
        """Pieces and releases of each of my microbatches from ``peer``'s messages."""
        if peer is None:
            return [], []
        sender = peer.forward if forward else peer.backward
        mine = self.st.forward if forward else self.st.backward
        return [pieces(sender, mine, i) for i in range(len(mine))], releases(sender, mine)

    # ----------------------------------------------------------------- setup
    def _check_batch(self, t: torch.Tensor | None, what: str) -> torch.Tensor:
        B = self.plan.global_batch
        if t is None:
            raise RuntimeExecutionError(f"stage {self.s} needs the batch's {what}; pass {what}=...")
        if not isinstance(t, torch.Tensor) or t.dim() == 0 or t.shape[0] != B:
            got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise RuntimeExecutionError(
                f"{what} must hold the plan's global_batch = {B} samples on dim 0, got {got}"
            )
        return t.to(self.device, non_blocking=True)

    def _handshake(self, inputs: torch.Tensor | None) -> None:
        """Learn the input and output sample shapes; tell the next stage its input shape."""
        if self.first:
            assert inputs is not None
            self.in_shape = of_tensor(inputs, "the inputs")
            sample = inputs[:1]
        else:
            header = torch.zeros(HEADER_LEN, dtype=torch.int64, device=self.device)
            self._comm().irecv("prev", header, HEADER_TAG).wait()
            self.in_shape = decode(header)
            sample = self.in_shape.empty(1, self.device).zero_()
        if not self.last:
            where = f"the output of stage {self.s} (layer {self.st.hi - 1})"
            self.out_shape = probe(self.module, sample, where)
            self._comm().isend("next", encode(self.out_shape).to(self.device), HEADER_TAG).wait()

    def _comm(self) -> Comm:
        assert self.comm is not None
        return self.comm

    def _post(self, peer: Peer, sizes: tuple[int, ...], shape: SampleShape | None) -> _Inbox:
        inbox = _Inbox()
        if shape is None:
            return inbox
        for m, n in enumerate(sizes):
            buf = shape.empty(n, self.device)
            inbox.buffers[m] = buf
            inbox.handles[m] = self._comm().irecv(peer, buf, m)
        return inbox

    # ------------------------------------------------------------- iteration
    def run_iteration(
        self, inputs: torch.Tensor | None = None, targets: torch.Tensor | None = None
    ) -> IterationStats:
        """Run one global batch: ``inputs`` on the first stage, ``targets`` on the last."""
        run = self._prepare(inputs, targets)
        if self.comm is not None:
            self.comm.barrier()
        self.clock.reset()
        stamps: list[tuple[str, int, int, int]] = []
        for kind, idx in self.order:
            a = self._forward(run, idx) if kind == "F" else self._backward(run, idx)
            stamps.append((kind, idx, a, self.clock.stamp()))
            self._after_op(run, kind, idx)
        for handle, _ in run.pending:
            handle.wait()
        if self.optimizer is not None:
            self.optimizer.step()
        return self._stats(run, stamps)

    def _prepare(self, inputs: torch.Tensor | None, targets: torch.Tensor | None) -> _Iteration:
        """Check the batch, learn shapes on the first call, post every receive of the iteration."""
        x_all = self._check_batch(inputs, "inputs") if self.first else None
        y_all = self._check_batch(targets, "targets") if self.last else None
        if self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=True)
        if self.in_shape is None:
            self._handshake(x_all)
        elif x_all is not None and of_tensor(x_all, "the inputs") != self.in_shape:
            raise RuntimeExecutionError(
                f"inputs changed shape from {self.in_shape} to {of_tensor(x_all, 'the inputs')}; "
                "make a new StageExecutor for a new input shape"
            )
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        return _Iteration(
            acts=self._post("prev", self.prev.forward, self.in_shape) if self.prev else _Inbox(),
            grads=self._post("next", self.next.backward, self.out_shape) if self.next else _Inbox(),
            inputs=x_all,
            targets=y_all,
        )

    def _stats(self, run: _Iteration, stamps: list[tuple[str, int, int, int]]) -> IterationStats:
        times = self.clock.elapsed_ms()
        ops = tuple(
            OpTiming(
                stage=self.s, kind="F" if kind == "F" else "B", index=idx,
                size=self.st.forward[idx] if kind == "F" else self.st.backward[idx],
                start_ms=times[a], end_ms=times[b],
            )
            for kind, idx, a, b in stamps
        )  # fmt: skip
        loss = float(run.loss.item()) if run.loss is not None else None
        peak = torch.cuda.max_memory_allocated(self.device) if self.device.type == "cuda" else None
        return IterationStats(
            stage=self.s, loss=loss, ops=ops, pipeline_ms=max(op.end_ms for op in ops),
            step_ms=self.clock.wall_ms(), peak_memory_bytes=peak,
        )  # fmt: skip

    def _forward_input(self, run: _Iteration, j: int) -> torch.Tensor:
        if self.first:
            assert run.inputs is not None
            return run.inputs.narrow(0, self.cf[j], self.st.forward[j])
        return run.acts.take(self._fwd_parts[j], self._fwd_done[j])

    def _weighted_loss(self, out: torch.Tensor, run: _Iteration, lo: int, n: int) -> torch.Tensor:
        assert self.loss_fn is not None and run.targets is not None
        loss = self.loss_fn(out, run.targets.narrow(0, lo, n))
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise RuntimeExecutionError(f"loss_fn must return a scalar tensor (the mean loss), got {loss!r}")
        return loss * (n / self.plan.global_batch)

    def _leaf(self, x: torch.Tensor) -> torch.Tensor:
        """A fresh autograd leaf on the stage input, so its gradient can be sent back."""
        x = x.detach()
        if self.first:
            return x
        if not x.is_floating_point():
            raise RuntimeExecutionError(
                f"stage {self.s} receives a {x.dtype} tensor, which has no gradient; cut the model "
                f"elsewhere than after layer {self.st.lo - 1}"
            )
        return x.requires_grad_(True)

    def _forward(self, run: _Iteration, j: int) -> int:
        """Forward microbatch ``j``; returns its start stamp."""
        x = self._forward_input(run, j)
        start = self.clock.stamp()
        n = self.st.forward[j]
        if self.st.recompute:
            run.stash_in[j] = x.detach()
            with torch.no_grad():
                out = self.module(x)
                loss = self._weighted_loss(out, run, self.cf[j], n) if self.last else None
        else:
            x = self._leaf(x)
            out = self.module(x)
            loss = self._weighted_loss(out, run, self.cf[j], n) if self.last else None
            run.graphs[j] = (x, out if loss is None else loss)
        if loss is not None:
            run.add_loss(loss.detach())
        if not self.last:
            run.outbox = out.detach().contiguous()
        return start

    def _backward(self, run: _Iteration, k: int) -> int:
        """Backward microbatch ``k``; returns its start stamp."""
        grad = None if self.last else run.grads.take(self._bwd_parts[k], self._bwd_done[k])
        if self.st.recompute:
            stashed = assemble(run.stash_in, self._stash_parts[k])
            for j in self._stash_done[k]:
                run.stash_in.pop(j, None)
            start = self.clock.stamp()
            x = self._leaf(stashed)
            out = self.module(x)
            root = self._weighted_loss(out, run, self.cb[k], self.st.backward[k]) if self.last else out
        else:
            start = self.clock.stamp()
            x, root = run.graphs.pop(k)
        torch.autograd.backward(root, grad_tensors=grad)
        if not self.first:
            g = x.grad if x.grad is not None else torch.zeros_like(x)
            run.outbox = g.contiguous()
        return start

    def _after_op(self, run: _Iteration, kind: str, idx: int) -> None:
        """Hand the op's message (if any) to a background send."""
        if run.outbox is None:
            return
        peer: Peer = "next" if kind == "F" else "prev"
        # Drop finished sends so their buffers can go (a recomputing stage keeps no outputs).
        run.pending = [(h, t) for h, t in run.pending if not h.is_completed()]
        run.pending.append((self._comm().isend(peer, run.outbox, idx), run.outbox))
        run.outbox = None


@dataclass
class _Iteration:
    """Mutable state of one iteration on one stage."""

    acts: _Inbox
    grads: _Inbox
    inputs: torch.Tensor | None
    targets: torch.Tensor | None
    graphs: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    stash_in: dict[int, torch.Tensor] = field(default_factory=dict)
    pending: list[tuple[Handle, torch.Tensor]] = field(default_factory=list)
    outbox: torch.Tensor | None = None
    loss: torch.Tensor | None = None

    def add_loss(self, value: torch.Tensor) -> None:
        self.loss = value if self.loss is None else self.loss + value
