"""The plan (``umsearch.plan/2``): ranks, stages placed on them, and every rank's action list.

MODEL.md sections 2 and 3. Two types, kept apart on purpose:

- :class:`Plan` is what a schedule *is*: global batch, ranks, stages, actions.
  It is frozen and hashable, so equal plans compare equal and the search can
  deduplicate them.
- :class:`PlanDocument` is what is written to disk: a plan plus its
  prediction and provenance (profile path and sha256, model, state factor,
  search space, seed, source).

:func:`validate_plan` is the single gate every plan passes before it is
simulated, searched from, written or executed; its errors name the rank, the
action and the rule. A ``umsearch.plan/1`` file (one stage per rank, orders
given by a warmup) loads as the plan/2 of MODEL.md section 6.1.

Version 2.2 (MODEL.md section 9) adds optional fields for data-parallel
replicas on a cluster: ``data_parallel``, ``cluster``, ``layout``, ``zero1``.
A plan without them means what it meant, and is written without them.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from umsearch.core.actions import Action, parse_action
from umsearch.core.cluster import DEFAULT_LAYOUT, LAYOUTS, Cluster, cluster_from_json
from umsearch.core.errors import PlanError
from umsearch.core.fields import check_keys, integer, mapping, required
from umsearch.core.jsonio import check_input_path, read_json, write_json
from umsearch.core.samples import spans

SCHEMA = "umsearch.plan/2"
SCHEMA_V1 = "umsearch.plan/1"
_SEE = "MODEL.md section 2"

MAX_MICROBATCHES = 1_000_000
"""Most microbatches one stage may list (a bound on the work any command does)."""


@dataclass(frozen=True, kw_only=True)
class Stage:
    """One model chunk: a layer range, the rank holding it, and how it splits the batch."""

    layers: tuple[int, int]
    """Half-open layer range ``[lo, hi)``."""
    rank: int
    """The rank (device) that holds and runs this stage."""
    forward: tuple[int, ...]
    """Forward microbatch sizes, in sample order; they sum to the global batch."""
    backward: tuple[int, ...]
    """Backward microbatch sizes, in sample order; equal to ``forward`` unless ``recompute``."""
    recompute: bool = False
    """Whether the stage keeps only its inputs and rebuilds each backward microbatch's graph."""

    @property
    def lo(self) -> int:
        return self.layers[0]

    @property
    def hi(self) -> int:
        return self.layers[1]

    def to_json(self) -> dict[str, Any]:
        return {"layers": list(self.layers), "rank": self.rank, "forward": list(self.forward),
                "backward": list(self.backward), "recompute": self.recompute}  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class Plan:
    """A full pipeline schedule for one global batch (hashable; see :class:`PlanDocument` for files)."""

    global_batch: int
    """``B``: samples per iteration."""
    ranks: int
    """``R``: devices of the pipeline, ``0..R-1``."""
    stages: tuple[Stage, ...]
    """Stages in model order; stage ``j`` runs layers after stage ``j-1``'s."""
    actions: tuple[tuple[Action, ...], ...]
    """``actions[r]``: rank r's actions, in the order it runs them."""
    data_parallel: int = 1
    """``D``: identical replicas of the pipeline, each training on ``B / D`` samples (MODEL.md 9)."""
    cluster: Cluster | None = None
    """Nodes and their two links; None: every message uses the profile's link."""
    layout: str = DEFAULT_LAYOUT
    """Which device replica d's rank r is: ``dp_inner`` (``r * D + d``) or ``pp_inner`` (``d * R + r``)."""
    zero1: bool = False
    """Whether optimizer states are sharded over the replicas (memory only)."""

    @property
    def replica_batch(self) -> int:
        """Samples one replica trains on: what every stage's lists sum to."""
        return self.global_batch // self.data_parallel

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    @property
    def num_layers(self) -> int:
        """Layers the plan covers (the last stage's end)."""
        return self.stages[-1].hi

    def stages_of(self, rank: int) -> tuple[int, ...]:
        """Indices of the stages rank ``rank`` holds, ascending."""
        return tuple(j for j, st in enumerate(self.stages) if st.rank == rank)

    @cached_property
    def uses_split(self) -> tuple[bool, ...]:
        """Per stage: whether any of its backwards is split into ``I`` and ``W``."""
        split = [False] * self.num_stages
        for acts in self.actions:
            for a in acts:
                if a.kind == "I":
                    split[a.stage] = True
        return tuple(split)

    @property
    def equal_microbatches(self) -> bool:
        """Whether every stage runs the same list forward and backward (what torch's schedules run)."""
        first = self.stages[0].forward
        return all(st.forward == first and st.backward == first for st in self.stages)

    def to_json(self) -> dict[str, Any]:
        """The contract fields of a plan/2 file (no prediction, no provenance); the section 9 fields
        only where they differ from their defaults, so older plans are written as before."""
        out = {"schema": SCHEMA, "global_batch": self.global_batch, "ranks": self.ranks,
               "stages": [s.to_json() for s in self.stages],
               "actions": [[str(a) for a in acts] for acts in self.actions]}  # fmt: skip
        if self.data_parallel != 1:
            out["data_parallel"] = self.data_parallel
        if self.cluster is not None:
            out["cluster"] = self.cluster.to_json()
        if self.layout != DEFAULT_LAYOUT:
            out["layout"] = self.layout
        if self.zero1:
            out["zero1"] = True
        return out


