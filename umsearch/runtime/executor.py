"""One pipeline stage executing its static op order on real tensors.

:class:`StageExecutor` is the library entry point for trainers: build the
stage's module, a :class:`~umsearch.runtime.comm.Comm` and (optionally) an
optimizer, then call :meth:`StageExecutor.run_iteration` once per global
batch. After one iteration every parameter holds exactly the gradient of the
full-batch mean loss: each microbatch's mean loss is weighted by its share
``b / B`` of the batch.

Per iteration all stages meet at a barrier, then the ops run in
:func:`umsearch.core.samples.op_order`. Receives are posted in a bounded window:
before each op a stage makes sure the receives of its next
:data:`RECV_WINDOW` microbatches of each direction are posted (one buffer per
message, shapes from the plan and the one-off shape header), so messages land
while the current op computes, yet receive buffers hold about
``RECV_WINDOW`` microbatches per direction instead of the whole batch (which
MODEL.md section 5 does not count). Posting late cannot deadlock: a send never
blocks its sender (``isend``; only the iteration's end waits for sends), and a
stage posts every receive before it waits for it.

A forward waits only for the messages holding its samples, slices and
concatenates them (:mod:`umsearch.runtime.messages`), runs, and hands its output
to an ``isend`` that completes in the background. A wait that outlasts the
link's timeout fails with the stage, the message and the op it was for.

A recomputing stage keeps only its (detached) inputs and rebuilds each backward
microbatch's graph from them, so its backward partition may differ from its
forward one. Like ``torch.utils.checkpoint`` it stashes the RNG state (CPU,
and the stage's GPU on CUDA) before each forward; a backward microbatch that is
exactly one forward microbatch replays that forward's random draws (dropout
masks). A backward microbatch that spans or splits forward microbatches cannot
replay them: if the stage drew random numbers in that forward, the executor
raises instead of back-propagating through different masks. Layers with
running statistics (BatchNorm) update them twice on a recomputing stage, in the
forward and in the recomputation.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from umsearch.core.errors import RuntimeExecutionError
from umsearch.core.plan import Plan, StagePlan, validate_plan
from umsearch.core.samples import chunk_overlaps, cumulative, op_order
from umsearch.runtime.comm import Comm, Handle, Peer
from umsearch.runtime.messages import Piece, assemble, releases
from umsearch.runtime.shapes import HEADER_LEN, SampleShape, decode, encode, of_tensor, probe
from umsearch.runtime.timing import StampClock
from umsearch.sim.reference import OpRecord

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
HEADER_TAG = 1 << 24
"""Tag of the shape header; message tags are message indices, always smaller."""
RECV_WINDOW = 2
"""A stage keeps the receives of its next this-many microbatches per direction posted."""


OpTiming = OpRecord
"""A measured op: the simulator's record, times in ms after the iteration's barrier."""

RngState = tuple[torch.Tensor, torch.Tensor | None]
"""CPU generator state, and the stage GPU's (None on CPU)."""


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


