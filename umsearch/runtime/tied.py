"""A weight shared by stages on different ranks (tied input and output embeddings): its gradient summed across
the ranks that hold it once the backward has ended.

Every rank keeps its own copy of a tied weight, built alike; after the
rank's backward each copy holds only the gradient of the uses on its rank.
Megatron keeps an "embedding group" of the first and last pipeline ranks
for this; here every rank holding a tie sends its gradient to every other
holder and each adds them all up in ascending rank order, so that the
copies get the same sum to the last bit and, stepped by the same optimizer,
stay equal. A tie held by several stages of one rank needs nothing: the
stages' modules share the parameter object and autograd adds the uses.

Which weights are tied comes either from the model builder, who marks the
shared parameter with the model layers that hold it (:func:`~umsearch.nn.tied.mark_tied`:
``hf:`` models do), or from the caller, who names the parameter in each
stage's module (``{stage: name}``, :func:`ties_by_name`). The exchange runs on
the default process group (batched point-to-point, so NCCL cannot
deadlock on it), pipeline ranks mapped to its ranks by ``world``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from umsearch.core.plan import Plan
from umsearch.errors import PlanError
from umsearch.nn.tied import tied_layers
from umsearch.runtime.placement import replica_worlds

TAG = 0x7E1D
"""Tag of the exchange's messages on the default group (gloo matches tags; NCCL ignores them)."""

Tie = Mapping[int, str]
"""One shared weight as the caller names it: plan stage -> the parameter's name in that stage's module."""


@dataclass(frozen=True)
class LocalTie:
    """One tied weight as this rank holds it."""

    params: tuple[torch.Tensor, ...]
    """The rank's parameter objects of it (one, unless its stages were copied apart)."""
    ranks: tuple[int, ...]
    """Every plan rank that holds it, ascending."""
    name: str
    """A name of it, for errors."""


def _stage_of_layer(plan: Plan, layer: int) -> int:
    for j, st in enumerate(plan.stages):
        if st.lo <= layer < st.hi:
            return j
    raise PlanError(f"a tied weight is marked as held by layer {layer}, outside the plan's layers "
                    f"0..{plan.stages[-1].hi - 1}; the plan is not of this model")  # fmt: skip


def marked_ties(plan: Plan, modules: Mapping[int, torch.nn.Module]) -> list[LocalTie]:
    """The marked weights (:func:`~umsearch.nn.tied.mark_tied`) among the parameters of this rank's stage ``modules``."""
    found: dict[int, LocalTie] = {}
    for j in sorted(modules):
        for name, p in modules[j].named_parameters():
            layers = tied_layers(p)
            if layers and id(p) not in found:
                ranks = tuple(sorted({plan.stages[_stage_of_layer(plan, i)].rank for i in layers}))
                found[id(p)] = LocalTie(params=(p,), ranks=ranks, name=f"stage {j}'s {name}")
    return list(found.values())


def ties_by_name(plan: Plan, modules: Mapping[int, torch.nn.Module], ties: Sequence[Tie]) -> list[LocalTie]:
    """The ties the caller names (``{stage: parameter name in its module}``, the same list on every rank), as
    this rank holds them; raises :class:`PlanError` for a stage outside the plan or a name its module lacks."""
    out = []
    for k, tie in enumerate(ties):
        if len(tie) < 2:
            raise PlanError(f"tie {k} {dict(tie)} names {len(tie)} stage; a tie names the parameter in two or more "
                            "stages")  # fmt: skip
        bad = [j for j in tie if not 0 <= j < plan.num_stages]
        if bad:
            raise PlanError(f"tie {k} names stage {bad[0]}, outside the plan's stages 0..{plan.num_stages - 1}")
        params: dict[int, torch.Tensor] = {}
        for j, name in sorted(tie.items()):
            if j not in modules:
                continue
            owned = dict(modules[j].named_parameters(remove_duplicate=False))
            if name not in owned:
                raise PlanError(f"tie {k}: stage {j}'s module has no parameter {name!r} "
                                f"(it has {', '.join(sorted(owned)[:4])}, ...)")  # fmt: skip
            params.setdefault(id(owned[name]), owned[name])
        if params:
            ranks = tuple(sorted({plan.stages[j].rank for j in tie}))
            out.append(LocalTie(params=tuple(params.values()), ranks=ranks, name=f"tie {k} ({dict(tie)})"))
    return out


