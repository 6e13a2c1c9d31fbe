"""The one gate of a plan file, with everything it refers to: profile, model, state factor.

Every plan read from a file goes through :func:`load_plan_file` (the commands
simulate, show, export, compare, run, validate, replay, calibrate, the torchrun
entry point of every rank, the library): it reads the file bounded, refuses a
plan too large from the raw lists' lengths before any of it is built, checks it
once (:func:`umsearch.core.plan_rules.validate_plan`), resolves the profile
path, the state factor and the model the same way for all, checks the plan
against the profile, and refuses a plan that deadlocks (only ``simulate`` and
``show``, which draw the deadlock, take one). A :class:`~umsearch.core.plan.Plan`
built in code is checked with :func:`~umsearch.core.plan_rules.validate_plan`.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from umsearch.core.cost import CostModel
from umsearch.core.deps import check_deadlock
from umsearch.core.field_checks import number
from umsearch.core.model_spec import ModelSpec
from umsearch.core.plan import Plan
from umsearch.core.plan_io import PlanDocument, _parse_document, resolve_profile_path
from umsearch.core.plan_rules import validate_plan
from umsearch.core.profile import Profile, load_profile
from umsearch.errors import ModelSpecError, PlanError
from umsearch.storage.jsonio import read_json

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

    def require_profile(self) -> Profile:
        """The profile; raises PlanError when there is none."""
        if self.profile is None:
            raise PlanError(f"{self.path}: the plan names no profile; pass --profile PROFILE.json")
        return self.profile

    def cost(self) -> CostModel:
        """The cost model of the profile and state factor; raises PlanError when there is no profile."""
        return CostModel(self.require_profile(), state_factor=self.state_factor)

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


def _file_args(doc: PlanDocument, profile: Profile | None, source: str, path: Path) -> dict[str, Any] | None:
    """The arguments the plan (else its profile) gives model ``source``; None when it names another."""
    raw = doc.meta.get("model")
    if raw is None and profile is not None:
        raw = profile.extra.get("model_spec")
    if isinstance(raw, dict) and raw.get("source") == source:
        try:
            return ModelSpec.from_json(raw, "the plan's model", trust=True).args
        except ModelSpecError as exc:
            raise PlanError(f"{path}: {exc}") from None
    return None


def _model(doc: PlanDocument, profile: Profile | None, override: ModelSpec | None, trust: bool,
           path: Path) -> ModelSpec | None:  # fmt: skip
    if override is not None:
        # Named without arguments, the model the file names keeps the file's arguments.
        args = None if override.args else _file_args(doc, profile, override.source, path)
        return dataclasses.replace(override, args=args) if args else override
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


def _read_document(path: Path) -> PlanDocument:
    """The plan file, read bounded, parsed and checked once; errors name the file."""
    obj = read_json(path, "plan", PlanError)
    try:
        doc = _parse_document(obj)
        validate_plan(doc.plan)
    except PlanError as exc:
        raise PlanError(f"{path}: {exc}") from None
    return doc


def load_plan_file(path: str | os.PathLike[str], *, profile: str | os.PathLike[str] | None = None,
                   state_factor: float | None = None, model: ModelSpec | None = None,
                   trust_model_code: bool = False, require_profile: bool = False,
                   allow_missing_profile: bool = False, allow_deadlock: bool = False) -> LoadedPlan:  # fmt: skip
    """Load ``path`` and resolve its profile, state factor and model: the one gate every plan file passes.

    ``profile`` / ``state_factor`` / ``model`` are the user's overrides
    (flags); a model the user names is trusted, and named without arguments
    (no ``--arg``) it keeps the arguments the plan (else its profile) gives
    that same model. ``require_profile`` makes a
    plan without a profile an error. A profile the plan names that is not a
    readable file is an error too, unless the user named the model (``model``)
    or the caller needs no profile (``allow_missing_profile``): then the plan
    loads without one and :attr:`LoadedPlan.notes` says so. The plan is
    checked once (:func:`~umsearch.core.plan_rules.validate_plan`), against
    the profile when there is one, and refused when it deadlocks (unless
    ``allow_deadlock``); every error names the file.
    """
    plan_path = Path(path)
    doc = _read_document(plan_path)
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
