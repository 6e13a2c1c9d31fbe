"""torchtitan's own models running an umsearch plan: a ``pipelining_fn`` for torchtitan's ``ModelSpec``.

torchtitan (0.3) builds a pipeline through its model spec's ``pipelining_fn``
(``pipeline_llm`` for its language models). :func:`plan_pipelining_fn` is a
drop-in for it::

    import dataclasses
    from torchtitan.models.llama3 import model_registry
    from umsearch.runtime.torchtitan_pipeline import plan_pipelining_fn

    spec = dataclasses.replace(model_registry("8B"), pipelining_fn=plan_pipelining_fn("umsearch_plan.json"))

It cuts torchtitan's model with torchtitan's own splitting
(``_pipeline_module_split``, one deep copy per stage with the other modules
removed), by the module names of each plan stage: the job's
``[parallelism] module_fqns_per_model_part`` or the names given (umsearch
export writes them, cut where the plan cuts). torchtitan places stages looped
or V-shaped only; a plan placed otherwise is cut stage by stage with the
same torchtitan function (``_split_module``). Each part goes through the
model's ``parallelize_fn`` as in ``pipeline_llm``, and the schedule is a
:class:`~umsearch.runtime.plan_schedule.PlanSchedule` of the plan with
torchtitan's loss (``scale_grads=False``: torchtitan's loss already divides by
the batch's tokens), which takes the trainer's microbatch lists
(``step(arg_mbs=..., kwarg_mbs=..., target_mbs=..., loss_kwargs=...)``),
joins them into the batch and runs the plan's own microbatches.

torchtitan builds attention masks (flex, varlen) once per microbatch of its
own; the plan's microbatches differ, so those masks are dropped and each
stage rebuilds its masks from ``positions`` for the rows it runs
(:class:`MaskedPart`).

torchtitan is imported only when a function here is called (``pip install
'umsearch[torchtitan]'``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.pipelining import PipelineStage

from umsearch.core.loader import load_plan_file
from umsearch.core.plan import Plan
from umsearch.core.plan_rules import validate_plan
from umsearch.errors import PlanError
from umsearch.formats.torchtitan import placement_name
from umsearch.runtime.plan_schedule import PlanLike, PlanSchedule
from umsearch.runtime.tied import Tie

MASKS = "attention_masks"
"""The keyword under which torchtitan's trainer hands each microbatch's attention masks to the stages."""


def _titan() -> Any:
    try:
        from torchtitan.distributed import pipeline_parallel
    except ImportError as exc:
        raise PlanError(f"torchtitan is not importable here ({exc}); pip install 'umsearch[torchtitan]'") from None
    return pipeline_parallel


def _plan(plan: PlanLike) -> Plan:
    return validate_plan(plan) if isinstance(plan, Plan) else load_plan_file(plan, allow_missing_profile=True).plan


class MaskedPart(nn.Module):
    """A torchtitan model part that builds its attention masks from ``positions`` for the rows it runs
    (masks made for another microbatch do not fit a plan's microbatch)."""

    def __init__(self, part: nn.Module) -> None:
        super().__init__()
        self.part = part

    def forward(self, h: torch.Tensor, positions: torch.Tensor | None = None, **kwargs: Any) -> Any:
        kwargs.pop(MASKS, None)
        if positions is not None and _uses_masks(self.part):
            kwargs[MASKS] = cast(Any, self.part).get_attention_masks(positions=positions)
        return self.part(h, positions=positions, **kwargs)


def _uses_masks(part: nn.Module) -> bool:
    """Whether the part's attention reads masks (flex, varlen): torchtitan builds them only then."""
    config = getattr(getattr(part, "config", None), "first_attention", None)
    inner = getattr(config, "inner_attention", None)
    return inner is not None and type(inner).__qualname__.split(".")[0] in ("FlexAttention", "VarlenAttention")


class TitanPlanSchedule(PlanSchedule):
    """:class:`PlanSchedule` as torchtitan's trainer calls it: its microbatches' masks are dropped (each stage
    rebuilds them from ``positions``, :class:`MaskedPart`)."""

    def step(self, *args: Any, kwarg_mbs: list[dict[str, Any]] | None = None, **kwargs: Any) -> Any:
        if kwarg_mbs is not None:
            kwarg_mbs = [{k: v for k, v in mb.items() if k != MASKS} for mb in kwarg_mbs]
        kwargs.pop(MASKS, None)
        return super().step(*args, kwarg_mbs=kwarg_mbs, **kwargs)


def check_unsharded(parts: Sequence[nn.Module]) -> None:
    """Refuse parts wrapped in FSDP (``fully_shard``): the executor takes each backward's gradients for the
    module's own parameters, while FSDP computes with unsharded copies of them, so nothing would reach them."""
    for i, part in enumerate(parts):
        if isinstance(part, FSDPModule):
            raise PlanError(f"model part {i} is wrapped in FSDP ({type(part).__name__}); PlanSchedule does not drive "
                            "FSDP yet: give a parallelize_fn that does not apply fully_shard (torchtitan's llama3 "
                            "applies it whenever it runs; data_parallel_shard_degree = 1 is not enough)")  # fmt: skip


def split_model(model: nn.Module, plan: Plan, pp_mesh: Any, device: torch.device,
                module_names: Sequence[Sequence[str]], get_mesh: Callable[..., Any] | None = None,
                ) -> tuple[list[PipelineStage], list[nn.Module]]:  # fmt: skip
    """This rank's stages and model parts of ``model``, cut by torchtitan where the plan cuts: stage ``j``
    keeps the modules ``module_names[j]`` and sits on the rank the plan gives it (``pp_mesh``: the
    pipeline dimension of torchtitan's device mesh)."""
    pp = _titan()
    if len(module_names) != plan.num_stages:
        raise PlanError(f"{len(module_names)} lists of module names for a plan of {plan.num_stages} stages; "
                        "give one list per stage (umsearch export writes MODULE_FQNS_PER_MODEL_PART)")  # fmt: skip
    if pp_mesh.size() != plan.ranks:
        raise PlanError(f"the pipeline mesh has {pp_mesh.size()} ranks, the plan {plan.ranks}; set "
                        f"[parallelism] pipeline_parallel_degree = {plan.ranks}")  # fmt: skip
    names = [list(n) for n in module_names]
    try:
        placed_as = placement_name(plan)
    except PlanError:
        placed_as = None
    if placed_as is not None:
        return pp._pipeline_module_split(model, pp_mesh, placed_as, device, names, get_mesh=get_mesh)
    rank = pp_mesh.get_local_rank()
    parts = [pp._split_module(model, names[j]) for j in plan.stages_of(rank)]
    stages = [PipelineStage(m, j, plan.num_stages, device, group=pp_mesh.get_group("pp"), get_mesh=get_mesh)
              for j, m in zip(plan.stages_of(rank), parts, strict=True)]  # fmt: skip
    return stages, parts


def scalar_loss(loss_fn: Callable[..., Any]) -> Callable[..., torch.Tensor]:
    """torchtitan's loss (it returns the loss and its metrics) as the bare loss a schedule needs."""

    def loss(*args: Any, **kwargs: Any) -> torch.Tensor:
        out = loss_fn(*args, **kwargs)
        return out[0] if isinstance(out, tuple) else out

    return loss


def plan_schedule(stages: Sequence[PipelineStage], plan: Plan, loss_fn: Callable[..., Any],
                  tied: Sequence[Tie] | None = None) -> TitanPlanSchedule:  # fmt: skip
    """The schedule of this rank's torchtitan stages: their modules wrapped by :class:`MaskedPart`, torchtitan's
    loss made scalar, gradients of the sum of the microbatches' losses (torchtitan's ``scale_grads=False``)."""
    for s in stages:
        if not isinstance(s.submod, MaskedPart):
            s.submod = MaskedPart(s.submod)
    return TitanPlanSchedule(list(stages), plan, scalar_loss(loss_fn), scale_grads=False, tied=tied)


def plan_pipelining_fn(plan: PlanLike, module_names: Sequence[Sequence[str]] | None = None, *,
                       tied: Sequence[Tie] | None = None) -> Callable[..., tuple[Any, list[nn.Module], bool, bool]]:  # fmt: skip
    """A ``pipelining_fn`` for torchtitan's ``ModelSpec`` that runs ``plan`` (a plan or its file).

    ``module_names``: each stage's module names (default: the job's
    ``[parallelism] module_fqns_per_model_part``). ``tied``: weights shared by
    stages, ``{stage: name in its part}`` (torchtitan refuses weight tying
    with pipeline parallelism in its own config check, so none by default).
    Returns what torchtitan's ``pipeline_llm`` returns: the schedule, this
    rank's model parts, and whether the rank holds the first and the last stage.
    """
    checked = _plan(plan)

    def pipelining_fn(model: nn.Module, *, parallel_dims: Any, training: Any, parallelism: Any,
                      compile_config: Any, ac_config: Any, dump_folder: str, device: torch.device,
                      model_config: Any, parallelize_fn: Callable[..., nn.Module], loss_fn: Callable[..., Any],
                      **_: Any) -> tuple[Any, list[nn.Module], bool, bool]:  # fmt: skip
        names = module_names if module_names is not None else parallelism.module_fqns_per_model_part
        if names is None:
            raise PlanError("the plan's stages need their module names: set [parallelism] "
                            "module_fqns_per_model_part (umsearch export writes it) or pass module_names")  # fmt: skip
        if training.local_batch_size != checked.global_batch:
            raise PlanError(f"[training] local_batch_size = {training.local_batch_size} but the plan's batch is "
                            f"{checked.global_batch}; set local_batch_size = {checked.global_batch}")  # fmt: skip
        pp = _titan()
        stages, parts = split_model(model, checked, parallel_dims.get_mesh("pp"), device, names,
                                    get_mesh=pp._build_get_mesh_callback(parallel_dims))  # fmt: skip
        for i, part in enumerate(parts):
            parts[i] = parallelize_fn(part, parallel_dims=parallel_dims, training=training, parallelism=parallelism,
                                      compile_config=compile_config, ac_config=ac_config, dump_folder=dump_folder)  # fmt: skip
            stages[i].submod = parts[i]
        check_unsharded(parts)
        schedule = plan_schedule(stages, checked, loss_fn, tied)
        mine = checked.stages_of(schedule.rank)
        return schedule, parts, 0 in mine, checked.num_stages - 1 in mine

    return pipelining_fn
