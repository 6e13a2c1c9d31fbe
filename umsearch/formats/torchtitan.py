"""A plan as torchtitan's ``[parallelism]`` settings (NeMo Automodel reads the same names).

torchtitan builds its pipeline from a few settings, checked here against
its ``Parallelism`` job config (``torchtitan/config/job_config.py``) and its
``build_pipeline_schedule``:

- ``pipeline_parallel_degree``: the ranks R.
- ``pipeline_parallel_microbatch_size``: one size for every microbatch;
  torchtitan runs ``training.local_batch_size // microbatch_size`` of them
  and refuses a batch the size does not divide.
- ``module_fqns_per_model_part``: for each stage, the module names it holds.
  umsearch writes the profile's layer names: they are the model's module
  paths when the profile was taken of a model whose layers are named that way
  (a torchtitan Llama: ``tok_embeddings``, ``layers.0`` .. ``layers.N``,
  ``norm``, ``output``). Zoo models are plain ``nn.Sequential`` lists, whose
  paths are ``0``, ``1``, ...: :func:`module_names` maps them so.
- ``pipeline_parallel_schedule``: one of torch's schedule names when the
  plan's order is exactly that schedule's; otherwise
  ``pipeline_parallel_schedule_csv`` names a compute-only CSV of the order,
  which torchtitan runs with ``_PipelineScheduleRuntime``. It still reads
  the schedule name to place stages on ranks (V-shape for ``ZBVZeroBubble``,
  looped otherwise), so umsearch names one with the plan's placement.

Data-parallel replicas (docs/model.md section 9, ``data_parallel = D > 1``):
``training.local_batch_size`` is one replica's ``B / D`` (torchtitan's
per-device batch) and ``training.global_batch_size`` is ``B``. torchtitan's
plain replication, ``data_parallel_replicate_degree`` (DDP), does not compose
with pipeline parallelism: its parallelize step raises "DDP has not supported
> 1D parallelism" unless DDP spans every device. Its data parallelism beside a
pipeline is FSDP, ``data_parallel_shard_degree``, which also shards
parameters, gradients and optimizer states and reduce-scatters the gradients
instead of all-reducing them; so the export writes
``data_parallel_shard_degree = D`` (``data_parallel_replicate_degree = 1``)
and says so (:attr:`TorchtitanExport.notes`). torchtitan's device mesh puts the
pipeline outermost, so a stage's copies sit side by side: the ``dp_inner``
layout; a ``pp_inner`` plan is noted too. torchtitan has no ZeRO-1 setting: a
``zero1`` plan exports the same FSDP settings, with a note that FSDP shards
more than the plan does.

Pure Python; neither torch nor torchtitan is imported.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from umsearch.core.plan import Plan
from umsearch.core.schedules import PEER_SCHEDULES, placement
from umsearch.errors import PlanError

PARALLELISM_KEYS = (
    "data_parallel_replicate_degree",
    "data_parallel_shard_degree",
    "pipeline_parallel_degree",
    "pipeline_parallel_microbatch_size",
    "module_fqns_per_model_part",
    "pipeline_parallel_schedule",
    "pipeline_parallel_schedule_csv",
)
"""Every ``[parallelism]`` key an export writes, spelled as torchtitan's job config spells them."""

TRAINING_KEYS = ("local_batch_size", "global_batch_size")
"""Every ``[training]`` key an export writes, spelled as torchtitan's job config spells them."""


@dataclass(frozen=True, kw_only=True)
class TorchtitanExport:
    """What a torchtitan job needs to run a plan."""

    training: dict[str, Any]
    """The ``[training]`` settings (``local_batch_size``)."""
    parallelism: dict[str, Any]
    """The ``[parallelism]`` settings, keys from :data:`PARALLELISM_KEYS`."""
    csv: str | None
    """The compute-only schedule CSV when no named schedule matches (None otherwise)."""
    notes: tuple[str, ...] = ()
    """Where torchtitan will not run the plan exactly as umsearch planned it (data parallelism)."""

    def toml(self, header: str = "") -> str:
        """The settings as a TOML fragment to merge into a torchtitan train config."""
        lines = [f"# {line}" for line in header.splitlines()] + ["", "[training]"]
        lines += [f"{k} = {_toml(v)}" for k, v in self.training.items()]
        lines += ["", "[parallelism]"]
        lines += [f"{k} = {_toml(v)}" for k, v in self.parallelism.items()]
        return "\n".join(lines).lstrip("\n") + "\n"


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    raise TypeError(f"no TOML form for {value!r}")


