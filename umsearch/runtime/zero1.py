"""The run's optimizer (``--optimizer``), and ZeRO-1: optimizer states sharded over a stage's copies.

:func:`make_optimizer` builds what a rank steps: torch's SGD or Adam over the parameters of its stages,
or, for a ``zero1`` plan with ``D > 1`` replicas and an optimizer that keeps state (Adam), a
:class:`Zero1Optimizer` (docs/model.md section 9).

**What ZeRO-1 does here.** The gradients are all-reduced exactly as without ZeRO-1
(:mod:`umsearch.runtime.gradsync`: whole, summed over the copies), so every copy holds every gradient
and every weight whole. Each stage's trainable parameters are laid end to end, per dtype and device, as
one flat range of ``n`` elements cut into ``D`` equal shards of ``ceil(n / D)`` (the last one padded).
At the step, copy ``i`` (its rank in the stage's copy group) copies its shard of the weights and of the
gradients into a flat working tensor, steps torch's own optimizer on it (so the arithmetic is
torch's, element by element: the same update as whole-state Adam), then the copies all-gather their
updated shards (``all_gather_into_tensor``, asynchronous, one per shard) and write them back into the
parameters. A parameter without a gradient at a step counts as a zero gradient (as flat ZeRO
implementations do; torch's Adam would skip it).

**Memory.** Persistent, per rank: the weights and the gradients whole, ``2 P``, and the optimizer's
states of one shard, ``(state_factor - 2) * P / D`` (Adam: two moments, plus one step counter per shard)
-- docs/model.md section 9's ``(2 + (state_factor - 2) / D) * P``, up to the padding of at most
``D - 1`` elements per shard. Only during :meth:`Zero1Optimizer.step`: the working shard of weights and
of gradients (``2 P / D``) and the all-gather's buffer (``P``), freed before it returns; like the
model's message and gradient buffers, they are not counted.

**Time.** The model charges ZeRO-1 nothing (section 9: it changes memory only); the runtime adds the
all-gather of the updated weights after the step, ``(D - 1) / D * P`` per copy, which the run's
``step_ms`` includes and ``allreduce_end_ms`` does not.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from umsearch.runtime.config import OPTIMIZERS, FlagValueError, state_factor_of

OptimizerFactory = Callable[[list[torch.Tensor]], torch.optim.Optimizer]
"""Builds torch's optimizer over the given tensors."""


def optimizer_factory(name: str, lr: float) -> OptimizerFactory:
    """``--optimizer name`` at learning rate ``lr``: torch's SGD, or Adam with its defaults but ``lr``."""
    if name == "sgd":
        return lambda params: torch.optim.SGD(params, lr=lr)
    if name == "adam":
        return lambda params: torch.optim.Adam(params, lr=lr)
    raise FlagValueError(f"--optimizer takes one of {', '.join(OPTIMIZERS)}, got {name!r}")


def make_optimizer(name: str, lr: float, stage_params: Sequence[Sequence[torch.Tensor]], *, zero1: bool = False,
                   group: dist.ProcessGroup | None = None, copies: int = 1,
                   shard: int = 0) -> torch.optim.Optimizer | None:  # fmt: skip
    """The optimizer of one rank: ``stage_params`` holds each of its stages' parameters (None without any).

    With ``zero1`` and ``copies > 1``, and an optimizer that keeps state (``state_factor_of(name) > 2``), a
    :class:`Zero1Optimizer` over the stage's copy group ``group`` (this process is copy ``shard``; None: the
    group's own rank); otherwise whole states (SGD has none to shard).
    """
    make = optimizer_factory(name, lr)
    stage_params = distinct(stage_params)
    params = [p for ps in stage_params for p in ps]
    if not params:
        return None
    if zero1 and copies > 1 and state_factor_of(name) > 2 and any(p.requires_grad for p in params):
        if group is not None:
            shard = dist.get_rank(group)
        return Zero1Optimizer(stage_params, make, group=group, copies=copies, shard=shard)
    return make(params)


def distinct(stage_params: Sequence[Sequence[torch.Tensor]]) -> list[list[torch.Tensor]]:
    """Each stage's parameters less those an earlier stage already holds: a weight tied between two stages
    of one rank (a V-shape's embedding and head) is one parameter, stepped once, not twice."""
    seen: set[int] = set()
    out = []
    for ps in stage_params:
        out.append([p for p in ps if id(p) not in seen])
        seen.update(id(p) for p in ps)
    return out


