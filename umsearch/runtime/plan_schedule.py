"""Any umsearch plan as a torch.distributed.pipelining schedule, on torch's own ``PipelineStage`` objects.

A training loop written for torch's schedules (or torchtitan, which builds
exactly that loop) swaps its schedule class and nothing else::

    stages = [PipelineStage(submod, j, num_stages, device, group=pp_group) for j, submod in mine]
    schedule = PlanSchedule(stages, "plan.json", loss_fn)
    schedule.step(x, target=y, losses=losses)   # first and last rank; schedule.step() elsewhere

:class:`PlanSchedule` only adapts: it checks the stages against the plan,
takes each stage's module, device and process group, and hands one rank's
action list to :class:`~umsearch.runtime.executor.StageExecutor`, the
executor ``umsearch run`` uses. So unequal and per-stage microbatch lists,
split ``I``/``W``, recompute and several stages per rank run as the plan
says; torch's own send/receive machinery of the stages is not used (the
executor's links carry the messages: one process group per directed pair of
ranks among the stages' group, made collectively when the schedule is built).

Semantics, as torch's schedules promise them for equal chunks:

- ``scale_grads=True``: ``loss_fn`` returns a microbatch's mean loss, and
  after ``step`` the gradients are those of the full-batch mean loss.
  ``losses`` gets one loss per forward microbatch of the last stage,
  ``loss_k * n_k * M / B`` (``n_k`` its samples, ``M`` the microbatches), so
  that their mean is the full-batch loss; with equal microbatches these are
  exactly torch's per-microbatch losses.
- ``scale_grads=False``: the gradients are those of the sum of ``loss_fn``
  over the last stage's microbatches (for a ``loss_fn`` that already divides
  by the global batch, as torchtitan's does), and ``losses`` gets ``loss_fn``'s
  values as they are.

Gradients accumulate across steps as with torch's schedules: zero them and
step the optimizer in the loop. ``eval`` runs the forwards only.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.pipelining.schedules import _PipelineSchedule
from torch.distributed.pipelining.stage import _PipelineStageBase

from umsearch.core.deps import check_deadlock
from umsearch.core.errors import PlanError
from umsearch.core.plan import Plan
from umsearch.core.plan_io import load_plan
from umsearch.core.plan_rules import validate_plan
from umsearch.core.program import lower_rank
from umsearch.runtime.comm import Comm, RankComm, plan_links
from umsearch.runtime.executor import IterationStats, StageExecutor

PlanLike = Plan | str | os.PathLike[str]
"""A plan, or the path of a plan file (``umsearch.plan/2``)."""


class PlanSchedule(_PipelineSchedule):
    """Runs ``plan`` on ``stages``, this process's torch ``PipelineStage`` objects (see the module docstring).

    ``stages``: one stage object per plan stage this process's rank holds
    (any order; ``stage_index`` j is the plan's stage j), all on one process
    group whose rank ``r`` is the plan's rank ``r``. ``loss_fn(output,
    target)``: needed on the rank of the last stage. ``precision``: autocast
    of the forwards (``bf16``/``fp16``; None runs the modules as they are).
    ``comm``: the links to the other ranks (default: made from the stages'
    group; every process of the default group must build its schedule then,
    as with any process-group creation). Every mismatch between the plan and
    the stages raises :class:`~umsearch.core.errors.PlanError` naming both.
    """

    def __init__(self, stages: _PipelineStageBase | Sequence[_PipelineStageBase], plan: PlanLike,
                 loss_fn: Callable[..., torch.Tensor] | None = None, *, scale_grads: bool = True,
                 precision: str | None = None, comm: Comm | None = None) -> None:  # fmt: skip
        mine = [stages] if isinstance(stages, _PipelineStageBase) else sorted(stages, key=lambda s: s.stage_index)
        self.plan = validate_plan(plan) if isinstance(plan, Plan) else load_plan(plan)  # checked once
        check_deadlock(self.plan)
        self.rank = check_stages(self.plan, mine)
        self._stages = mine
        super().__init__(len(self.plan.stages[-1].forward), loss_fn=loss_fn, scale_grads=scale_grads)
        device = mine[0].device
        if comm is None and self.plan.ranks > 1:
            comm = stage_comm(self.plan, mine[0].group, device)
        self.executor = StageExecutor(self.plan, self.rank, [s.submod for s in mine], loss_fn, comm, device=device,
                                      precision=precision, mean_loss=scale_grads, keep_outputs=True,
                                      program=lower_rank(self.plan, self.rank))  # fmt: skip
        self._eval: StageExecutor | None = None
        self.stats: IterationStats | None = None
        """What the last ``step`` measured on this rank (every action's times)."""

    @property
    def holds_last(self) -> bool:
        """Whether this rank holds the plan's last stage (it gets ``target`` and fills ``losses``)."""
        return self.executor.needs_targets

    def step(self, *args: Any, target: Any = None, losses: list[Any] | None = None, return_outputs: bool = True,
             **kwargs: Any) -> Any:  # fmt: skip
        """One iteration on the whole batch: ``step(x, target=y, losses=[])`` on the ranks of the first and
        last stages, ``step()`` elsewhere. Keyword arguments reach every stage's forward, tensors cut into each
        microbatch's rows (as torch chunks them; torchtitan passes ``input_batch=...``). Returns the last stage's outputs of the whole batch on its rank
        (``return_outputs``), else None."""
        return self._run(self.executor, args, kwargs, target, losses, return_outputs)

    def eval(self, *args: Any, target: Any = None, losses: list[Any] | None = None, **kwargs: Any) -> Any:
        """The forwards of one iteration only, without autograd (every rank must call ``eval`` alike)."""
        if self._eval is None:
            ex = self.executor
            self._eval = StageExecutor(self.plan, self.rank, [s.submod for s in self._stages], self._loss_fn,
                                       ex.comm, device=ex.device, precision=ex.precision, keep_outputs=True,
                                       mean_loss=self.scale_grads, forward_only=True,
                                       program=lower_rank(self.plan, self.rank, forward_only=True))  # fmt: skip
        return self._run(self._eval, args, kwargs, target, losses, True)

    def _run(self, ex: StageExecutor, args: tuple[Any, ...], kwargs: dict[str, Any], target: Any,
             losses: list[Any] | None, return_outputs: bool) -> Any:  # fmt: skip
        inputs = self._inputs(ex, args)
        if ex.needs_targets and target is None and self._loss_fn is not None:
            raise PlanError(f"rank {self.rank} holds the last stage {self.plan.num_stages - 1}; pass target=... to step")
        self.stats = ex.run_iteration(inputs, target if ex.needs_targets else None, kwargs)
        if ex.needs_targets and losses is not None:
            losses.clear()
            losses.extend(self._losses(ex))
        return ex.outputs() if ex.needs_targets and return_outputs else None

    def _inputs(self, ex: StageExecutor, args: tuple[Any, ...]) -> torch.Tensor | None:
        if not ex.needs_inputs:
            if args:
                raise PlanError(f"rank {self.rank} does not hold stage 0; call step() without positional inputs "
                                f"here (got {len(args)})")  # fmt: skip
            return None
        if len(args) != 1 or not isinstance(args[0], torch.Tensor):
            raise PlanError(f"rank {self.rank} holds stage 0; call step(x) with the whole batch as one tensor "
                            f"(got {len(args)} positional input(s))")  # fmt: skip
        return args[0]

    def _losses(self, ex: StageExecutor) -> list[torch.Tensor]:
        raw = ex.microbatch_losses()
        if not self.scale_grads:
            return raw
        sizes, B = self.plan.stages[-1].forward, self.plan.global_batch
        return [loss * (n * len(sizes) / B) for loss, n in zip(raw, sizes, strict=True)]

    def _step_microbatches(self, arg_mbs: list[Any] | None = None, kwarg_mbs: list[Any] | None = None,
                           target_mbs: list[Any] | None = None, losses: list[Any] | None = None,
                           return_outputs: bool = True, loss_kwargs: dict[str, Any] | None = None) -> None:  # fmt: skip
        raise PlanError("a PlanSchedule cuts the batch into the plan's microbatches itself (they may differ per "
                        "stage); call step(whole_batch, target=...) instead of passing microbatches")  # fmt: skip


def check_stages(plan: Plan, stages: Sequence[_PipelineStageBase]) -> int:
    """The plan rank these stage objects are; raises :class:`PlanError` naming both sides of any mismatch."""
    if not stages:
        raise PlanError("PlanSchedule got no stages; give it the PipelineStage objects of this rank")
    if plan.data_parallel > 1:
        raise PlanError(f"the plan has {plan.data_parallel} data-parallel replicas; PlanSchedule runs one pipeline "
                        "(search with data_parallel = 1, or run the cluster plan with umsearch run)")  # fmt: skip
    S = plan.num_stages
    for s in stages:
        if s.num_stages != S:
            raise PlanError(f"stage {s.stage_index} was built with num_stages={s.num_stages}, the plan has {S} stages")
        if not 0 <= s.stage_index < S:
            raise PlanError(f"stage_index {s.stage_index} is outside the plan's stages 0..{S - 1}")
    groups = {s.group_size for s in stages} | {plan.ranks}
    if len(groups) != 1:
        raise PlanError(f"the stages' process group has {stages[0].group_size} ranks, the plan {plan.ranks}; "
                        "build the PipelineStages on a group of exactly the plan's ranks")  # fmt: skip
    rank = stages[0].group_rank
    want = plan.stages_of(rank)
    got = tuple(s.stage_index for s in stages)
    if got != want:
        raise PlanError(f"rank {rank} holds stages {list(want)} in the plan but got PipelineStages {list(got)}; "
                        "build one PipelineStage per stage the plan places on this rank")  # fmt: skip
    for s in stages:
        st = plan.stages[s.stage_index]
        layers = st.hi - st.lo
        if isinstance(s.submod, torch.nn.Sequential) and len(s.submod) != layers:
            raise PlanError(f"stage {s.stage_index} covers layers [{st.lo}, {st.hi}) ({layers}) in the plan but its "
                            f"module is an nn.Sequential of {len(s.submod)}; cut the model where the plan does")  # fmt: skip
    return rank


def stage_comm(plan: Plan, group: dist.ProcessGroup | None, device: torch.device) -> RankComm:
    """The executor's links among ``group``'s ranks: a process group per directed pair of plan ranks.

    Collective over the default group: every process passes its own pipeline
    group (several pipelines, as with data parallelism outside the plan, each
    get their own links).
    """
    ranks = [dist.get_global_rank(group, r) for r in range(dist.get_world_size(group))] if group is not None \
        else list(range(dist.get_world_size()))  # fmt: skip
    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, ranks)
    pipelines = sorted({tuple(p) for p in every})
    return RankComm.create(plan_links(plan), device, replicas=pipelines)