META_KEYS = ("profile", "profile_sha256", "model", "state_factor", "search_space", "seed", "source")
"""Provenance a plan file may carry beside the plan and its prediction."""


@dataclass(frozen=True, kw_only=True)
class PlanDocument:
    """A plan file: the plan, what the simulator predicted for it, and where it came from."""

    plan: Plan
    """The schedule itself."""
    predicted: dict[str, Any] | None = None
    """At least ``iteration_ms`` (None on deadlock) and ``peak_memory_bytes`` (one per rank)."""
    meta: dict[str, Any] = field(default_factory=dict)
    """Provenance (:data:`META_KEYS`): ``profile`` (path, relative to the plan file or absolute),
    ``profile_sha256``, ``model`` ({source, args}), ``state_factor``, ``search_space``, ``seed``,
    ``source`` (who made the plan)."""

    @property
    def profile(self) -> str | None:
        """Path of the profile the plan was made for, as written in the file."""
        value = self.meta.get("profile")
        return value if isinstance(value, str) else None

    def to_json(self) -> dict[str, Any]:
        out = self.plan.to_json()
        if self.predicted is not None:
            out["predicted"] = self.predicted
        for key in META_KEYS:
            if key in self.meta:
                out[key] = self.meta[key]
        return out


def _sizes(raw: Any, where: str) -> tuple[int, ...]:
    if not isinstance(raw, list) or not raw:
        raise PlanError(f"plan field {where} must be a non-empty list of sizes, got {raw!r}")
    if len(raw) > MAX_MICROBATCHES:
        raise PlanError(f"plan field {where} lists {len(raw)} microbatches; at most {MAX_MICROBATCHES} are supported")
    return tuple(integer(v, f"{where}[{i}]", PlanError, lo=1) for i, v in enumerate(raw))


def _layers(raw: Any, where: str) -> tuple[int, int]:
    if not isinstance(raw, list) or len(raw) != 2:
        raise PlanError(f"plan field {where} must be [lo, hi] integers, got {raw!r}")
    return integer(raw[0], f"{where}[0]", PlanError), integer(raw[1], f"{where}[1]", PlanError)


def _recompute(raw: dict[str, Any], where: str) -> bool:
    value = raw.get("recompute", False)
    if not isinstance(value, bool):
        raise PlanError(f"plan field {where}.recompute must be true or false, got {value!r}")
    return value