def named_schedule(plan: Plan) -> str | None:
    """The torch schedule whose order and placement the plan has exactly (equal microbatches), or None."""
    if not plan.equal_microbatches or plan.num_stages % plan.ranks:
        return None
    v, m = plan.num_stages // plan.ranks, len(plan.stages[0].forward)
    ranks_of = tuple(st.rank for st in plan.stages)
    for name, peer in PEER_SCHEDULES.items():
        if peer.accepts(plan.ranks, v, m) is None and peer.stage_ranks(plan.ranks, v) == ranks_of \
                and peer.generate(plan.ranks, v, m) == plan.actions:  # fmt: skip
            return name
    return None


def placement_name(plan: Plan) -> str:
    """A torch schedule name that makes torchtitan place the plan's stages where the plan has them."""
    if plan.num_stages % plan.ranks == 0:
        v = plan.num_stages // plan.ranks
        ranks_of = tuple(st.rank for st in plan.stages)
        if ranks_of == placement("loop", plan.ranks, v):
            return "PipelineScheduleMulti"
        if v == 2 and ranks_of == placement("vshape", plan.ranks, v):
            return "ZBVZeroBubble"
    raise PlanError(
        "torchtitan places stages on ranks looped (stage j on rank j mod R) or, for ZBVZeroBubble, V-shaped "
        f"with 2 per rank; this plan places its {plan.num_stages} stages on ranks "
        f"{[st.rank for st in plan.stages]}; search with placement = 'loop' or 'vshape' to export it"
    )


def data_parallel_notes(plan: Plan) -> tuple[str, ...]:
    """What torchtitan does instead of the plan's data-parallel replicas (none for one replica)."""
    D = plan.data_parallel
    if D == 1:
        return ()
    notes = [
        f"torchtitan's plain replication (data_parallel_replicate_degree, DDP) does not run beside pipeline "
        f"parallelism, so the plan's {D} replicas are exported as FSDP (data_parallel_shard_degree = {D}): "
        "torchtitan shards parameters, gradients and optimizer states over them and reduce-scatters the "
        "gradients instead of all-reducing them, so its memory and communication differ from umsearch's "
        "prediction (umsearch run runs the plan's replicas as planned)"
    ]
    if plan.zero1:
        notes.append("the plan shards optimizer states over its replicas (zero1); torchtitan has no ZeRO-1 "
                     "setting: its FSDP shards parameters and gradients too, using less memory than planned")  # fmt: skip
    if plan.layout != "dp_inner":
        notes.append(f"the plan's layout is {plan.layout} (a replica's ranks side by side); torchtitan's device mesh "
                     "puts the pipeline outermost, so a stage's copies sit side by side (dp_inner) instead")  # fmt: skip
    return tuple(notes)


def module_names(layer_names: Sequence[str], sequential: bool) -> list[str]:
    """The module path of each layer: its index in an ``nn.Sequential`` (zoo models), else its name."""
    return [str(i) for i in range(len(layer_names))] if sequential else list(layer_names)


def torchtitan_export(plan: Plan, modules: Sequence[str], csv_path: str = "schedule.csv") -> TorchtitanExport:
    """torchtitan's settings for ``plan`` (equal microbatches only); ``modules[i]`` is layer i's path.
    With data-parallel replicas, also the data-parallel degree and batch sizes (module docstring).

    Raises PlanError, naming the reason and the way out, for a plan torchtitan
    cannot run as it is (unequal microbatches, a size that does not divide the
    batch, a placement torchtitan does not make).
    """
    from umsearch.formats.torch_csv import pipelining_csv

    if not plan.equal_microbatches:
        raise PlanError("the plan has unequal microbatches (they differ between stages); torchtitan runs "
                        "equal microbatches only")  # fmt: skip
    sizes = plan.stages[0].forward
    if len(set(sizes)) != 1:
        raise PlanError(
            f"the plan splits the batch of {plan.replica_batch} into {len(sizes)} microbatches of sizes "
            f"{sorted(set(sizes))}; torchtitan needs one microbatch size that divides the batch"
        )
    if len(modules) != plan.num_layers:
        raise PlanError(f"{len(modules)} layer names for a plan over {plan.num_layers} layers")
    parallelism: dict[str, Any] = {}
    training: dict[str, Any] = {"local_batch_size": plan.replica_batch}
    if plan.data_parallel > 1:
        parallelism |= {"data_parallel_replicate_degree": 1, "data_parallel_shard_degree": plan.data_parallel}
        training["global_batch_size"] = plan.global_batch
    parallelism |= {
        "pipeline_parallel_degree": plan.ranks,
        "pipeline_parallel_microbatch_size": sizes[0],
        "module_fqns_per_model_part": [list(modules[st.lo:st.hi]) for st in plan.stages],
    }
    name = named_schedule(plan)
    csv = None
    if name is not None:
        parallelism["pipeline_parallel_schedule"] = name
    else:
        parallelism["pipeline_parallel_schedule"] = placement_name(plan)
        try:
            csv = pipelining_csv(plan.actions)
        except ValueError as exc:  # an order torch's schedule validation would refuse
            raise PlanError(f"torch cannot load the plan's order as a schedule CSV: {exc}") from None
        parallelism["pipeline_parallel_schedule_csv"] = csv_path
    return TorchtitanExport(training=training, parallelism=parallelism, csv=csv, notes=data_parallel_notes(plan))


