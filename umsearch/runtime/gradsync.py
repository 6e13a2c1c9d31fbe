"""The gradient all-reduce of a data-parallel plan (docs/model.md section 9), across each stage's copies.

A replica's stages weight each microbatch's mean loss by ``n / B`` (``B`` the GLOBAL batch, not the replica's
``B / D``), so a replica's gradients are its share of the full-batch mean-loss gradient, and their SUM
over the ``D`` copies is that gradient exactly: the average of the replicas' own mean-loss gradients
(``(1/D) * sum_d grad_d``), with no division pass after the all-reduce. Each stage's gradients are
flattened per dtype and all-reduced (``async_op=True``) on a process group of the stage's copies as
soon as the rank's last ``B``/``W`` of that stage has ended, so the all-reduce overlaps the rest of
the rank's backward; :meth:`GradSync.finish` waits for them all before the optimizer steps. Every
copy of a rank runs the same action list, so every copy issues the same all-reduces in the same order,
as collectives require.

Under ``zero1`` the all-reduce is the same (every copy keeps the whole gradients, as docs/model.md section 9
counts them); only the optimizer differs: each copy steps its shard of the states, then the copies
all-gather the updated weights over this same group (:mod:`umsearch.runtime.zero1`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from umsearch.core.errors import RuntimeExecutionError
from umsearch.core.plan import Plan
from umsearch.runtime.comm import first_line
from umsearch.runtime.placement import Placement, stage_copies


@dataclass
class _Pending:
    """One in-flight all-reduce: the flat buffer and the gradients it came from."""

    stage: int
    work: dist.Work
    flat: torch.Tensor
    grads: list[torch.Tensor]


class GradSync:
    """The all-reduce of this process's stages' gradients across their ``D`` copies.

    Create it on every process (:meth:`create` is collective); ``start`` a stage once its last
    ``B``/``W`` has ended, ``finish`` before the optimizer steps.
    """

    def __init__(self, *, placement: Placement, group: dist.ProcessGroup | None, replicas: int) -> None:
        self.placement, self.group, self.replicas = placement, group, replicas
        self._pending: list[_Pending] = []

    @classmethod
    def create(cls, plan: Plan, world_rank: int, timeout: timedelta | None = None) -> GradSync:
        """One process group per pipeline rank's copies; every process of the default group must call
        this with the same plan, in the same place of its sequence of group creations."""
        placement = Placement.of(plan, world_rank)
        group = None
        if plan.data_parallel > 1:
            for copies in stage_copies(plan):
                # new_group is collective over the default group: every process creates every group.
                made = dist.new_group(list(copies), timeout=timeout)
                if world_rank in copies:
                    group = made
        return cls(placement=placement, group=group, replicas=plan.data_parallel)

    def start(self, stage: int, params: Sequence[torch.Tensor]) -> None:
        """Start all-reducing (summing: each copy holds its share, module docstring) the gradients of
        ``params`` (stage ``stage``) across the stage's copies; one flat buffer per dtype and device."""
        if self.group is None:
            return
        buckets: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
        for p in params:
            # Which parameters get a gradient does not depend on the samples: every copy holds the same set.
            if p.grad is not None:
                buckets.setdefault((p.grad.dtype, p.grad.device), []).append(p.grad)
        for grads in buckets.values():
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