_STAGE_KEYS = frozenset({"layers", "rank", "forward", "backward", "recompute"})


def _stage(raw: Any, j: int) -> Stage:
    where = f"stages[{j}]"
    obj = mapping(raw, where, PlanError)
    check_keys(obj, _STAGE_KEYS, f"{where}.", PlanError)
    forward = _sizes(required(obj, "forward", f"{where}.", PlanError, _SEE), f"{where}.forward")
    return Stage(
        layers=_layers(required(obj, "layers", f"{where}.", PlanError, _SEE), f"{where}.layers"),
        rank=integer(required(obj, "rank", f"{where}.", PlanError, _SEE), f"{where}.rank", PlanError),
        forward=forward,
        backward=_sizes(obj["backward"], f"{where}.backward") if "backward" in obj else forward,
        recompute=_recompute(obj, where),
    )


def _actions(raw: Any, ranks: int) -> tuple[tuple[Action, ...], ...]:
    if not isinstance(raw, list):
        raise PlanError(f"plan field 'actions' must be a list with one action list per rank, got {raw!r}")
    if len(raw) != ranks:
        raise PlanError(f"plan field 'actions' has {len(raw)} lists but the plan has {ranks} ranks; give one per rank")
    out = []
    for r, items in enumerate(raw):
        if isinstance(items, str):
            items = items.split()
        if not isinstance(items, list):
            raise PlanError(f"plan field actions[{r}] must be a list of actions like '0F0', got {items!r}")
        acts = []
        for i, item in enumerate(items):
            if not isinstance(item, str):
                raise PlanError(f"plan field actions[{r}][{i}] must be a string like '0F0', got {item!r}")
            try:
                acts.append(parse_action(item))
            except ValueError as exc:
                raise PlanError(f"plan field actions[{r}][{i}]: {exc}") from None
        out.append(tuple(acts))
    return tuple(out)


def _check_stages(plan: Plan) -> None:
    B, R = plan.replica_batch, plan.ranks
    D = plan.data_parallel
    total = "global_batch" if D == 1 else f"global_batch / data_parallel = {plan.global_batch} / {D}"
    if not plan.stages:
        raise PlanError("plan has no stages; give at least one in 'stages'")
    expect_lo = 0
    for j, st in enumerate(plan.stages):
        lo, hi = st.layers
        if lo != expect_lo:
            raise PlanError(
                f"plan stages[{j}].layers starts at {lo} but the previous stage ends at {expect_lo}; "
                "stages must tile the layers in order"
            )
        if hi <= lo:
            raise PlanError(f"plan stages[{j}].layers = [{lo}, {hi}] is empty; every stage needs a layer")
        expect_lo = hi
        if not 0 <= st.rank < R:
            raise PlanError(f"plan stages[{j}].rank = {st.rank} but the plan has {R} ranks (0..{R - 1})")
        for name, seq in (("forward", st.forward), ("backward", st.backward)):
            if sum(seq) != B:
                raise PlanError(
                    f"plan stages[{j}].{name} sums to {sum(seq)} but {total} is {B}; "
                    "the microbatches of every stage must cover the batch exactly"
                )
        if not st.recompute and st.backward != st.forward:
            raise PlanError(
                f"plan stages[{j}].backward differs from its forward but the stage does not recompute; "
                "set recompute: true or make them equal (autograd back-propagates whole forward microbatches)"
            )
    empty = sorted(set(range(R)) - {st.rank for st in plan.stages})
    if empty:
        raise PlanError(f"rank {empty[0]} holds no stage; every rank needs at least one (or lower 'ranks')")