RECIPE_FILE = "plan_schedule.py"
"""The recipe an export writes beside ``torchtitan.toml``: the plan itself through ``PlanSchedule``."""

PLAN_FILE = "umsearch_plan.json"
"""The plan the recipe runs, written beside it."""


def plan_schedule_recipe(plan: Plan, modules: Sequence[str], source: str) -> str:
    """A Python file that runs ``plan`` itself (any microbatches) in torchtitan through ``PlanSchedule``.

    It holds the module names of each stage (``module_fqns_per_model_part``
    cut where the plan cuts), ``pipelining_fn()``, the ``pipelining_fn`` of
    torchtitan's ``ModelSpec`` that cuts torchtitan's model with torchtitan's
    own splitting and returns the plan's schedule
    (:mod:`umsearch.runtime.torchtitan_pipeline`), and
    ``build_plan_schedule(stages, loss_fn)``, the schedule alone for a loop
    that builds its own stages. Raises PlanError where torchtitan cannot place
    the plan's stages (the way out named).
    """
    if len(modules) != plan.num_layers:
        raise PlanError(f"{len(modules)} layer names for a plan over {plan.num_layers} layers")
    if plan.data_parallel > 1:
        raise PlanError(f"the plan has {plan.data_parallel} data-parallel replicas; PlanSchedule runs one pipeline")
    placed_as = placement_name(plan)
    fqns = [list(modules[st.lo:st.hi]) for st in plan.stages]
    return f'''"""Run {source} inside torchtitan through umsearch's PlanSchedule (written by umsearch export).

The plan's own microbatches (unequal and per stage where it has them) run as
planned; torchtitan's settings cannot express them. umsearch must be
importable where the job trains (pip install 'umsearch[torchtitan]').

torchtitan 0.3: give the model spec this plan's pipelining_fn, which cuts
torchtitan's model with torchtitan's own splitting where the plan cuts and
returns the plan's schedule::

    import dataclasses
    from torchtitan.models.llama3 import model_registry
    spec = dataclasses.replace(model_registry("8B"), pipelining_fn=pipelining_fn())

and set [parallelism] pipeline_parallel_degree = {plan.ranks} (with
module_fqns_per_model_part = MODULE_FQNS_PER_MODEL_PART below, or let
pipelining_fn() name them) and [training] local_batch_size = {plan.global_batch}.
The parts must not be wrapped in FSDP (a parallelize_fn without fully_shard).

A loop that builds its own PipelineStages (stage j on rank STAGE_RANKS[j],
holding MODULE_FQNS_PER_MODEL_PART[j]; torchtitan places them so with
pipeline_parallel_schedule = "{placed_as}") takes the schedule alone::

    pp_schedule = build_plan_schedule(stages, loss_fn)

``loss_fn`` there is the model's mean loss; the schedule weighs each
microbatch by its samples, so the gradients are the full batch's and the mean
of ``losses`` is its loss.
"""

from pathlib import Path

PLAN = Path(__file__).with_name("{PLAN_FILE}")
PIPELINE_PARALLEL_DEGREE = {plan.ranks}
LOCAL_BATCH_SIZE = {plan.global_batch}
MODULE_FQNS_PER_MODEL_PART = {fqns!r}
STAGE_RANKS = {[st.rank for st in plan.stages]!r}


def pipelining_fn():
    """torchtitan's ModelSpec.pipelining_fn running the plan (torchtitan 0.3)."""
    from umsearch.runtime.torchtitan_pipeline import plan_pipelining_fn

    return plan_pipelining_fn(PLAN, MODULE_FQNS_PER_MODEL_PART)


def build_plan_schedule(stages, loss_fn):
    """The PlanSchedule of this rank's PipelineStages (what replaces torchtitan's schedule)."""
    from umsearch.pipelining import PlanSchedule

    return PlanSchedule(stages, PLAN, loss_fn)
'''