def ties_by_identity(modules: Mapping[int, torch.nn.Module]) -> list[dict[int, str]]:
    """Every parameter object held by the modules of several stages, as ``{stage: its name there}`` (for a
    caller who builds every stage's module from one model before placing them)."""
    where: dict[int, dict[int, str]] = {}
    for j in sorted(modules):
        for name, p in modules[j].named_parameters(remove_duplicate=False):
            where.setdefault(id(p), {}).setdefault(j, name)
    return [tie for tie in where.values() if len(tie) > 1]


class TiedGrads:
    """Sums the gradients of this rank's tied weights with the other ranks that hold them.

    ``world[r]``: the default group's rank of plan rank ``r``. Every holder of a tie must call :meth:`sum` at
    the same point of its iteration (the end of its backward); a rank without cross-rank ties does nothing.
    """

    def __init__(self, rank: int, ties: Sequence[LocalTie], world: Sequence[int]) -> None:
        self.rank, self.world = rank, tuple(world)
        self.ties = [t for t in ties if len(t.ranks) > 1]
        self._groups: dict[tuple[tuple[int, ...], torch.dtype], list[LocalTie]] = {}
        self._before: dict[int, torch.Tensor] = {}
        for t in sorted(self.ties, key=lambda t: t.ranks):
            self._groups.setdefault((t.ranks, t.params[0].dtype), []).append(t)

    @classmethod
    def of_marks(cls, plan: Plan, rank: int, modules: Mapping[int, torch.nn.Module],
                 world: Sequence[int] | None = None) -> TiedGrads:  # fmt: skip
        """The marked ties of ``modules`` (this rank's stages); ``world`` default: plan rank = default-group rank."""
        return cls(rank, marked_ties(plan, modules), world if world is not None else range(plan.ranks))

    @classmethod
    def for_run(cls, plan: Plan, rank: int, modules: Mapping[int, torch.nn.Module], replica: int = 0) -> TiedGrads:
        """The marked ties of ``modules`` for ``umsearch run``: replica ``replica``'s ranks laid out as the plan
        says (:func:`~umsearch.runtime.placement.replica_worlds`)."""
        return cls.of_marks(plan, rank, modules, replica_worlds(plan)[replica])

    def __bool__(self) -> bool:
        return bool(self.ties)

    def begin(self) -> None:
        """Set the tied weights' gradients aside at an iteration's start, so that :meth:`sum` adds up this
        iteration's only (gradients that accumulate across iterations stay right)."""
        if not dist.is_initialized():
            return
        for t in self.ties:
            for p in t.params:
                if p.grad is not None:
                    self._before[id(p)] = p.grad
                    p.grad = None

    def sum(self) -> None:
        """Replace each tied weight's gradient by the sum over its holders (all of them get the same bits);
        nothing without torch.distributed (a replay of one rank alone)."""
        if not self.ties or not dist.is_initialized():  # a replay of one rank has no peers to sum with
            return
        for (ranks, _), ties in self._groups.items():
            grads = [self._local_grad(t) for t in ties]
            mine = torch.cat([g.reshape(-1) for g in grads])
            parts = {r: mine if r == self.rank else torch.empty_like(mine) for r in ranks}
            ops = [dist.P2POp(dist.isend, mine, self.world[r], tag=TAG) for r in ranks if r != self.rank]
            ops += [dist.P2POp(dist.irecv, parts[r], self.world[r], tag=TAG) for r in ranks if r != self.rank]
            for work in dist.batch_isend_irecv(ops):
                work.wait()
            total = parts[ranks[0]].clone()
            for r in ranks[1:]:
                total += parts[r]
            offset = 0
            for t, g in zip(ties, grads, strict=True):
                n = g.numel()
                summed = total[offset:offset + n].view_as(g)
                for p in t.params:
                    before = self._before.pop(id(p), None)
                    p.grad = summed.clone() if before is None else before.add_(summed)
                offset += n

    @staticmethod
    def _local_grad(t: LocalTie) -> torch.Tensor:
        """The sum of this rank's copies' gradients (zeros where a copy got none)."""
        total = torch.zeros_like(t.params[0])
        for p in t.params:
            if p.grad is not None:
                total += p.grad
        return total