def _check_rank_actions(plan: Plan, r: int) -> None:
    """MODEL.md section 3 for rank ``r``: the right actions, each once, I before W, B/I after their forwards."""
    where: dict[Action, int] = {}
    for pos, a in enumerate(plan.actions[r]):
        if not 0 <= a.stage < plan.num_stages:
            raise PlanError(f"rank {r} lists {a} but the plan has only {plan.num_stages} stages")
        st = plan.stages[a.stage]
        if st.rank != r:
            raise PlanError(f"rank {r} lists {a} but stage {a.stage} is on rank {st.rank}")
        count = len(st.forward) if a.kind == "F" else len(st.backward)
        if a.mb >= count:
            which = "forward" if a.kind == "F" else "backward"
            raise PlanError(f"rank {r} lists {a} but stage {a.stage} has {count} {which} microbatches (0..{count - 1})")
        if a in where:
            raise PlanError(f"rank {r} lists {a} twice")
        where[a] = pos
    for j in plan.stages_of(r):
        st = plan.stages[j]
        for k in range(len(st.forward)):
            if Action(j, "F", k) not in where:
                raise PlanError(f"rank {r} never runs {Action(j, 'F', k)}: every forward microbatch runs once")
        for k, held_by in enumerate(spans(st.forward, st.backward)):
            b, i, w = Action(j, "B", k), Action(j, "I", k), Action(j, "W", k)
            if b in where and (i in where or w in where):
                raise PlanError(f"rank {r} lists both {b} and {i if i in where else w}: a backward runs whole or split")
            if b not in where and (i not in where or w not in where):
                missing = b if i not in where and w not in where else (w if i in where else i)
                raise PlanError(f"rank {r} never runs {missing}: each backward runs as B, or as I then W")
            first = b if b in where else i
            if w in where and where[w] < where[i]:
                raise PlanError(f"rank {r}: {w} comes before {i}")
            for f in held_by:
                if where[Action(j, "F", f)] > where[first]:
                    raise PlanError(f"rank {r}: {first} comes before {Action(j, 'F', f)}, which holds its samples")


def _check_replicas(plan: Plan) -> None:
    """MODEL.md section 9: D divides B, a known layout, at least one device per node."""
    D, B = integer(plan.data_parallel, "data_parallel", PlanError, lo=1), plan.global_batch
    if B % D:
        raise PlanError(f"plan field data_parallel = {D} does not divide global_batch = {B}; "
                        "choose a data-parallel degree that divides the batch")  # fmt: skip
    if plan.layout not in LAYOUTS:
        raise PlanError(f"plan field layout = {plan.layout!r} is not a layout; use 'dp_inner' or 'pp_inner'")
    if not isinstance(plan.zero1, bool):
        raise PlanError(f"plan field zero1 must be true or false, got {plan.zero1!r}")
    if plan.cluster is not None and plan.cluster.gpus_per_node < 1:
        raise PlanError(f"plan field cluster.gpus_per_node = {plan.cluster.gpus_per_node} must be at least 1 "
                        "(devices per node)")  # fmt: skip


def validate_plan(plan: Plan, num_layers: int | None = None) -> Plan:
    """Check MODEL.md sections 2-3 and 9; return the plan unchanged or raise :class:`PlanError`.

    ``num_layers`` (from the profile or the model) is checked when given.
    Whether the profile has the I/W split the plan uses is
    :func:`check_profile_fits`'s question.
    """
    integer(plan.global_batch, "global_batch", PlanError, lo=1)
    integer(plan.ranks, "ranks", PlanError, lo=1)
    _check_replicas(plan)
    _check_stages(plan)
    if len(plan.actions) != plan.ranks:
        raise PlanError(f"the plan has {len(plan.actions)} action lists for {plan.ranks} ranks; give one per rank")
    for r in range(plan.ranks):
        _check_rank_actions(plan, r)
    if num_layers is not None and plan.num_layers != num_layers:
        raise PlanError(
            f"plan covers layers [0, {plan.num_layers}) but the model has {num_layers} layers; "
            "the last stage must end at the last layer"
        )
    return plan