class _Inbox:
    """The receives of one direction in one iteration, posted a bounded window ahead of need.

    ``parts[i]`` are the slices that build my microbatch ``i`` from the peer's
    messages; ``done[i]`` the messages no later microbatch reads.
    """

    def __init__(self, *, comm: Comm, peer: Peer, sizes: tuple[int, ...], shape: SampleShape,
                 parts: list[list[Piece]], done: list[list[int]], device: torch.device) -> None:  # fmt: skip
        self.comm, self.peer, self.sizes, self.shape, self.device = comm, peer, sizes, shape, device
        self.parts, self.done = parts, done
        self.needs = [max(m for m, _, _ in p) + 1 for p in parts]  # messages microbatch i waits for
        self.buffers: dict[int, torch.Tensor] = {}
        self.handles: dict[int, Handle] = {}
        self.posted = 0  # receives posted so far: messages 0..posted-1

    def post_through(self, index: int) -> None:
        """Post the receives of every message my microbatches ``0..index`` read (no-op if done)."""
        target = self.needs[min(index, len(self.needs) - 1)]
        while self.posted < target:
            m = self.posted
            self.buffers[m] = self.shape.empty(self.sizes[m], self.device)
            self.handles[m] = self.comm.irecv(self.peer, self.buffers[m], m)
            self.posted += 1

    def take(self, index: int, wait: Callable[[Handle, int], None]) -> torch.Tensor:
        """Wait for the messages of microbatch ``index``, build it, drop the messages it was last to read."""
        self.post_through(index)
        for m, _, _ in self.parts[index]:
            handle = self.handles.pop(m, None)
            if handle is not None:
                wait(handle, m)
        out = assemble(self.buffers, self.parts[index])
        for m in self.done[index]:
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
        if self.st.recompute:
            self._stash_parts = _parts(self.st.forward, self.st.backward)
            self._stash_done = releases(self.st.forward, self.st.backward)
        self.clock = StampClock(self.device)

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
            self._wait(self._comm().irecv("prev", header, HEADER_TAG), f"the shape header from stage {self.s - 1}")
            self.in_shape = decode(header)
            sample = self.in_shape.empty(1, self.device).zero_()
        if not self.last:
            where = f"the output of stage {self.s} (layer {self.st.hi - 1})"
            self.out_shape = probe(self.module, sample, where)
            sent = self._comm().isend("next", encode(self.out_shape).to(self.device), HEADER_TAG)
            self._wait(sent, f"stage {self.s + 1} to take its shape header")

    def _comm(self) -> Comm:
        assert self.comm is not None
        return self.comm

    def _wait(self, handle: Handle, what: str) -> None:
        """``handle.wait()``; a failure (the link's timeout, a dead peer) names the stage and ``what``."""
        try:
            handle.wait()
        except RuntimeError as exc:
            lines = str(exc).strip().splitlines()
            # gloo prefixes its messages with "[path/to/file.cc:line] ".
            detail = re.sub(r"^\[[^\]]*\]\s*", "", lines[0]) if lines else type(exc).__name__
            raise RuntimeExecutionError(
                f"stage {self.s} gave up waiting for {what}: {detail} (if that stage is still running, "
                "the stages wait on each other: a deadlock the plan check missed, or --timeout is too short)"
            ) from None

    def _inbox(self, forward: bool) -> _Inbox | None:
        peer_plan = self.prev if forward else self.next
        shape = self.in_shape if forward else self.out_shape
        if peer_plan is None or shape is None:
            return None
        sender = peer_plan.forward if forward else peer_plan.backward
        mine = self.st.forward if forward else self.st.backward
        return _Inbox(comm=self._comm(), peer="prev" if forward else "next", sizes=sender, shape=shape,
                      parts=_parts(sender, mine), done=releases(sender, mine), device=self.device)  # fmt: skip

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
            self._post_ahead(run)
            a = self._forward(run, idx) if kind == "F" else self._backward(run, idx)
            stamps.append((kind, idx, a, self.clock.stamp()))
            self._after_op(run, kind, idx)
        for handle, _, what in run.pending:
            self._wait(handle, what)
        if self.optimizer is not None:
            self.optimizer.step()
        return self._stats(run, stamps)

    def _prepare(self, inputs: torch.Tensor | None, targets: torch.Tensor | None) -> _Iteration:
        """Check the batch, learn shapes on the first call, post the first window of receives."""
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
        run = _Iteration(acts=self._inbox(forward=True), grads=self._inbox(forward=False), inputs=x_all,
                         targets=y_all)  # fmt: skip
        self._post_ahead(run)
        return run

    def _post_ahead(self, run: _Iteration) -> None:
        """Keep the receives of the next :data:`RECV_WINDOW` microbatches of each direction posted."""
        if run.acts is not None:
            run.acts.post_through(run.forwards_done + RECV_WINDOW - 1)
        if run.grads is not None:
            run.grads.post_through(run.backwards_done + RECV_WINDOW - 1)

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
        assert run.acts is not None
        return run.acts.take(j, lambda h, m: self._wait(
            h, f"activation message {m} from stage {self.s - 1}, needed by forward microbatch {j}"))

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

    def _rng_state(self) -> RngState:
        cuda = torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None
        return torch.get_rng_state(), cuda

    @contextmanager
    def _replaying(self, state: RngState | None) -> Iterator[None]:
        """Run the block with the RNG at ``state``, then put the RNG back (no-op for None)."""
        if state is None:
            yield
            return
        cuda = self.device.type == "cuda"
        index = (self.device.index if self.device.index is not None else torch.cuda.current_device()) if cuda else 0
        with torch.random.fork_rng(devices=[index] if cuda else []):
            torch.set_rng_state(state[0])
            if state[1] is not None:
                torch.cuda.set_rng_state(state[1], self.device)
            yield

    def _forward(self, run: _Iteration, j: int) -> int:
        """Forward microbatch ``j``; returns its start stamp."""
        x = self._forward_input(run, j)
        start = self.clock.stamp()
        n = self.st.forward[j]
        if self.st.recompute:
            run.stash_in[j] = x.detach()
            rng = self._rng_state()
            with torch.no_grad():
                out = self.module(x)
                loss = self._weighted_loss(out, run, self.cf[j], n) if self.last else None
            after = self._rng_state()
            run.rng[j] = rng
            run.random[j] = not torch.equal(rng[0], after[0]) or (
                rng[1] is not None and after[1] is not None and not torch.equal(rng[1], after[1])
            )  # fmt: skip
        else:
            x = self._leaf(x)
            out = self.module(x)
            loss = self._weighted_loss(out, run, self.cf[j], n) if self.last else None
            run.graphs[j] = (x, out if loss is None else loss)
        if loss is not None:
            run.add_loss(loss.detach())
        if not self.last:
            run.outbox = out.detach().contiguous()
        run.forwards_done = j + 1
        return start

    def _replay_state(self, run: _Iteration, k: int) -> RngState | None:
        """The RNG state that replays backward microbatch ``k``'s forward; None if there was no randomness."""
        parts = self._stash_parts[k]
        (j, offset, count), *rest = parts
        if not rest and offset == 0 and count == self.st.forward[j]:
            return run.rng[j]  # exactly forward microbatch j: replay it
        if any(run.random[m] for m, _, _ in parts):
            lo, hi = self.cb[k], self.cb[k + 1]
            raise RuntimeExecutionError(
                f"stage {self.s} draws random numbers in its forward (dropout?) and recomputes backward "
                f"microbatch {k} (samples [{lo}, {hi})), which is not one of its forward microbatches, so the "
                f"recomputation cannot replay the forward's draws; give stage {self.s} a backward partition "
                "equal to its forward one, or no recompute"
            )
        return None

    def _backward(self, run: _Iteration, k: int) -> int:
        """Backward microbatch ``k``; returns its start stamp."""
        grad = None
        if not self.last:
            assert run.grads is not None
            grad = run.grads.take(k, lambda h, m: self._wait(
                h, f"gradient message {m} from stage {self.s + 1}, needed by backward microbatch {k}"))
        if self.st.recompute:
            stashed = assemble(run.stash_in, self._stash_parts[k])
            replay = self._replay_state(run, k)
            for j in self._stash_done[k]:
                run.stash_in.pop(j, None)
                run.rng.pop(j, None)
            start = self.clock.stamp()
            x = self._leaf(stashed)
            with self._replaying(replay):
                out = self.module(x)
            root = self._weighted_loss(out, run, self.cb[k], self.st.backward[k]) if self.last else out
        else:
            start = self.clock.stamp()
            x, root = run.graphs.pop(k)
        # Nothing to differentiate when no parameter and no input needs a gradient (a first stage
        # without parameters); autograd would refuse the call.
        if root.requires_grad:
            torch.autograd.backward(root, grad_tensors=grad)
        if not self.first:
            g = x.grad if x.grad is not None else torch.zeros_like(x)
            run.outbox = g.contiguous()
        run.backwards_done = k + 1
        return start

    def _after_op(self, run: _Iteration, kind: str, idx: int) -> None:
        """Hand the op's message (if any) to a background send."""
        if run.outbox is None:
            return
        peer: Peer = "next" if kind == "F" else "prev"
        # Drop finished sends so their buffers can go (a recomputing stage keeps no outputs).
        run.pending = [p for p in run.pending if not p[0].is_completed()]
        to = self.s + 1 if kind == "F" else self.s - 1
        what = f"stage {to} to receive {'activation' if kind == 'F' else 'gradient'} message {idx}"
        run.pending.append((self._comm().isend(peer, run.outbox, idx), run.outbox, what))
        run.outbox = None


def _parts(sender: tuple[int, ...], receiver: tuple[int, ...]) -> list[list[Piece]]:
    """For each receiver microbatch, its slices of the sender's messages."""
    return [chunk_overlaps(sender, receiver, i) for i in range(len(receiver))]


@dataclass
class _Iteration:
    """Mutable state of one iteration on one stage."""

    acts: _Inbox | None
    grads: _Inbox | None
    inputs: torch.Tensor | None
    targets: torch.Tensor | None
    forwards_done: int = 0
    backwards_done: int = 0
    graphs: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    stash_in: dict[int, torch.Tensor] = field(default_factory=dict)
    rng: dict[int, RngState] = field(default_factory=dict)
    random: dict[int, bool] = field(default_factory=dict)
    pending: list[tuple[Handle, torch.Tensor, str]] = field(default_factory=list)
    outbox: torch.Tensor | None = None
    loss: torch.Tensor | None = None

    def add_loss(self, value: torch.Tensor) -> None:
        self.loss = value if self.loss is None else self.loss + value
