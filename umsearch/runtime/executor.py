"""One rank interpreting its action list of a plan/2 on real tensors.

:class:`StageExecutor` is the library entry point for trainers: give it the
plan, the rank, one module per stage the rank holds (in stage order), a
:class:`~umsearch.runtime.comm.Comm` and (optionally) an optimizer, then call
:meth:`StageExecutor.run_iteration` once per global batch. After one
iteration every parameter holds exactly the gradient of the full-batch mean
loss (:mod:`umsearch.runtime.stage` does the compute; this module decides
what runs when, and moves tensors).

Per iteration all ranks meet at a barrier, then the rank runs its actions in
list order:

- ``jFk`` takes its input from the batch (stage 0), from the outputs of stage
  ``j-1``'s forwards (same rank: local tensors, no message) or from stage
  ``j-1``'s messages (another rank), assembled from the slices that hold its
  samples (:mod:`umsearch.runtime.messages`; partitions may differ), runs, and
  hands its output on: a local hand-off, or an ``isend``.
- ``jBk`` / ``jIk`` take the gradient of their samples the same way from stage
  ``j+1``'s ``B``/``I`` (the last stage starts from its loss), run, and hand
  the input gradient to stage ``j-1``. ``jWk`` needs nothing but its ``I``.

Receives are posted in a bounded window: on every link (sending rank ->
this rank) receives are posted in the order the sender sends (NCCL matches in
issue order; see :mod:`umsearch.runtime.comm`), far enough ahead to cover the
next :data:`RECV_WINDOW` actions that read from the link, so messages land
while the current action computes, yet buffers hold a few messages instead of
a batch's worth. Posting late cannot deadlock: a send never blocks its sender
(``isend``; only the iteration's end waits for sends), and a rank posts every
receive before it waits for it. A wait that fails (the link's timeout, a
dead peer) names the rank, the message and the action it was for.

Every action is timed (:class:`~umsearch.core.actions.ActionRecord`, ms after
the barrier): from when its inputs are there to when its output is handed
on, so posting, assembling and sending count, waiting does not. With
``layer_timing`` the stages also time each layer's ``F``/``B``/``I``/``W``
(:class:`~umsearch.runtime.timing.LayerRecord`).

A data-parallel plan (docs/model.md section 9) runs one executor per rank of
every replica, each given its replica's own ``B / D`` samples and a
:class:`~umsearch.runtime.gradsync.GradSync`: once the rank's last ``B``/``W``
of a stage has ended, that stage's gradients start their all-reduce across the
stage's copies (asynchronously, while the rank runs the rest of its list);
the iteration waits for them all before the optimizer steps.

Setup is linear in the plan: one merge of the two partitions per pair of
neighbouring stages and one pass over the rank lists that feed this rank
(plans may hold 100,000 microbatches).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch

from umsearch.core.actions import Action, ActionRecord
from umsearch.core.errors import RuntimeExecutionError
from umsearch.core.plan import Plan
from umsearch.core.plan_rules import validate_plan
from umsearch.core.samples import all_overlaps
from umsearch.nn.precision import LossScaler, Precision
from umsearch.runtime.comm import Comm, Handle, first_line
from umsearch.runtime.gradsync import GradSync
from umsearch.runtime.messages import Piece, assemble, releases
from umsearch.runtime.shapes import HEADER_LEN, SampleShape, decode, encode, of_tensor, probe
from umsearch.runtime.stage import LossFn, StageCompute, rows_of
from umsearch.runtime.timing import LayerRecord, StampClock

RECV_WINDOW = 2
"""On each link, receives cover the messages of the next this-many actions that read from it."""

MAX_TAG = 0x7FFF_FFFE
"""Largest message tag (int32, below the connecting message's)."""


def tag(stage: int, gradient: bool, mb: int, num_stages: int) -> int:
    """The tag of the message ``stage`` sends for microbatch ``mb`` (``mb = -1``: its shape header).

    Unique per message of a plan: it encodes the sending stage, the direction
    and the microbatch (of the sender's forward list for activations, of its
    backward list for gradients).
    """
    return ((mb + 1) * num_stages + stage) * 2 + int(gradient)


@dataclass(frozen=True, kw_only=True)
class IterationStats:
    """What one rank measured in one iteration."""

    rank: int
    """The rank."""
    stages: tuple[int, ...]
    """The stages it holds."""
    loss: float | None
    """Only on the rank holding the last stage: the full-batch mean loss, or with ``D`` replicas this
    replica's share of it (its samples' mean loss over ``D``; the shares sum to the full-batch loss)."""
    actions: tuple[ActionRecord, ...]
    """Every action, in execution order, with its times."""
    pipeline_ms: float
    """End of this rank's last action: the measured counterpart of the simulator's rank end."""
    step_ms: float
    """Wall time from the barrier to the end of the optimizer step (all sends completed)."""
    layers: tuple[LayerRecord, ...] = ()
    """Per-layer times (``layer_timing`` only)."""
    peak_memory_bytes: int | None = None
    """Peak allocated device memory during the iteration (CUDA only)."""
    replica: int = 0
    """The data-parallel replica the rank belongs to."""
    allreduce_end_ms: float | None = None
    """When the wait for the gradient all-reduces ended (ms after the barrier; None without replicas)."""

    @property
    def ops(self) -> tuple[ActionRecord, ...]:
        """The actions under their version-1 name (callers move to :attr:`actions`)."""
        return self.actions


class _Channel:
    """The messages from one neighbouring stage into one stage of this rank, in one direction.

    ``parts[k]`` are the slices that build the receiving stage's microbatch
    ``k`` from the sender's messages (one per sender microbatch);
    ``release[k]`` the messages no later reader needs.
    """

    def __init__(self, *, stage: int, gradient: bool, sender: int, sender_rank: int, local: bool,
                 parts: list[list[Piece]], release: list[list[int]], sizes: tuple[int, ...]) -> None:  # fmt: skip
        self.stage, self.gradient, self.sender, self.sender_rank, self.local = stage, gradient, sender, sender_rank, local
        self.parts, self.release, self.sizes = parts, release, sizes
        self.shape: SampleShape | None = None
        self.seq: list[int] = [-1] * len(sizes)  # remote: each message's place in its link's order
        self.buffers: dict[int, torch.Tensor] = {}
        self.handles: dict[int, Handle] = {}

    def message(self, m: int) -> str:
        """``activation message 0F3`` / ``gradient message 2B1``: the sender's action that made it."""
        kind = "gradient" if self.gradient else "activation"
        return f"{kind} message {self.sender}{'B' if self.gradient else 'F'}{m}"

    def need(self, k: int) -> int:
        """The last place in the link's order among the messages microbatch ``k`` reads."""
        return max(self.seq[m] for m, _, _ in self.parts[k])


@dataclass
class _Link:
    """The receives from one other rank, posted in its send order."""

    src: int
    order: list[tuple[_Channel, int]] = field(default_factory=list)
    """``(channel, message)`` in the order ``src`` sends them."""
    readers: list[int] = field(default_factory=list)
    """Positions (in this rank's list) of the actions that read from the link, ascending."""
    through: list[int] = field(default_factory=list)
    """``through[i]``: receives the readers ``0..i`` need (the last place in :attr:`order`, prefix max)."""
    posted: int = 0
    """Receives posted so far this iteration: ``order[:posted]``."""
    next_reader: int = 0
    """First entry of :attr:`readers` not yet passed this iteration."""


class StageExecutor:
    """Runs rank ``rank``'s actions of ``plan`` on ``stage_modules`` (one per stage it holds, in stage order).

    ``loss_fn(output, targets)`` must return the MEAN loss of the samples
    given; only the rank holding the last stage needs it. ``comm`` is needed
    when the plan has more than one rank. With ``optimizer``, each iteration
    zeroes the gradients first and steps at the end; without, gradients
    accumulate and stepping is the caller's business. ``layer_timing``: time
    every layer's part of every action too (stage modules must then be
    ``nn.Sequential`` of their layers). ``precision``: forwards run under its autocast (bf16, fp16) and
    fp16 scales the loss, every rank deciding alike whether to step
    (:class:`~umsearch.nn.precision.LossScaler`); after an iteration the gradients are unscaled.
    ``grad_sync``: needed when the plan has ``data_parallel > 1`` (the inputs are then this replica's
    ``plan.replica_batch`` samples); each stage's gradients are all-reduced across its copies.
    ``mean_loss`` False: the gradients are those of the SUM of ``loss_fn`` over the last stage's
    microbatches (torch's ``scale_grads=False``), and the reported loss is that sum.
    ``keep_outputs``: the last stage keeps its outputs of the iteration (:meth:`outputs`).
    ``forward_only``: run only the rank's forwards, in list order and without autograd (evaluation; every
    rank of the plan must run forward-only too); no gradient moves and nothing steps.
    """

    def __init__(
        self,
        plan: Plan,
        rank: int,
        stage_modules: Sequence[torch.nn.Module],
        loss_fn: LossFn | None = None,
        comm: Comm | None = None,
        *,
        optimizer: torch.optim.Optimizer | None = None,
        device: torch.device | str | None = None,
        layer_timing: bool = False,
        precision: Precision | str | None = None,
        grad_sync: GradSync | None = None,
        mean_loss: bool = True,
        keep_outputs: bool = False,
        forward_only: bool = False,
    ) -> None:
        validate_plan(plan)
        if plan.data_parallel > 1 and grad_sync is None:
            raise RuntimeExecutionError(
                f"the plan has {plan.data_parallel} data-parallel replicas; give the executor a grad_sync "
                "(umsearch.runtime.gradsync.GradSync.create) so that every stage's gradients are all-reduced"
            )
        if not 0 <= rank < plan.ranks:
            raise RuntimeExecutionError(f"rank {rank} is outside the plan's {plan.ranks} ranks (0..{plan.ranks - 1})")
        self.plan, self.rank = plan, rank
        self.mine = plan.stages_of(rank)
        if len(stage_modules) != len(self.mine):
            raise RuntimeExecutionError(
                f"rank {rank} holds stages {list(self.mine)} but got {len(stage_modules)} stage module(s); "
                "give one per stage, in stage order"
            )
        if plan.ranks > 1 and comm is None:
            raise RuntimeExecutionError(f"a {plan.ranks}-rank plan needs a comm to reach the other ranks")
        S = plan.num_stages
        biggest = max(max(len(st.forward), len(st.backward)) for st in plan.stages)
        if tag(S - 1, True, biggest - 1, S) > MAX_TAG:
            raise RuntimeExecutionError(
                f"{S} stages x {biggest} microbatches need message tags beyond int32; use fewer microbatches"
            )
        self.comm, self.optimizer, self.grad_sync = comm, optimizer, grad_sync
        self.device = torch.device(device) if device is not None else (
            comm.device if comm is not None else torch.device("cpu")
        )  # fmt: skip
        self.forward_only = forward_only
        self.actions = tuple(a for a in plan.actions[rank] if a.is_forward or not forward_only)
        self.clock = StampClock(self.device)
        self.precision = precision if isinstance(precision, Precision) else Precision(precision or "fp32")
        self.scaler = LossScaler() if self.precision.scales_loss else None
        self.stages = self._stage_computes(stage_modules, loss_fn, layer_timing, mean_loss, keep_outputs)
        self.acts: dict[int, _Channel] = {}  # stage j's input activations (from j-1)
        self.grads: dict[int, _Channel] = {}  # stage j's output gradients (from j+1)
        self._make_channels()
        self.links = self._make_links()
        self.shapes_known = False
        self.in_shapes: dict[int, SampleShape] = {}
        self.sends: dict[int, deque[tuple[Handle, torch.Tensor, str]]] = {}
        self.reduce_after = self._last_gradient_actions() if grad_sync is not None else {}

    # ------------------------------------------------------------------ setup
    def _stage_computes(self, modules: Sequence[torch.nn.Module], loss_fn: LossFn | None, layer_timing: bool,
                        mean_loss: bool, keep_outputs: bool) -> dict[int, StageCompute]:  # fmt: skip
        split: dict[int, list[bool]] = {j: [False] * len(self.plan.stages[j].backward) for j in self.mine}
        order: dict[int, list[int]] = {j: [] for j in self.mine}
        for a in self.actions:
            if a.sends_gradient:  # a B or an I runs the backward; an I splits it
                split[a.stage][a.mb] = a.is_split
                order[a.stage].append(a.mb)
        S = self.plan.num_stages
        return {
            j: StageCompute(index=j, stage=self.plan.stages[j], module=m, global_batch=self.plan.global_batch,
                            first=j == 0, last=j == S - 1, loss_fn=loss_fn, device=self.device, split=split[j],
                            backward_order=order[j], clock=self.clock if layer_timing else None,
                            precision=self.precision, scaler=self.scaler, mean_loss=mean_loss,
                            keep_outputs=keep_outputs)
            for j, m in zip(self.mine, modules, strict=True)
        }  # fmt: skip

    def _last_gradient_actions(self) -> dict[int, int]:
        """Position in this rank's list -> the stage whose gradients are complete once it has run: the
        stage's last ``B`` or ``W`` (a split backward ends with its ``W``)."""
        last = {a.stage: pos for pos, a in enumerate(self.actions) if a.ends_backward}
        return {pos: j for j, pos in last.items()}

    def _make_channels(self) -> None:
        st, S = self.plan.stages, self.plan.num_stages
        fwd_order: dict[int, list[int]] = {j: [] for j in self.mine}
        bwd_order: dict[int, list[int]] = {j: [] for j in self.mine}
        for a in self.actions:
            if a.is_forward:
                fwd_order[a.stage].append(a.mb)
            elif a.sends_gradient:
                bwd_order[a.stage].append(a.mb)
        for j in self.mine:
            # A forward reads its source stage's outputs, a B/I its source's gradients (Action.source).
            for reader, channels, order in ((Action(j, "F", 0), self.acts, fwd_order),
                                            (Action(j, "B", 0), self.grads, bwd_order)):  # fmt: skip
                src = reader.source(S)
                if src is None:
                    continue
                theirs = reader.sizes(st[src].forward, st[src].backward)
                parts = all_overlaps(theirs, reader.sizes(st[j].forward, st[j].backward))
                channels[j] = _Channel(stage=j, gradient=not reader.is_forward, sender=src,
                                       sender_rank=st[src].rank, local=st[src].rank == self.rank, parts=parts,
                                       release=releases(parts, order[j], len(theirs)), sizes=theirs)  # fmt: skip

    def _input_channel(self, a: Action) -> _Channel | None:
        """Where ``a``'s input comes from: None where it reads no other stage (Action.source)."""
        if a.source(self.plan.num_stages) is None:
            return None
        return (self.acts if a.is_forward else self.grads)[a.stage]

    def _make_links(self) -> dict[int, _Link]:
        """Every other rank's messages to this rank in its send order, and how far ahead to post them."""
        st, S = self.plan.stages, self.plan.num_stages
        links: dict[int, _Link] = {}
        for src, acts in enumerate(self.plan.actions):
            if src == self.rank:
                continue
            link = _Link(src=src)
            for a in acts:
                if self.forward_only and not a.is_forward:
                    continue
                to = a.consumer(S)
                if to is None or st[to].rank != self.rank:
                    continue
                ch = (self.acts if a.is_forward else self.grads)[to]
                ch.seq[a.mb] = len(link.order)
                link.order.append((ch, a.mb))
            if link.order:
                links[src] = link
        for pos, a in enumerate(self.actions):
            reads = self._input_channel(a)
            if reads is None or reads.local:
                continue
            link = links[reads.sender_rank]
            need = reads.need(a.mb)
            link.readers.append(pos)
            link.through.append(max(need, link.through[-1]) if link.through else need)
        return links

    # ------------------------------------------------------------ messages
    def _comm(self) -> Comm:
        assert self.comm is not None
        return self.comm

    def _wait(self, handle: Handle, what: str) -> None:
        """``handle.wait()``; a failure (the link's timeout, a dead peer) names the rank and ``what``."""
        try:
            handle.wait()
        except RuntimeError as exc:
            raise RuntimeExecutionError(
                f"rank {self.rank} gave up waiting for {what}: {first_line(exc)} (if that rank is still running, "
                "the ranks wait on each other: a deadlock the plan check missed, or --timeout is too short)"
            ) from None

    def _post(self, link: _Link, through: int) -> None:
        """Post the receives of ``link.order[:through + 1]`` not yet posted."""
        while link.posted <= through:
            ch, m = link.order[link.posted]
            assert ch.shape is not None
            buf = ch.shape.empty(ch.sizes[m], self.device)
            ch.buffers[m] = buf
            ch.handles[m] = self._comm().irecv(link.src, buf, tag(ch.sender, ch.gradient, m, self.plan.num_stages))
            link.posted += 1

    def _post_ahead(self, pos: int) -> None:
        """Receives for the next :data:`RECV_WINDOW` readers of every link, from action ``pos`` on."""
        for link in self.links.values():
            while link.next_reader < len(link.readers) and link.readers[link.next_reader] < pos:
                link.next_reader += 1
            i = min(link.next_reader + RECV_WINDOW, len(link.readers)) - 1
            if i >= 0:
                self._post(link, link.through[i])

    def _take(self, ch: _Channel, a: Action) -> torch.Tensor:
        """The input (activations or gradient) of action ``a`` from ``ch``: wait, assemble, release."""
        parts = ch.parts[a.mb]
        if ch.local:
            missing = [m for m, _, _ in parts if m not in ch.buffers]
            if missing:
                raise RuntimeExecutionError(
                    f"rank {self.rank} runs {a} before {ch.message(missing[0]).split()[-1]} on the same rank, "
                    f"whose {'gradient' if ch.gradient else 'output'} it needs: the plan deadlocks"
                )
        else:
            link = self.links[ch.sender_rank]
            self._post(link, ch.need(a.mb))
            for m, _, _ in parts:
                handle = ch.handles.pop(m, None)
                if handle is not None:
                    self._wait(handle, f"{ch.message(m)} from rank {ch.sender_rank}, needed by {a}")
        out = assemble(ch.buffers, parts)
        for m in ch.release[a.mb]:
            ch.buffers.pop(m, None)
        return out

    def _deliver(self, a: Action, t: torch.Tensor) -> None:
        """Hand ``a``'s output (or input gradient) to the stage it feeds (Action.consumer)."""
        to = a.consumer(self.plan.num_stages)
        assert to is not None
        stage, gradient, mb = a.stage, not a.is_forward, a.mb
        ch = (self.grads if gradient else self.acts).get(to)
        if ch is not None and ch.local:
            ch.buffers[mb] = t
            return
        dst = self.plan.stages[to].rank
        t = t.contiguous()
        pending = self.sends.setdefault(dst, deque())
        while pending and pending[0][0].is_completed():  # a link's sends complete in order
            pending.popleft()
        what = f"rank {dst} to receive {'gradient' if gradient else 'activation'} message {stage}{'B' if gradient else 'F'}{mb}"
        pending.append((self._comm().isend(dst, t, tag(stage, gradient, mb, self.plan.num_stages)), t, what))

    # --------------------------------------------------------------- shapes
    def _handshake(self, inputs: torch.Tensor | None, kwargs: dict[str, Any]) -> None:
        """Learn every stage's input and output sample shapes; tell other ranks theirs (in stage order)."""
        st, S = self.plan.stages, self.plan.num_stages
        out_shape: dict[int, SampleShape] = {}
        sent: list[tuple[Handle, torch.Tensor, str]] = []
        for j in self.mine:
            fwd = Action(j, "F", 0)  # its forwards read the source's outputs and feed the consumer
            src, dst = fwd.source(S), fwd.consumer(S)
            if src is None:
                assert inputs is not None
                in_shape, sample = of_tensor(inputs, "the inputs"), inputs[:1]
            else:
                if st[src].rank == self.rank:
                    in_shape = out_shape[src]
                else:
                    header = torch.zeros(HEADER_LEN, dtype=torch.int64, device=self.device)
                    peer = st[src].rank
                    self._wait(self._comm().irecv(peer, header, tag(src, False, -1, S)),
                               f"the shape header of stage {src} from rank {peer}")  # fmt: skip
                    in_shape = decode(header)
                sample = in_shape.empty(1, self.device).zero_()
                self.acts[j].shape = in_shape
            self.in_shapes[j] = in_shape
            if dst is not None:
                where = f"the output of stage {j} (layer {fwd.sent_boundary(st[j].lo, st[j].hi)})"
                with self.precision.autocast(self.device):  # the dtype the stage really sends
                    out_shape[j] = probe(self.stages[j].module, sample, where, rows_of(kwargs, 0, 1))
                self.grads[j].shape = out_shape[j]  # the gradient it gets back is its output's
                if st[dst].rank != self.rank:
                    header = encode(out_shape[j]).to(self.device)
                    peer = st[dst].rank
                    sent.append((self._comm().isend(peer, header, tag(j, False, -1, S)), header,
                                 f"rank {peer} to take the shape header of stage {j}"))  # fmt: skip
        for handle, _, what in sent:
            self._wait(handle, what)
        self.shapes_known = True

    # ------------------------------------------------------------ iteration
    @property
    def needs_inputs(self) -> bool:
        """Whether this rank holds stage 0 (and so needs the batch's inputs)."""
        return 0 in self.stages

    @property
    def needs_targets(self) -> bool:
        """Whether this rank holds the last stage (and so needs the batch's targets)."""
        return self.plan.num_stages - 1 in self.stages

    def _check_batch(self, t: torch.Tensor | None, what: str) -> torch.Tensor:
        B, D = self.plan.replica_batch, self.plan.data_parallel
        if t is None:
            raise RuntimeExecutionError(f"rank {self.rank} holds stage {0 if what == 'inputs' else self.plan.num_stages - 1} "
                                        f"and needs the batch's {what}; pass {what}=...")  # fmt: skip
        if not isinstance(t, torch.Tensor) or t.dim() == 0 or t.shape[0] != B:
            got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            whose = "the plan's global_batch" if D == 1 else "this replica's global_batch / data_parallel"
            raise RuntimeExecutionError(f"{what} must hold {whose} = {B} samples on dim 0, got {got}")
        return t.to(self.device, non_blocking=True)

    def run_iteration(self, inputs: torch.Tensor | None = None, targets: torch.Tensor | None = None,
                      model_kwargs: dict[str, Any] | None = None) -> IterationStats:  # fmt: skip
        """Run one global batch: ``inputs`` where the rank holds stage 0, ``targets`` where it holds the last
        (with replicas: this replica's ``plan.replica_batch`` samples of it). ``model_kwargs``: keyword inputs
        of every stage's forward, tensors holding the batch on dim 0 (each microbatch gets its rows)."""
        x_all = self._check_batch(inputs, "inputs") if self.needs_inputs else None
        y_all = self._check_batch(targets, "targets") if self.needs_targets else None
        kwargs = {k: self._check_batch(v, f"keyword input {k!r}") if isinstance(v, torch.Tensor) else v
                  for k, v in (model_kwargs or {}).items()}  # fmt: skip
        if self.optimizer is not None and not self.forward_only:
            self.optimizer.zero_grad(set_to_none=True)
        if not self.shapes_known:
            self._handshake(x_all, kwargs)
        elif x_all is not None and of_tensor(x_all, "the inputs") != self.in_shapes[0]:
            raise RuntimeExecutionError(
                f"inputs changed shape from {self.in_shapes[0]} to {of_tensor(x_all, 'the inputs')}; "
                "make a new StageExecutor for a new input shape"
            )
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        for s in self.stages.values():
            s.start_iteration(y_all if s.last else None, kwargs)
        for link in self.links.values():
            link.posted = link.next_reader = 0
        self._post_ahead(0)
        if self.comm is not None:
            self.comm.barrier()
        self.clock.reset()
        stamps = []
        with torch.no_grad() if self.forward_only else nullcontext():
            for pos, a in enumerate(self.actions):
                stamps.append(self._run_action(pos, a, x_all))
                if pos in self.reduce_after:
                    j = self.reduce_after[pos]
                    assert self.grad_sync is not None
                    self.grad_sync.start(j, self.stages[j].params)
        for pending in self.sends.values():
            while pending:
                handle, _, what = pending.popleft()
                self._wait(handle, what)
        reduced = None
        if self.grad_sync is not None:
            self.grad_sync.finish()
            reduced = self.clock.stamp()
        if self.forward_only:
            return self._stats(stamps, reduced)
        step = self.scaler is None or self.scaler.unscale_and_update(self._params(), self.device)
        if self.optimizer is not None and step:
            self.optimizer.step()
        return self._stats(stamps, reduced)

    def microbatch_losses(self) -> list[torch.Tensor]:
        """On the rank holding the last stage: the last iteration's loss of each of its forward microbatches,
        as ``loss_fn`` gave it (in microbatch order); elsewhere empty."""
        last = self.stages.get(self.plan.num_stages - 1)
        return last.microbatch_losses if last is not None else []

    def outputs(self) -> torch.Tensor | None:
        """With ``keep_outputs``, on the rank holding the last stage: the last iteration's outputs of all its
        samples in order; otherwise None."""
        last = self.stages.get(self.plan.num_stages - 1)
        return last.outputs() if last is not None else None

    def _params(self) -> list[torch.Tensor]:
        return [p for s in self.stages.values() for p in s.module.parameters()]

    def _run_action(self, pos: int, a: Action, x_all: torch.Tensor | None) -> tuple[int, int]:
        """Run action ``a`` (at ``pos`` in the list); its start and end stamps."""
        stage = self.stages[a.stage]
        ch = self._input_channel(a)
        if a.is_forward:
            if ch is None:
                assert x_all is not None
                x = x_all.narrow(0, stage.cf[a.mb], stage.stage.forward[a.mb])
            else:
                x = self._take(ch, a)
            start = self.clock.stamp()
            self._post_ahead(pos + 1)
            out = stage.forward(a.mb, x)
            if out is not None:
                self._deliver(a, out)
        elif a.sends_gradient:
            grad = self._take(ch, a) if ch is not None else None
            start = self.clock.stamp()
            self._post_ahead(pos + 1)
            g = stage.backward(a.mb, grad, split=a.is_split)
            if a.consumer(self.plan.num_stages) is not None:
                if g is None:
                    g = self.in_shapes[a.stage].empty(stage.stage.backward[a.mb], self.device).zero_()
                self._deliver(a, g)
        else:
            start = self.clock.stamp()
            self._post_ahead(pos + 1)
            stage.weight(a.mb)
        return start, self.clock.stamp()

    def _stats(self, stamps: list[tuple[int, int]], reduced: int | None) -> IterationStats:
        times = self.clock.elapsed_ms()
        records = tuple(
            ActionRecord(rank=self.rank, stage=a.stage, kind=a.kind, mb=a.mb,
                         size=a.size(self.plan.stages[a.stage].forward, self.plan.stages[a.stage].backward),
                         start_ms=times[s], end_ms=times[e])
            for a, (s, e) in zip(self.actions, stamps, strict=True)
        )  # fmt: skip
        layers = tuple(ls.record(self.rank, times) for s in self.stages.values() for ls in s.layer_stamps)
        last = self.stages.get(self.plan.num_stages - 1)
        loss = float(last.loss.item()) if last is not None and last.loss is not None else None
        peak = torch.cuda.max_memory_allocated(self.device) if self.device.type == "cuda" else None
        return IterationStats(rank=self.rank, stages=self.mine, loss=loss, actions=records,
                              pipeline_ms=max((r.end_ms for r in records), default=0.0), step_ms=self.clock.wall_ms(),
                              layers=tuple(sorted(layers, key=lambda r: r.start_ms)), peak_memory_bytes=peak,
                              replica=self.grad_sync.placement.replica if self.grad_sync is not None else 0,
                              allreduce_end_ms=times[reduced] if reduced is not None else None)  # fmt: skip