def _v1_plan(obj: dict[str, Any]) -> Plan:
    """MODEL.md 6.1: a plan/1 file as plan/2 (stage j on rank j, orders from each stage's warmup)."""
    from umsearch.core.schedules import warmup_rule

    check_keys(obj, {"schema", "global_batch", "stages", "predicted", *META_KEYS}, "", PlanError)
    raw_stages = required(obj, "stages", "", PlanError, _SEE)
    if not isinstance(raw_stages, list) or not raw_stages:
        raise PlanError(f"plan field 'stages' must be a non-empty list, got {raw_stages!r}")
    stages, orders = [], []
    for j, raw in enumerate(raw_stages):
        where = f"stages[{j}]"
        st_obj = mapping(raw, where, PlanError)
        check_keys(st_obj, {"layers", "forward", "backward", "warmup", "recompute"}, f"{where}.", PlanError)
        forward = _sizes(required(st_obj, "forward", f"{where}.", PlanError, _SEE), f"{where}.forward")
        backward = _sizes(st_obj["backward"], f"{where}.backward") if "backward" in st_obj else forward
        warmup = integer(required(st_obj, "warmup", f"{where}.", PlanError, _SEE), f"{where}.warmup", PlanError, lo=1)
        stages.append(Stage(layers=_layers(required(st_obj, "layers", f"{where}.", PlanError, _SEE), f"{where}.layers"),
                            rank=j, forward=forward, backward=backward, recompute=_recompute(st_obj, where)))  # fmt: skip
        if sum(forward) == sum(backward):
            orders.append(warmup_rule(j, forward, backward, warmup))
        else:
            orders.append(())  # validate_plan names the bad sum
    B = integer(required(obj, "global_batch", "", PlanError, _SEE), "global_batch", PlanError, lo=1)
    return Plan(global_batch=B, ranks=len(stages), stages=tuple(stages), actions=tuple(orders))


_PLAN_KEYS = frozenset({"schema", "global_batch", "ranks", "stages", "actions", "predicted", *META_KEYS,
                        "data_parallel", "cluster", "layout", "zero1"})  # fmt: skip


def _replica_fields(obj: dict[str, Any]) -> dict[str, Any]:
    """The optional section 9 fields of a plan/2 object, as :class:`Plan` keyword arguments."""
    out: dict[str, Any] = {}
    if "data_parallel" in obj:
        out["data_parallel"] = integer(obj["data_parallel"], "data_parallel", PlanError, lo=1)
    if "cluster" in obj:
        out["cluster"] = cluster_from_json(obj["cluster"])
    if "layout" in obj:
        layout = obj["layout"]
        if layout not in LAYOUTS:
            raise PlanError(f"plan field layout = {layout!r} is not a layout; use 'dp_inner' or 'pp_inner'")
        out["layout"] = layout
    if "zero1" in obj:
        if not isinstance(obj["zero1"], bool):
            raise PlanError(f"plan field zero1 must be true or false, got {obj['zero1']!r}")
        out["zero1"] = obj["zero1"]
    return out


def document_from_json(obj: Any, num_layers: int | None = None) -> PlanDocument:
    """Build and validate a :class:`PlanDocument` from a decoded plan/1 or plan/2 object."""
    if not isinstance(obj, dict):
        raise PlanError(f"a plan must be a JSON object, got {type(obj).__name__}")
    schema = obj.get("schema")
    if schema == SCHEMA_V1:
        plan = _v1_plan(obj)
    elif schema == SCHEMA:
        check_keys(obj, _PLAN_KEYS, "", PlanError)
        ranks = integer(required(obj, "ranks", "", PlanError, _SEE), "ranks", PlanError, lo=1)
        raw_stages = required(obj, "stages", "", PlanError, _SEE)
        if not isinstance(raw_stages, list):
            raise PlanError(f"plan field 'stages' must be a list, got {raw_stages!r}")
        plan = Plan(
            global_batch=integer(required(obj, "global_batch", "", PlanError, _SEE), "global_batch", PlanError, lo=1),
            ranks=ranks,
            stages=tuple(_stage(raw, j) for j, raw in enumerate(raw_stages)),
            actions=_actions(required(obj, "actions", "", PlanError, _SEE), ranks),
            **_replica_fields(obj),
        )
    else:
        raise PlanError(f"unknown plan schema {schema!r}; this umsearch reads {SCHEMA!r} and {SCHEMA_V1!r}")
    predicted = obj.get("predicted")
    if predicted is not None and not isinstance(predicted, dict):
        raise PlanError(f"plan field 'predicted' must be an object, got {predicted!r}")
    profile = obj.get("profile")
    if profile is not None and not isinstance(profile, str):
        raise PlanError(f"plan field 'profile' must be a path string, got {profile!r}")
    validate_plan(plan, num_layers)
    return PlanDocument(plan=plan, predicted=predicted, meta={k: obj[k] for k in META_KEYS if k in obj})


