"""The gradient all-reduce of a data-parallel plan (docs/model.md section 9), across each stage's copies.

A replica's stages weight each microbatch's mean loss by ``n / B`` (``B`` the GLOBAL batch, not the replica's
``B / D``), so a replica's gradients are its share of the full-batch mean-loss gradient, and their SUM
over the ``D`` copies is that gradient exactly: the average of the replicas' own mean-loss gradients
(``(1/D) * sum_d grad_d``), with no division pass after the all-reduce.

Gradients travel in buckets, as PyTorch DDP sends them and as the model times them (version 2.3): a stage's
layers are cut into buckets of at most the plan's ``bucket_mib`` in reverse layer order
(:func:`umsearch.core.cluster.bucket_firsts`, the model's own rule, on the parameters' real bytes). Just
before the stage's last ``B``/``W`` runs, :meth:`GradSync.arm` hooks every parameter
(``register_post_accumulate_grad_hook``); once all of a bucket's parameters have their final gradient, the
bucket is flattened per dtype and all-reduced (``async_op=True``) on a process group of the stage's copies,
while the backward goes on. Buckets are launched strictly in bucket order (a bucket that completes early
waits for the ones before it), so every copy issues the same collectives in the same order, as collectives
require, whatever order autograd accumulates in. :meth:`GradSync.start`, right after that action, launches
what is left (parameters that got no gradient, or a stage whose layers are not known apart: one bucket);
:meth:`GradSync.finish` waits for them all before the optimizer steps. A plan without a cap
(``bucket_mib = None``, version 2.2) sends each stage as one bucket after its last backward.

Under ``zero1`` the all-reduce is the same (every copy keeps the whole gradients, as docs/model.md section 9
counts them); only the optimizer differs: each copy steps its shard of the states, then the copies
all-gather the updated weights over this same group (:mod:`umsearch.runtime.zero1`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Protocol

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.hooks import RemovableHandle

from umsearch.core.cluster import bucket_cap_bytes, bucket_firsts
from umsearch.core.plan import Plan
from umsearch.errors import RuntimeExecutionError
from umsearch.runtime.comm import first_line
from umsearch.runtime.placement import Seat, stage_copies

_AFTER_THE_ACTION = -1
"""A key no parameter has: its bucket is launched by :meth:`GradSync.start`, after the action."""


class StageParams(Protocol):
    """What :meth:`GradSync.arm` reads of a stage (a :class:`~umsearch.runtime.stage.StageCompute`)."""

    @property
    def params(self) -> list[torch.Tensor]: ...

    @property
    def layers(self) -> list[tuple[int, torch.nn.Module, list[torch.Tensor]]] | None: ...


@dataclass(frozen=True)
class _Leaving:
    """A stage's parameters less those a later stage of its rank syncs (:func:`synced_by_stage`)."""

    inner: StageParams
    left: frozenset[int]

    @property
    def params(self) -> list[torch.Tensor]:
        return [p for p in self.inner.params if id(p) not in self.left]

    @property
    def layers(self) -> list[tuple[int, torch.nn.Module, list[torch.Tensor]]] | None:
        layers = self.inner.layers
        return None if layers is None else [(i, m, [p for p in ps if id(p) not in self.left])
                                             for i, m, ps in layers]  # fmt: skip


def synced_by_stage(stages: dict[int, StageParams], last_backward: dict[int, int]) -> dict[int, StageParams]:
    """What each stage of a rank all-reduces: a weight two of its stages share (a V's tied embedding and
    head) goes with the one whose last backward runs last (``last_backward``: stage -> its position in
    the rank's steps), once its gradient is complete; the earlier one leaves it out. Otherwise the weight
    is all-reduced twice, first a partial gradient, and the result is right only because the later
    copy-back lands last."""
    owner: dict[int, int] = {}
    for j in sorted(stages, key=lambda j: last_backward.get(j, -1)):
        for p in stages[j].params:
            owner[id(p)] = j
    out: dict[int, StageParams] = {}
    for j, st in stages.items():
        left = frozenset(id(p) for p in st.params if owner[id(p)] != j)
        out[j] = _Leaving(st, left) if left else st
    return out


@dataclass
class _Pending:
    """One in-flight all-reduce: the flat buffer and the gradients it came from."""

    stage: int
    work: dist.Work
    flat: torch.Tensor
    grads: list[torch.Tensor]


@dataclass
class _Armed:
    """A stage's buckets during its last backward: each bucket's parameters, those still without their final
    gradient, and the next bucket to launch (buckets launch in order)."""

    stage: int
    buckets: list[list[torch.Tensor]]
    waiting: list[set[int]]
    launched: int = 0
    handles: list[RemovableHandle] = field(default_factory=list)


def buckets_of(layers: Sequence[Sequence[torch.Tensor]], bucket_mib: float | None) -> list[list[torch.Tensor]]:
    """The gradient buckets of a stage whose layers (in model order) hold ``layers``' parameters: at most
    ``bucket_mib`` MiB each, in reverse layer order (docs/model.md section 9's rule, on the parameters' bytes;
    a parameter shared by several layers counts in the lowest, whose gradient comes last). None: one bucket."""
    seen: set[int] = set()
    owned: list[list[torch.Tensor]] = [[] for _ in layers]
    for i in range(len(layers)):
        for p in layers[i]:
            if id(p) not in seen:
                seen.add(id(p))
                owned[i].append(p)
    sizes = [sum(p.numel() * p.element_size() for p in ps) for ps in owned]
    prefix = np.concatenate([[0.0], np.cumsum(np.asarray(sizes, dtype=np.float64))])
    firsts = np.empty(max(len(layers), 1), dtype=np.int64)
    m = bucket_firsts(prefix, 0, len(layers), bucket_cap_bytes(bucket_mib), firsts)
    out, top = [], len(layers)
    for a in firsts[:m].tolist():
        out.append([p for i in range(top - 1, a - 1, -1) for p in owned[i]])
        top = a
    return out