@dataclass
class _Bucket:
    """One stage's parameters of one dtype and device, as a flat range sharded ``copies`` ways."""

    params: list[torch.Tensor]
    numel: int
    size: int
    """Elements per shard: ``ceil(numel / copies)``."""
    work: torch.Tensor
    """The tensor the inner optimizer steps: this copy's shard during a step, empty otherwise."""

    def flat_slice(self, lo: int, hi: int, grads: bool) -> torch.Tensor:
        """Elements ``[lo, hi)`` of the flat weights (or gradients: None counts as zeros), padded with zeros."""
        p0 = self.params[0]
        out = torch.zeros(hi - lo, dtype=p0.dtype, device=p0.device)
        offset = 0
        for p in self.params:
            n = p.numel()
            a, b = max(lo, offset), min(hi, offset + n)
            if a < b:
                src = p.grad if grads else p
                if src is not None:
                    out[a - lo : b - lo].copy_(src.detach().reshape(-1)[a - offset : b - offset])
            offset += n
        return out

    def write_back(self, flat: torch.Tensor) -> None:
        """The parameters from the flat range ``flat`` (its padding ignored)."""
        offset = 0
        with torch.no_grad():
            for p in self.params:
                n = p.numel()
                p.copy_(flat[offset : offset + n].view_as(p))
                offset += n


class Zero1Optimizer(torch.optim.Optimizer):
    """ZeRO-1 (module docstring): torch's optimizer stepping this copy's shard of every stage's parameters,
    then the copies all-gathering the updated weights.

    It is a :class:`torch.optim.Optimizer` whose :attr:`param_groups`, :attr:`state` and :attr:`defaults`
    are the inner optimizer's (over the flat shards: schedulers and ``state_dict`` see this copy's shard);
    :meth:`zero_grad` clears the real parameters' gradients. ``group``: the stage's copies (one group
    for every stage of the rank, as :class:`~umsearch.runtime.gradsync.GradSync` makes it); None steps the
    shard alone and leaves the rest of the weights as they were (a replay of one rank).
    """

    def __init__(self, stage_params: Sequence[Sequence[torch.Tensor]], make: OptimizerFactory, *,
                 group: dist.ProcessGroup | None, copies: int, shard: int) -> None:  # fmt: skip
        if not 0 <= shard < copies:
            raise ValueError(f"shard {shard} is outside the {copies} copies")
        self.group, self.copies, self.shard = group, copies, shard
        self.buckets: list[_Bucket] = []
        for ps in distinct(stage_params):
            kinds: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
            for p in ps:
                if p.requires_grad:
                    kinds.setdefault((p.dtype, p.device), []).append(p)
            for (dtype, device), members in kinds.items():
                numel = sum(p.numel() for p in members)
                size = -(-numel // copies)
                self.buckets.append(_Bucket(members, numel, size, torch.empty(0, dtype=dtype, device=device)))
        self.inner = make([b.work for b in self.buckets])
        super().__init__([b.work for b in self.buckets], dict(self.inner.defaults))
        # The inner optimizer's groups and states are this optimizer's (no second copy of anything).
        self.defaults = self.inner.defaults
        self.param_groups = self.inner.param_groups
        self.state = self.inner.state

    def params(self) -> list[torch.Tensor]:
        """The real parameters this optimizer updates (every copy updates all of them)."""
        return [p for b in self.buckets for p in b.params]

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the real parameters' gradients (None, or zeros)."""
        for p in self.params():
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                p.grad.detach_().requires_grad_(False).zero_()

    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """Step this copy's shards (the gradients must already be summed over the copies), then all-gather
        the updated weights into every copy's parameters."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        with torch.no_grad():
            for b in self.buckets:
                lo = self.shard * b.size
                b.work.data = b.flat_slice(lo, lo + b.size, grads=False)
                b.work.grad = b.flat_slice(lo, lo + b.size, grads=True)
            self.inner.step()
            gathers: list[tuple[_Bucket, torch.Tensor, Any]] = []
            for b in self.buckets:
                b.work.grad = None
                if self.group is None:
                    full = b.flat_slice(0, b.size * self.copies, grads=False)
                    full[self.shard * b.size : (self.shard + 1) * b.size].copy_(b.work)
                    gathers.append((b, full, None))
                else:
                    full = torch.empty(b.size * self.copies, dtype=b.work.dtype, device=b.work.device)
                    gathers.append((b, full, dist.all_gather_into_tensor(full, b.work.detach(), group=self.group,
                                                                         async_op=True)))  # fmt: skip
            for b, full, work in gathers:
                if work is not None:
                    work.wait()
                b.write_back(full)
                b.work.data = torch.empty(0, dtype=b.work.dtype, device=b.work.device)
        return loss

    def state_bytes(self) -> int:
        """Bytes of the tensors in :attr:`state` (this copy's shard of the optimizer's states)."""
        return sum(v.numel() * v.element_size() for s in self.state.values() for v in s.values()
                   if isinstance(v, torch.Tensor))  # fmt: skip