def plan_from_json(obj: Any, num_layers: int | None = None) -> Plan:
    """The validated :class:`Plan` of a decoded plan/1 or plan/2 object."""
    return document_from_json(obj, num_layers).plan


def load_document(path: str | os.PathLike[str], num_layers: int | None = None) -> PlanDocument:
    """Read and validate a plan file; errors name the file."""
    obj = read_json(path, "plan", PlanError)
    try:
        return document_from_json(obj, num_layers)
    except PlanError as exc:
        raise PlanError(f"{path}: {exc}") from None


def load_plan(path: str | os.PathLike[str], num_layers: int | None = None) -> Plan:
    """The validated :class:`Plan` of a plan file."""
    return load_document(path, num_layers).plan


def save_document(doc: PlanDocument, path: str | os.PathLike[str]) -> Path:
    """Validate ``doc.plan`` and write the document atomically as plan/2."""
    validate_plan(doc.plan)
    return write_json(path, doc.to_json())


def save_plan(plan: Plan, path: str | os.PathLike[str], **meta: Any) -> Path:
    """Write a bare plan (and optional provenance) atomically as plan/2."""
    return save_document(PlanDocument(plan=plan, meta=meta), path)


def resolve_profile_path(doc: PlanDocument, plan_path: str | os.PathLike[str]) -> Path | None:
    """The document's profile path, relative paths taken from the plan file's directory first."""
    if doc.profile is None:
        return None
    # Checked before the file system is asked: a NUL byte or a 100,000-character name raises there.
    try:
        p = check_input_path(doc.profile, "profile", PlanError)
    except PlanError as exc:
        raise PlanError(f"{plan_path}: {exc}") from None
    if p.is_absolute():
        return p
    here = Path(plan_path).parent / p
    return here if here.exists() or not p.exists() else p


def equal_split(batch: int, count: int) -> tuple[int, ...]:
    """``count`` contiguous microbatches as equal as possible, larger ones first (as torch splits)."""
    if not 1 <= count <= batch:
        raise PlanError(f"cannot split a batch of {batch} into {count} microbatches")
    q, r = divmod(batch, count)
    return tuple(q + 1 if i < r else q for i in range(count))


def placed_plan(cuts: Sequence[int], placement: Sequence[int], batch: int, forward: Sequence[Sequence[int]],
                actions: Sequence[Sequence[Action]], backward: Sequence[Sequence[int]] | None = None,
                recompute: Sequence[bool] | None = None) -> Plan:  # fmt: skip
    """A plan from cut points ``[0, c1, ..., L]``, the rank of each stage, its lists and the actions."""
    n = len(cuts) - 1
    back = backward if backward is not None else forward
    rec = recompute if recompute is not None else [False] * n
    stages = tuple(Stage(layers=(cuts[j], cuts[j + 1]), rank=placement[j], forward=tuple(forward[j]),
                         backward=tuple(back[j]), recompute=rec[j]) for j in range(n))  # fmt: skip
    return Plan(global_batch=batch, ranks=max(placement) + 1, stages=stages, actions=tuple(tuple(a) for a in actions))