class GradSync:
    """The all-reduce of this process's stages' gradients across their ``D`` copies, in buckets.

    Create it on every process (:meth:`create` is collective); ``arm`` a stage just before its last ``B``/``W``,
    ``start`` it right after, ``finish`` before the optimizer steps.
    """

    def __init__(self, *, placement: Seat, group: dist.ProcessGroup | None, replicas: int) -> None:
        self.placement, self.group, self.replicas = placement, group, replicas
        self._pending: list[_Pending] = []
        self._armed: dict[int, _Armed] = {}

    @classmethod
    def create(cls, plan: Plan, world_rank: int, timeout: timedelta | None = None) -> GradSync:
        """One process group per pipeline rank's copies; every process of the default group must call
        this with the same plan, in the same place of its sequence of group creations."""
        placement = Seat.of(plan, world_rank)
        group = None
        if plan.data_parallel > 1:
            for copies in stage_copies(plan):
                # new_group is collective over the default group: every process creates every group.
                made = dist.new_group(list(copies), timeout=timeout)
                if world_rank in copies:
                    group = made
        return cls(placement=placement, group=group, replicas=plan.data_parallel)

    def arm(self, stage: int, compute: StageParams, bucket_mib: float | None) -> None:
        """Before stage ``stage``'s last ``B``/``W``: all-reduce each of its buckets (at most ``bucket_mib``, the
        plan's) as soon as all of its parameters have their final gradient (module docstring). Needs its
        layers apart to cut buckets. (The cap comes with each call: one GradSync serves every plan whose
        copies are the same processes.)"""
        if self.group is None or bucket_mib is None or compute.layers is None:
            return
        layers = [ps for _, _, ps in compute.layers]
        buckets = buckets_of(layers, bucket_mib)
        armed = _Armed(stage, buckets, [{id(p) for p in b if p.requires_grad} for b in buckets])
        # A weight shared by layers is accumulated once per layer's graph when the stage runs them apart:
        # its first hook is not its last, so its bucket (and the ones after it) wait for start().
        counts: dict[int, int] = {}
        for ps in layers:
            for key in {id(p) for p in ps}:
                counts[key] = counts.get(key, 0) + 1
        for waiting in armed.waiting:
            if any(counts.get(key, 0) > 1 for key in waiting):
                waiting.add(_AFTER_THE_ACTION)
        self._armed[stage] = armed
        for b, params in enumerate(buckets):
            for p in params:
                if p.requires_grad:
                    armed.handles.append(p.register_post_accumulate_grad_hook(self._hook(armed, b, id(p))))
        self._launch_ready(armed)

    def _hook(self, armed: _Armed, bucket: int, key: int):  # type: ignore[no-untyped-def]
        def done(_: torch.Tensor) -> None:
            armed.waiting[bucket].discard(key)
            self._launch_ready(armed)

        return done

    def _launch_ready(self, armed: _Armed) -> None:
        """Launch the armed stage's complete buckets, in bucket order, up to the first incomplete one."""
        while armed.launched < len(armed.buckets) and not armed.waiting[armed.launched]:
            self._reduce(armed.stage, armed.buckets[armed.launched])
            armed.launched += 1

    def start(self, stage: int, params: Sequence[torch.Tensor]) -> None:
        """Right after stage ``stage``'s last ``B``/``W``: launch its buckets not launched yet (all of ``params``
        when it was not armed), summing each copy's share (module docstring)."""
        if self.group is None:
            return
        armed = self._armed.pop(stage, None)
        if armed is None:
            self._reduce(stage, params)
            return
        for h in armed.handles:
            h.remove()
        for b in range(armed.launched, len(armed.buckets)):
            self._reduce(stage, armed.buckets[b])

    def _reduce(self, stage: int, params: Sequence[torch.Tensor]) -> None:
        """All-reduce the gradients of ``params``: one flat buffer per dtype and device, asynchronously."""
        assert self.group is not None
        flats: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
        for p in params:
            # Which parameters get a gradient does not depend on the samples: every copy holds the same set.
            if p.grad is not None:
                flats.setdefault((p.grad.dtype, p.grad.device), []).append(p.grad)
        for grads in flats.values():
            flat = torch.cat([g.reshape(-1) for g in grads])
            work = dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.group, async_op=True)
            assert work is not None
            self._pending.append(_Pending(stage, work, flat, grads))

    def finish(self) -> None:
        """Wait for every all-reduce started; the gradients then hold the sum over the copies."""
        pending, self._pending = self._pending, []
        for p in pending:
            try:
                p.work.wait()
            except RuntimeError as exc:
                where = self.placement
                raise RuntimeExecutionError(
                    f"rank {where.rank} of replica {where.replica} gave up on the gradient all-reduce of stage "
                    f"{p.stage} across its {self.replicas} copies: {first_line(exc)} (a copy failed or is "
                    "stuck; see its error, or raise --timeout)"
                ) from None
            offset = 0
            for g in p.grads:
                n = g.numel()
                g.copy_(p.flat[offset : offset + n].view_as(g))
                offset += n
