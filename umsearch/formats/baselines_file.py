"""The ``baselines.json`` a search writes beside its plan, read back and checked against that plan.

A baselines file is data like any other: a baseline is used (exported in the
plan's place) only when it describes the same training step as the plan (the
same ranks, global batch and layers), is a valid plan that runs to the end (no
deadlock), and claims a positive, finite iteration time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from umsearch.core.deps import find_deadlock
from umsearch.core.plan import Plan
from umsearch.core.plan_io import _parse_document
from umsearch.core.plan_rules import validate_plan
from umsearch.errors import PlanError
from umsearch.storage.jsonio import read_json

BASELINES_FILE = "baselines.json"
"""The file name a search gives its baselines, beside ``plan.json``."""
BASELINES_SCHEMA_PREFIX = "umsearch.baselines/"


@dataclass(frozen=True, kw_only=True)
class Baseline:
    """One baseline that passed every check against its plan."""

    name: str
    """Its name in the file (a peer schedule, ``local greedy``)."""
    plan: Plan
    """The baseline's plan."""
    claimed_ms: float
    """The iteration time the file claims for it (positive, finite)."""


def _mismatch(name: str, raw: object, plan: Plan) -> tuple[Baseline | None, str | None]:
    """The checked baseline, or None and why it does not fit ``plan``."""
    try:
        doc = _parse_document(raw, plan.num_layers)
        validate_plan(doc.plan, plan.num_layers)
    except PlanError as exc:
        return None, f"{name}: {exc}"
    b = doc.plan
    if b.ranks != plan.ranks:
        return None, f"{name}: {b.ranks} ranks, the plan has {plan.ranks}"
    if b.global_batch != plan.global_batch:
        return None, f"{name}: a batch of {b.global_batch}, the plan's is {plan.global_batch}"
    stuck = find_deadlock(b)
    if stuck:
        return None, f"{name}: deadlocks ({stuck[0]})"
    t = (doc.predicted or {}).get("iteration_ms")
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not (0 < t and math.isfinite(t)):
        return None, f"{name}: its predicted iteration_ms {t!r} is no positive time"
    return Baseline(name=name, plan=b, claimed_ms=float(t)), None


def checked_baselines(path: str | Path, plan: Plan) -> tuple[list[Baseline], list[str]]:
    """The baselines in ``path`` that fit ``plan`` (fastest claimed first), and why each other one does not.

    Raises :class:`PlanError` when the file is no baselines file (unreadable,
    another schema, ``baseline_plans`` not an object of name -> plan).
    """
    doc = read_json(path, "baselines", PlanError)
    if not isinstance(doc, dict) or not str(doc.get("schema", "")).startswith(BASELINES_SCHEMA_PREFIX):
        raise PlanError(f"{path} is no umsearch baselines file (its 'schema' is not {BASELINES_SCHEMA_PREFIX}N); "
                        "give the baselines.json of a search's output folder")  # fmt: skip
    raw = doc.get("baseline_plans")
    if not isinstance(raw, dict):
        raise PlanError(f"{path}: 'baseline_plans' must be an object of name -> plan, got "
                        f"{type(raw).__name__}; rewrite it with umsearch search")  # fmt: skip
    usable: list[Baseline] = []
    refused: list[str] = []
    for name, entry in raw.items():
        if entry is None:  # no plan of that schedule fit the memory limit
            continue
        found, why = _mismatch(str(name), entry, plan)
        if found is not None:
            usable.append(found)
        else:
            refused.append(str(why))
    return sorted(usable, key=lambda b: b.claimed_ms), refused
