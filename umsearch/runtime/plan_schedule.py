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

A weight tied across stages on different ranks (input and output embeddings) gets the gradient of all its
uses on every rank that holds it (:mod:`umsearch.runtime.tied`), so the copies step alike.

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
from umsearch.core.loader import load_plan_file
from umsearch.core.plan import Plan
from umsearch.core.plan_rules import validate_plan
from umsearch.core.program import lower_rank
from umsearch.errors import PlanError
from umsearch.runtime.comm import Comm, RankComm, plan_links
from umsearch.runtime.executor import IterationStats, StageExecutor
from umsearch.runtime.tied import Tie, TiedGrads, marked_ties, ties_by_name

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
    as with any process-group creation). ``tied``: weights shared by stages on different ranks, each as
    ``{stage: parameter name in its module}`` (the same list on every rank; default: the weights the model
    builder marked, :func:`~umsearch.nn.tied.mark_tied`); after each ``step`` their gradients are summed
    across the ranks that hold them. ``checked``: ``plan`` is a :class:`Plan` that passed
    :func:`~umsearch.core.plan_rules.validate_plan` and the deadlock check in the process that made it (a
    launcher handing its ranks the checked plan pickled, as ``tune`` does): it is not checked again. Every
    mismatch between the plan and the stages raises :class:`~umsearch.errors.PlanError` naming both.
    """

    def __init__(self, stages: _PipelineStageBase | Sequence[_PipelineStageBase], plan: PlanLike,
                 loss_fn: Callable[..., torch.Tensor] | None = None, *, scale_grads: bool = True,
                 precision: str | None = None, comm: Comm | None = None,
                 tied: Sequence[Tie] | None = None, checked: bool = False) -> None:  # fmt: skip
        mine = [stages] if isinstance(stages, _PipelineStageBase) else sorted(stages, key=lambda s: s.stage_index)
        if not isinstance(plan, Plan):  # the gate checks it, deadlock included
            self.plan = load_plan_file(plan, allow_missing_profile=True).plan
        elif checked:
            self.plan = plan
        else:
            self.plan = validate_plan(plan)
            check_deadlock(self.plan)
        self.rank = check_stages(self.plan, mine)
        self._stages = mine
        super().__init__(len(self.plan.stages[-1].forward), loss_fn=loss_fn, scale_grads=scale_grads)
        device = mine[0].device
        if comm is None and self.plan.ranks > 1:
            comm = stage_comm(self.plan, mine[0].group, device)
        self._loss_kwargs: dict[str, Any] = {}
        loss = self._loss_with_kwargs if loss_fn is not None else None
        self.executor = StageExecutor(self.plan, self.rank, [s.submod for s in mine], loss, comm, device=device,
                                      precision=precision, mean_loss=scale_grads, keep_outputs=True,
                                      program=lower_rank(self.plan, self.rank), tied=self._tied(tied))  # fmt: skip
        self._eval: StageExecutor | None = None
        self.stats: IterationStats | None = None
        """What the last ``step`` measured on this rank (every action's times)."""

    def _tied(self, tied: Sequence[Tie] | None) -> TiedGrads:
        """This rank's tied weights (``tied``, else the model builder's marks) on the stages' group."""
        modules = {s.stage_index: s.submod for s in self._stages}
        group = self._stages[0].group
        world = [dist.get_global_rank(group, r) for r in range(dist.get_world_size(group))] \
            if group is not None and dist.is_initialized() else list(range(self.plan.ranks))  # fmt: skip
        ties = marked_ties(self.plan, modules) if tied is None else ties_by_name(self.plan, modules, tied)
        return TiedGrads(self.rank, ties, world)

    @property
    def holds_last(self) -> bool:
        """Whether this rank holds the plan's last stage (it gets ``target`` and fills ``losses``)."""
        return self.executor.needs_targets

    def step(self, *args: Any, target: Any = None, losses: list[Any] | None = None, return_outputs: bool = True,
             loss_kwargs: dict[str, Any] | None = None, arg_mbs: list[Any] | None = None,
             kwarg_mbs: list[dict[str, Any]] | None = None, target_mbs: list[Any] | None = None,
             **kwargs: Any) -> Any:  # fmt: skip
        """One iteration on the whole batch: ``step(x, target=y, losses=[])`` on the ranks of the first and
        last stages, ``step()`` elsewhere. Keyword arguments reach every stage's forward, tensors cut into each
        microbatch's rows (as torch chunks them; torchtitan passes ``input_batch=...``); ``loss_kwargs`` reach
        ``loss_fn`` (torchtitan's ``global_valid_tokens``). Returns the last stage's outputs of the whole batch
        on its rank (``return_outputs``), else None.

        torchtitan's trainer (0.3) hands over its own equal microbatches instead, ``step(arg_mbs=[(x_0,), ...],
        kwarg_mbs=[{...}, ...], target_mbs=[y_0, ...], losses=..., loss_kwargs=...)``: they are joined back into
        the batch, in order, and cut into the plan's microbatches."""
        if arg_mbs is not None or kwarg_mbs is not None or target_mbs is not None:
            if args or kwargs or target is not None:
                raise PlanError("step takes the whole batch (x, target=..., keywords) or torchtitan's microbatch "
                                "lists (arg_mbs=, kwarg_mbs=, target_mbs=), not both")  # fmt: skip
            args, kwargs, target = joined_microbatches(arg_mbs, kwarg_mbs, target_mbs)
        self._loss_kwargs = dict(loss_kwargs or {})
        return self._run(self.executor, args, kwargs, target, losses, return_outputs)

    def _loss_with_kwargs(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        assert self._loss_fn is not None
        return self._loss_fn(output, target, **self._loss_kwargs)

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


def _cat(parts: Sequence[Any], what: str) -> Any:
    """Tensors joined on dim 0; any other value must be the same in every microbatch."""
    if all(isinstance(p, torch.Tensor) for p in parts):
        return torch.cat(list(parts))
    if any(p is not parts[0] and p != parts[0] for p in parts):
        raise PlanError(f"{what} differs between microbatches and is not a tensor: PlanSchedule cannot join it "
                        "into one batch; pass the whole batch to step instead")  # fmt: skip
    return parts[0]


def joined_microbatches(arg_mbs: list[Any] | None, kwarg_mbs: list[dict[str, Any]] | None,
                        target_mbs: list[Any] | None) -> tuple[tuple[Any, ...], dict[str, Any], Any]:  # fmt: skip
    """The whole batch of torch's microbatch lists (as torchtitan's trainer makes them): positional inputs,
    keyword inputs and target, each joined on dim 0 in microbatch order."""
    args: tuple[Any, ...] = ()
    if arg_mbs:
        width = {len(a) for a in arg_mbs}
        if len(width) != 1:
            raise PlanError(f"arg_mbs hold {sorted(width)} positional inputs; every microbatch must hold as many")
        args = tuple(_cat([a[i] for a in arg_mbs], f"positional input {i}") for i in range(width.pop()))
    kwargs: dict[str, Any] = {}
    if kwarg_mbs:
        keys = {tuple(sorted(k)) for k in kwarg_mbs}
        if len(keys) != 1:
            raise PlanError(f"kwarg_mbs name different keywords in different microbatches: {sorted(keys)}")
        kwargs = {k: _cat([m[k] for m in kwarg_mbs], f"keyword input {k!r}") for k in keys.pop()}
    target = _cat(list(target_mbs), "the target") if target_mbs else None
    return args, kwargs, target


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
