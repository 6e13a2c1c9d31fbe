"""One rank interpreting its lowered program of a plan/2 on real tensors.

:class:`StageExecutor` is the library entry point for trainers: give it the
plan, the rank, one module per stage the rank holds (in stage order), a
:class:`~umsearch.runtime.comm.Comm` and (optionally) an optimizer, then call
:meth:`StageExecutor.run_iteration` once per global batch. After one
iteration every parameter holds exactly the gradient of the full-batch mean
loss (:mod:`umsearch.runtime.stage` does the compute; this module decides
what runs when, and moves tensors).

The executor routes nothing itself: which slices of which messages build
each input, under which tag each message goes, what may be dropped, when
each receive is posted and how the shapes are learned are its rank's
:class:`~umsearch.core.program.RankProgram`
(:func:`~umsearch.core.program.lower_rank`, or given to the constructor by a
caller that lowered the plan once), written in the program's small fixed
instruction set (:mod:`umsearch.core.program`'s docstring), which this module
interprets without knowing what a message means: a new kind of message is
written in the program alone. Per iteration all ranks meet at a
barrier, then the rank runs its program's steps in list order; for the
activations and gradients of a plan that means:

- ``jFk`` takes its input from the batch (stage 0), from the outputs of stage
  ``j-1``'s forwards (same rank: local tensors, no message) or from stage
  ``j-1``'s messages (another rank), assembled from the slices that hold its
  samples (:mod:`umsearch.runtime.messages`; partitions may differ), runs, and
  hands its output on: a local hand-off, or an ``isend``.
- ``jBk`` / ``jIk`` take the gradient of their samples the same way from stage
  ``j+1``'s ``B``/``I`` (the last stage starts from its loss), run, and hand
  the input gradient to stage ``j-1``. ``jWk`` needs nothing but its ``I``.

Receives are posted in a bounded window the program computed: on every link
(sending rank -> this rank) in the order the sender sends (NCCL matches in
issue order; see :mod:`umsearch.runtime.comm`), far enough ahead to cover the
next :data:`~umsearch.core.program.RECV_WINDOW` actions that read from the link, so messages land
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
of a stage runs, that stage's gradients start their all-reduce across the
stage's copies, bucket by bucket as they complete (asynchronously, while the
rank runs the rest of its list); the iteration waits for them all before the
optimizer steps.

Setup is the lowering's, linear in the plan (plans may hold 100,000 microbatches).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from umsearch.core.actions import Action, ActionRecord
from umsearch.core.plan import Plan
from umsearch.core.plan_rules import validate_plan
from umsearch.core.program import (
    BATCH,
    IN,
    LOSS,
    OUT,
    FixedShape,
    HeaderSend,
    Input,
    LearnShape,
    Output,
    Publish,
    RankProgram,
    Receive,
    Send,
    Shape,
    Step,
    lower_rank,
)
from umsearch.core.program import (
    RECV_WINDOW as RECV_WINDOW,  # re-exported: the executor's window and tags
)
from umsearch.core.program import tag as tag
from umsearch.errors import PlanError, RuntimeExecutionError
from umsearch.nn.precision import LossScaler, Precision
from umsearch.runtime.comm import Comm, Handle, first_line
from umsearch.runtime.gradsync import GradSync, synced_by_stage
from umsearch.runtime.messages import assemble
from umsearch.runtime.shapes import HEADER_LEN, SampleShape, decode, encode, of_tensor, probe
from umsearch.runtime.stage import LossFn, StageCompute, rows_of
from umsearch.runtime.tied import TiedGrads
from umsearch.runtime.timing import LayerRecord, StampClock


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
    ``program``: this rank's :class:`~umsearch.core.program.RankProgram` of the (checked) plan, lowered
    once by the caller (:func:`~umsearch.core.program.lower`); without, the executor checks the plan and
    lowers its own rank.
    ``tied``: the weights this rank shares with stages on other ranks, their gradients summed with those
    ranks after the backward (:mod:`umsearch.runtime.tied`); default: the parameters the model builder
    marked (:func:`~umsearch.nn.tied.mark_tied`), ranks laid out as ``umsearch run`` lays them out.
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
        program: RankProgram | None = None,
        tied: TiedGrads | None = None,
    ) -> None:
        if program is None:  # a program is lowered from a plan checked already
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
        if program is None:
            try:
                program = lower_rank(plan, rank, forward_only=forward_only)
            except PlanError as exc:
                raise RuntimeExecutionError(str(exc)) from None
        elif program.rank != rank or program.forward_only != forward_only:
            raise RuntimeExecutionError(f"the program given is rank {program.rank}'s (forward_only "
                                        f"{program.forward_only}), not rank {rank}'s (forward_only {forward_only})")
        self.program = program
        self.comm, self.optimizer, self.grad_sync = comm, optimizer, grad_sync
        self.device = torch.device(device) if device is not None else (
            comm.device if comm is not None else torch.device("cpu")
        )  # fmt: skip
        self.forward_only = forward_only
        self.actions = program.actions
        self.clock = StampClock(self.device)
        self.precision = precision if isinstance(precision, Precision) else Precision(precision or "fp32")
        self.scaler = LossScaler() if self.precision.scales_loss else None
        self.stages = self._stage_computes(stage_modules, loss_fn, layer_timing, mean_loss, keep_outputs)
        self.tied = tied if tied is not None else TiedGrads.for_run(
            plan, rank, dict(zip(self.mine, stage_modules, strict=True)),
            grad_sync.placement.replica if grad_sync is not None else 0)  # fmt: skip
        last = {step.ends_backward_of: i for i, step in enumerate(program.steps) if step.ends_backward_of is not None}
        self.synced = synced_by_stage(dict(self.stages), last)
        n = len(program.channels)
        self.shapes: dict[int, SampleShape] = {}
        """Shape slot -> what the handshake learned (:data:`~umsearch.core.program.BATCH`, a stage's output)."""
        self.buffers: list[dict[int, torch.Tensor]] = [{} for _ in range(n)]
        self.handles: list[dict[int, Handle]] = [{} for _ in range(n)]
        self.shapes_known = False
        self.sends: dict[int, deque[tuple[Handle, torch.Tensor, str]]] = {}
        self.published: dict[str, list[torch.Tensor]] = {}
        """What the program's :class:`~umsearch.core.program.Publish` outputs handed over in the last iteration."""

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

    def _shape(self, shape: Shape) -> SampleShape:
        """A program's sample shape: a fixed one, or the slot the handshake filled."""
        if isinstance(shape, FixedShape):
            return SampleShape(dims=shape.dims, dtype=getattr(torch, shape.dtype))
        return self.shapes[shape]

    def _post(self, receives: Sequence[Receive]) -> None:
        """Post ``receives`` (the program's window says which, and when), each into its named buffer."""
        for r in receives:
            ch = self.program.channels[r.channel]
            buf = self._shape(ch.shape).empty(ch.sizes[r.message], self.device)
            self.buffers[r.channel][r.message] = buf
            self.handles[r.channel][r.message] = self._comm().irecv(r.peer, buf, r.tag)

    def _take(self, inp: Input, step: Step) -> torch.Tensor:
        """The input of ``step``: wait for its pieces' receives, assemble the slices, release."""
        ch = self.program.channels[inp.channel]
        buffers, handles = self.buffers[inp.channel], self.handles[inp.channel]
        for m, _, _ in inp.pieces:
            handle = handles.pop(m, None)
            if handle is not None:
                self._wait(handle, f"{ch.awaited(m)}, needed by {step.action}")
            elif m not in buffers:  # neither posted nor handed over: a local hand-off comes later
                raise RuntimeExecutionError(f"rank {self.rank} runs {step.action} before {ch.missing(m)}: "
                                            "the plan deadlocks")  # fmt: skip
        out = assemble(buffers, inp.pieces)
        for m in inp.release:
            buffers.pop(m, None)
        return out

    def _deliver(self, output: Output, t: torch.Tensor) -> None:
        """Hand a value on: into a named buffer, to the caller, or an ``isend``."""
        if isinstance(output, Publish):
            self.published.setdefault(output.name, []).append(t)
            return
        if not isinstance(output, Send):
            self.buffers[output.channel][output.message] = t
            return
        t = t.contiguous()
        pending = self.sends.setdefault(output.peer, deque())
        while pending and pending[0][0].is_completed():  # a link's sends complete in order
            pending.popleft()
        what = f"rank {output.peer} to receive {output.name}"
        pending.append((self._comm().isend(output.peer, t, output.tag), t, what))

    # --------------------------------------------------------------- shapes
    def _handshake(self, inputs: torch.Tensor | None, kwargs: dict[str, Any]) -> None:
        """Run the program's handshake: learn the shape slots (headers received, stages probed), send headers."""
        if inputs is not None:
            self.shapes[BATCH] = of_tensor(inputs, "the inputs")
        sent: list[tuple[Handle, torch.Tensor, str]] = []
        for op in self.program.handshake:
            if isinstance(op, LearnShape):
                header = torch.zeros(HEADER_LEN, dtype=torch.int64, device=self.device)
                self._wait(self._comm().irecv(op.peer, header, op.tag), op.what)
                self.shapes[op.slot] = decode(header)
            elif isinstance(op, HeaderSend):
                header = encode(self.shapes[op.stage]).to(self.device)
                sent.append((self._comm().isend(op.peer, header, op.tag), header,
                             f"rank {op.peer} to take the shape header of stage {op.stage}"))  # fmt: skip
            else:
                assert inputs is not None or op.input != BATCH
                sample = inputs[:1] if inputs is not None and op.input == BATCH else \
                    self.shapes[op.input].empty(1, self.device).zero_()  # fmt: skip
                with self.precision.autocast(self.device):  # the dtype the stage really sends
                    self.shapes[op.stage] = probe(self.stages[op.stage].module, sample, op.what, rows_of(kwargs, 0, 1))
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
        if not self.forward_only:
            self.tied.begin()
        if not self.shapes_known:
            self._handshake(x_all, kwargs)
        elif x_all is not None and of_tensor(x_all, "the inputs") != self.shapes[BATCH]:
            raise RuntimeExecutionError(
                f"inputs changed shape from {self.shapes[BATCH]} to {of_tensor(x_all, 'the inputs')}; "
                "make a new StageExecutor for a new input shape"
            )
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        for s in self.stages.values():
            s.start_iteration(y_all if s.last else None, kwargs)
        self.published = {}
        self._post(self.program.prelude)
        if self.comm is not None:
            self.comm.barrier()
        self.clock.reset()
        stamps = []
        with torch.no_grad() if self.forward_only else nullcontext():
            sync = self.grad_sync
            for step in self.program.steps:
                done = step.ends_backward_of
                if done is not None and sync is not None:  # its buckets all-reduce during this step
                    sync.arm(done, self.synced[done], self.plan.bucket_mib)
                stamp = self._run_step(step, x_all)
                if stamp is not None:
                    stamps.append(stamp)
                if done is not None and sync is not None:
                    sync.start(done, self.synced[done].params)
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
        self.tied.sum()
        finite = self.scaler is None or self.scaler.unscale_and_update(self._params(), self.device)
        if self.optimizer is not None and finite:
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
        # A weight tied between two stages of this rank is one parameter: unscaled once.
        return list({id(p): p for s in self.stages.values() for p in s.module.parameters()}.values())

    def _run_step(self, step: Step, x_all: torch.Tensor | None) -> tuple[int, int] | None:
        """Run one step of the program (core/program.py's four parts, in order); its action's start and end
        stamps (None: a step without an action)."""
        if step.input is not None:
            x = self._take(step.input, step)
        elif step.rows is not None:
            assert x_all is not None
            x = x_all.narrow(0, *step.rows)
        else:
            x = None
        start = self.clock.stamp()
        self._post(step.posts)
        a = step.action
        out = self._compute(a, x) if a is not None else None
        for o in step.outputs:
            t = self._value(o.value, a, x, out)
            if t is None and not isinstance(o, Publish):  # no gradient reached the input: zeros go
                t = self._shape(o.shape).empty(o.count, self.device).zero_()
            if t is not None:
                self._deliver(o, t.reshape(1) if t.dim() == 0 else t)
        return (start, self.clock.stamp()) if a is not None else None

    def _compute(self, a: Action, x: torch.Tensor | None) -> torch.Tensor | None:
        """Run action ``a`` on its stage: a forward's output, a ``B``/``I``'s input gradient, a ``W``'s nothing."""
        stage = self.stages[a.stage]
        if a.is_forward:
            assert x is not None
            return stage.forward(a.mb, x)
        if a.sends_gradient:
            return stage.backward(a.mb, x, split=a.is_split)
        stage.weight(a.mb)
        return None

    def _value(self, name: str, a: Action | None, x: torch.Tensor | None,
               out: torch.Tensor | None) -> torch.Tensor | None:  # fmt: skip
        """The step's value ``name``: its input, its action's result, or a last stage forward's loss."""
        if name == IN:
            return x
        if name == OUT:
            return out
        if name == LOSS and a is not None:
            return self.stages[a.stage].run.losses.get(a.mb)
        raise RuntimeExecutionError(f"the program hands on a value {name!r} that the step of {a} does not have")

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
