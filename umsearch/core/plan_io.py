"""Plan files: :class:`PlanDocument` (a plan with its prediction and provenance) to and from JSON and disk.

``umsearch.plan/2`` is read and written; a ``umsearch.plan/1`` file (one stage per rank, orders
given by a warmup) is read as the plan/2 of docs/model.md section 6.1. Reading is private here:
a plan file is read through its one gate, :func:`umsearch.core.loader.load_plan_file`, which parses
it with :func:`_parse_document` (the size limits on the raw lists, then the fields) and checks it
once (:func:`umsearch.core.plan_rules.validate_plan`); errors name the file, the field and the value.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from umsearch.core.actions import Action, parse_action
from umsearch.core.cluster import bucket_mib_from_json, cluster_from_json
from umsearch.core.field_checks import check_keys, integer, mapping, required
from umsearch.core.plan import MAX_MICROBATCHES, SCHEMA, SCHEMA_V1, Plan, Stage
from umsearch.core.plan_rules import check_size, validate_plan
from umsearch.errors import PlanError
from umsearch.storage.jsonio import check_input_path, write_json

_SEE = "docs/model.md section 2"


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


def _raw_microbatches(raw_stages: list[Any]) -> int:
    """How many forward and backward microbatches the raw stages list (a stage without ``backward``
    runs its forward list backward too); malformed stages count 0 and are refused when read."""
    total = 0
    for raw in raw_stages:
        if isinstance(raw, dict):
            forward = len(raw["forward"]) if isinstance(raw.get("forward"), list) else 0
            total += forward + (len(raw["backward"]) if isinstance(raw.get("backward"), list) else forward)
    return total


def _check_raw_stages(raw_stages: list[Any], num_layers: int | None) -> None:
    """:func:`check_size` on the raw stages, before any is built."""
    check_size(stages=len(raw_stages), num_layers=num_layers)
    check_size(microbatches=_raw_microbatches(raw_stages))


def _actions(raw: Any, ranks: int) -> tuple[tuple[Action, ...], ...]:
    if not isinstance(raw, list):
        raise PlanError(f"plan field 'actions' must be a list with one action list per rank, got {raw!r}")
    if len(raw) != ranks:
        raise PlanError(f"plan field 'actions' has {len(raw)} lists but the plan has {ranks} ranks; give one per rank")
    lists = [items.split() if isinstance(items, str) else items for items in raw]
    check_size(actions=sum(len(items) for items in lists if isinstance(items, list)))
    out = []
    for r, items in enumerate(lists):
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


def _v1_plan(obj: dict[str, Any], num_layers: int | None) -> Plan:
    """docs/model.md 6.1: a plan/1 file as plan/2 (stage j on rank j, orders from each stage's warmup)."""
    from umsearch.core.schedules import warmup_rule

    check_keys(obj, {"schema", "global_batch", "stages", "predicted", *META_KEYS}, "", PlanError)
    raw_stages = required(obj, "stages", "", PlanError, _SEE)
    if not isinstance(raw_stages, list) or not raw_stages:
        raise PlanError(f"plan field 'stages' must be a non-empty list, got {raw_stages!r}")
    check_size(ranks=len(raw_stages))  # one stage per rank
    _check_raw_stages(raw_stages, num_layers)
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
                        "data_parallel", "cluster", "layout", "zero1", "bucket_mib"})  # fmt: skip


def _replica_fields(obj: dict[str, Any]) -> dict[str, Any]:
    """The optional section 9 fields of a plan/2 object, as :class:`Plan` keyword arguments (checked by
    :func:`~umsearch.core.plan_rules.validate_plan`, which every plan read passes)."""
    out: dict[str, Any] = {k: obj[k] for k in ("data_parallel", "layout", "zero1") if k in obj}
    if "cluster" in obj:
        out["cluster"] = cluster_from_json(obj["cluster"])
    out["bucket_mib"] = bucket_mib_from_json(obj)
    return out


def _parse_document(obj: Any, num_layers: int | None = None) -> PlanDocument:
    """A :class:`PlanDocument` from a decoded plan/1 or plan/2 object, its plan NOT yet checked (the
    caller's :func:`~umsearch.core.plan_rules.validate_plan` is the one check). The size limits
    (:func:`~umsearch.core.plan_rules.check_size`) are checked on the raw lists first, so a huge plan is
    refused before any of it is built."""
    if not isinstance(obj, dict):
        raise PlanError(f"a plan must be a JSON object, got {type(obj).__name__}")
    schema = obj.get("schema")
    if schema == SCHEMA_V1:
        plan = _v1_plan(obj, num_layers)
    elif schema == SCHEMA:
        check_keys(obj, _PLAN_KEYS, "", PlanError)
        ranks = integer(required(obj, "ranks", "", PlanError, _SEE), "ranks", PlanError, lo=1)
        check_size(ranks=ranks)
        raw_stages = required(obj, "stages", "", PlanError, _SEE)
        if not isinstance(raw_stages, list):
            raise PlanError(f"plan field 'stages' must be a list, got {raw_stages!r}")
        _check_raw_stages(raw_stages, num_layers)
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
    return PlanDocument(plan=plan, predicted=predicted, meta={k: obj[k] for k in META_KEYS if k in obj})


def save_document(doc: PlanDocument, path: str | os.PathLike[str]) -> Path:
    """Check ``doc.plan`` (:func:`~umsearch.core.plan_rules.validate_plan`) and write the document atomically
    as plan/2."""
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
