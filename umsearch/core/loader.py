"""The one loader of a plan file with everything it refers to: profile, model, state factor.

Every command that reads a plan (simulate, show, export, compare, run,
validate, replay, calibrate) goes through :func:`load_plan_file`, so they all
resolve the profile path, the state factor and the model the same way, check
the plan against the profile once, and refuse a plan that deadlocks (only
``simulate`` and ``show``, which draw the deadlock, take one).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from umsearch.core.cost import CostModel
from umsearch.core.deps import check_deadlock
from umsearch.core.errors import ModelSpecError, PlanError
from umsearch.core.fields import number
from umsearch.core.model_spec import ModelSpec
from umsearch.core.plan import Plan
from umsearch.core.plan_io import PlanDocument, load_document, resolve_profile_path
from umsearch.core.profile import Profile, load_profile

DEFAULT_STATE_FACTOR = 4.0
"""Bytes of training state per parameter byte when neither the plan nor the user says (fp32 weights,
gradients and two Adam moments)."""


@dataclass(frozen=True, kw_only=True)
class LoadedPlan:
    """A plan file and what it refers to, resolved and checked against each other."""

    path: Path
    """The plan file."""
    document: PlanDocument
    """Its contents: plan, prediction, provenance."""
    profile_path: Path | None
    """The profile used: ``--profile``, else the one the plan names (None when there is none)."""
    profile: Profile | None
    """That profile, loaded; the plan has been checked to fit it."""
    state_factor: float
    """``--state-factor``, else the plan's, else 4."""
    model: ModelSpec | None
    """The model to run: named by the user, else the plan's ``model``, else the profile's ``model_spec``."""
    notes: tuple[str, ...] = ()
    """What the user should know before the plan is used (a profile the plan names that is missing)."""

    @property
    def plan(self) -> Plan:
        return self.document.plan

    def cost(self) -> CostModel:
        """The cost model of the profile and state factor; raises PlanError when there is no profile."""
        if self.profile is None:
            raise PlanError(f"{self.path}: the plan names no profile; pass --profile PROFILE.json")
        return CostModel(self.profile, state_factor=self.state_factor)

    def require_model(self) -> ModelSpec:
        """The model spec, or an error saying how to name one."""
        if self.model is None:
            raise PlanError(
                f"{self.path}: the plan names no model to run (no 'model' in the plan, and no profile with a "
                "'model_spec'); name one with --model, e.g. --model gpt --arg layers=14"
            )
        return self.model


def _state_factor(doc: PlanDocument, override: float | None, path: Path) -> float:
    if override is not None:
        return number(override, "--state-factor", PlanError, positive=True, limit=1e6)
    raw = doc.meta.get("state_factor")
    if raw is None:
        return DEFAULT_STATE_FACTOR
    try:
        return number(raw, "state_factor", PlanError, positive=True, limit=1e6)
    except PlanError as exc:
        raise PlanError(f"{path}: {exc}") from None


def _model(doc: PlanDocument, profile: Profile | None, override: ModelSpec | None, trust: bool,
           path: Path) -> ModelSpec | None:  # fmt: skip
    if override is not None:
        return override
    try:
        if "model" in doc.meta:
            return ModelSpec.from_json(doc.meta["model"], f"{path}: the plan's 'model'", trust=trust)
        if profile is not None and "model_spec" in profile.extra:
            return ModelSpec.from_json(profile.extra["model_spec"], "the profile's 'model_spec'", trust=trust)
    except ModelSpecError as exc:
        raise PlanError(str(exc)) from None
    return None


def _missing_profile(plan_path: Path, prof_path: Path, model: ModelSpec | None, allow: bool) -> str:
    """The note for a profile the plan names that is not a readable file; PlanError unless the user named the
    model to run (``model``) or the caller does without a profile (``allow``)."""
    what = "is a link that leads nowhere" if prof_path.is_symlink() else \
        "is not a file" if os.path.lexists(prof_path) else "is missing"  # fmt: skip
    if model is None and not allow:
        raise PlanError(f"{plan_path}: the profile it names, {str(prof_path)!r}, {what}; pass --profile "
                        "PROFILE.json, or name the model to run with --model (then nothing is predicted)")  # fmt: skip
    return f"the profile {plan_path} names, {str(prof_path)!r}, {what}: nothing is predicted for this run"


def load_plan_file(path: str | os.PathLike[str], *, profile: str | os.PathLike[str] | None = None,
                   state_factor: float | None = None, model: ModelSpec | None = None,
                   trust_model_code: bool = False, require_profile: bool = False,
                   allow_missing_profile: bool = False, allow_deadlock: bool = False) -> LoadedPlan:  # fmt: skip
    """Load ``path`` and resolve its profile, state factor and model: the one gate every plan file passes.

    ``profile`` / ``state_factor`` / ``model`` are the user's overrides
    (flags); a model the user names is trusted. ``require_profile`` makes a
    plan without a profile an error. A profile the plan names that is not a
    readable file is an error too, unless the user named the model (``model``)
    or the caller needs no profile (``allow_missing_profile``): then the plan
    loads without one and :attr:`LoadedPlan.notes` says so. The plan is
    validated, checked against the profile when there is one, and refused
    when it deadlocks (unless ``allow_deadlock``).
    """
    plan_path = Path(path)
    doc = load_document(plan_path)
    if not allow_deadlock:
        try:
            check_deadlock(doc.plan)
        except PlanError as exc:
            raise PlanError(f"{plan_path}: {exc}") from None
    prof_path = Path(profile) if profile is not None else resolve_profile_path(doc, plan_path)
    notes: list[str] = []
    if prof_path is not None and profile is None and not require_profile and not prof_path.is_file():
        notes.append(_missing_profile(plan_path, prof_path, model, allow_missing_profile))
        prof_path = None
    if prof_path is None and require_profile:
        raise PlanError(f"{plan_path}: the plan names no profile; pass --profile PROFILE.json")
    prof = load_profile(prof_path) if prof_path is not None else None
    factor = _state_factor(doc, state_factor, plan_path)
    if prof is not None:
        try:
            CostModel(prof, factor).check(doc.plan)
        except PlanError as exc:
            raise PlanError(f"{plan_path} does not fit profile {prof_path}: {exc}") from None
    return LoadedPlan(path=plan_path, document=doc, profile_path=prof_path, profile=prof, state_factor=factor,
                      model=_model(doc, prof, model, trust_model_code, plan_path), notes=tuple(notes))  # fmt: skip
