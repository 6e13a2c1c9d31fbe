"""The plan (``umsearch.core.plan/1``): which layers on which stage, and how each stage splits the batch.

MODEL.md section 2. :func:`validate_plan` is the single gate every plan passes
before it is simulated, searched from, written or executed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from umsearch.core.errors import PlanError
from umsearch.core.jsonio import read_json, write_json

SCHEMA = "umsearch.core.plan/1"


@dataclass(frozen=True, kw_only=True)
class StagePlan:
    """One pipeline stage."""

    layers: tuple[int, int]
    """Half-open layer range ``[lo, hi)``."""
    forward: tuple[int, ...]
    """Forward microbatch sizes, in sample order; they sum to the global batch."""
    backward: tuple[int, ...]
    """Backward microbatch sizes, in sample order; equal to ``forward`` unless ``recompute``."""
    warmup: int
    """Forward microbatches allowed ahead of the first backward (MODEL.md section 3)."""
    recompute: bool = False
    """Whether this stage keeps only its inputs and recomputes the forward in backward."""

    @property
    def lo(self) -> int:
        return self.layers[0]

    @property
    def hi(self) -> int:
        return self.layers[1]

    def to_json(self) -> dict[str, Any]:
        return {
            "layers": list(self.layers),
            "forward": list(self.forward),
            "backward": list(self.backward),
            "warmup": self.warmup,
            "recompute": self.recompute,
        }


@dataclass(frozen=True, kw_only=True)
class Plan:
    """A full pipeline plan for one global batch."""

    global_batch: int
    """``B``: samples per iteration."""
    stages: tuple[StagePlan, ...]
    """Stages in pipeline order."""
    predicted: dict[str, Any] | None = None
    """Simulator prediction: ``iteration_ms`` and ``peak_memory_bytes`` (per stage), at least."""
    profile: str | None = None
    """Path of the profile this plan was made for (relative to the plan file or absolute)."""
    meta: dict[str, Any] = field(default_factory=dict, compare=False)
    """Everything else recorded with the plan: profile sha256, model spec, search space, seed."""

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    def with_predicted(self, predicted: dict[str, Any]) -> Plan:
        return replace(self, predicted=predicted)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"schema": SCHEMA, "global_batch": self.global_batch}
        if self.profile is not None:
            out["profile"] = self.profile
        out["stages"] = [s.to_json() for s in self.stages]
        if self.predicted is not None:
            out["predicted"] = self.predicted
        for key, value in self.meta.items():
            out.setdefault(key, value)
        return out


def _int_list(raw: Any, where: str) -> tuple[int, ...]:
    if not isinstance(raw, list) or not raw:
        raise PlanError(f"plan field {where} must be a non-empty list of sizes, got {raw!r}")
    for i, v in enumerate(raw):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise PlanError(f"plan field {where}[{i}] must be a positive integer, got {v!r}")
    return tuple(raw)


def _stage(raw: Any, s: int) -> StagePlan:
    where = f"stages[{s}]"
    if not isinstance(raw, dict):
        raise PlanError(f"plan field {where} must be an object, got {raw!r}")
    for key in ("layers", "forward", "warmup"):
        if key not in raw:
            raise PlanError(f"plan field {where} is missing {key!r}; see MODEL.md section 2")
    layers = raw["layers"]
    if (
        not isinstance(layers, list)
        or len(layers) != 2
        or any(isinstance(v, bool) or not isinstance(v, int) for v in layers)
    ):
        raise PlanError(f"plan field {where}.layers must be [lo, hi] integers, got {layers!r}")
    recompute = raw.get("recompute", False)
    if not isinstance(recompute, bool):
        raise PlanError(f"plan field {where}.recompute must be true or false, got {recompute!r}")
    forward = _int_list(raw["forward"], f"{where}.forward")
    backward = _int_list(raw["backward"], f"{where}.backward") if "backward" in raw else forward
    warmup = raw["warmup"]
    if isinstance(warmup, bool) or not isinstance(warmup, int):
        raise PlanError(f"plan field {where}.warmup must be an integer >= 1, got {warmup!r}")
    return StagePlan(
        layers=(layers[0], layers[1]),
        forward=forward,
        backward=backward,
        warmup=warmup,
        recompute=recompute,
    )


def validate_plan(plan: Plan, num_layers: int | None = None) -> Plan:
    """Check the MODEL.md section 2 rules; return the plan unchanged or raise :class:`PlanError`.

    ``num_layers`` (from the profile or the model) is checked when given.
    """
    B = plan.global_batch
    if isinstance(B, bool) or not isinstance(B, int) or B < 1:
        raise PlanError(f"plan field global_batch must be a positive integer, got {B!r}")
    if not plan.stages:
        raise PlanError("plan has no stages; give at least one in 'stages'")
    expect_lo = 0
    for s, st in enumerate(plan.stages):
        lo, hi = st.layers
        if lo != expect_lo:
            raise PlanError(
                f"plan stages[{s}].layers starts at {lo} but the previous stage ends at {expect_lo}; "
                "stages must tile the layers in order"
            )
        if hi <= lo:
            raise PlanError(f"plan stages[{s}].layers = [{lo}, {hi}] is empty; every stage needs a layer")
        expect_lo = hi
        for name, seq in (("forward", st.forward), ("backward", st.backward)):
            if any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in seq):
                raise PlanError(f"plan stages[{s}].{name} = {list(seq)} has a size below 1")
            if sum(seq) != B:
                raise PlanError(
                    f"plan stages[{s}].{name} sums to {sum(seq)} but global_batch is {B}; "
                    "the microbatches of every stage must cover the batch exactly"
                )
        if st.warmup < 1:
            raise PlanError(f"plan stages[{s}].warmup = {st.warmup}; it must be >= 1")
        if not st.recompute and st.backward != st.forward:
            raise PlanError(
                f"plan stages[{s}].backward {list(st.backward)} differs from forward "
                f"{list(st.forward)} but the stage does not recompute; set recompute: true or "
                "make them equal (autograd back-propagates whole forward microbatches)"
            )
    if num_layers is not None and expect_lo != num_layers:
        raise PlanError(
            f"plan covers layers [0, {expect_lo}) but the model has {num_layers} layers; "
            "the last stage must end at the last layer"
        )
    return plan


def plan_from_json(obj: Any, num_layers: int | None = None) -> Plan:
    """Build and validate a :class:`Plan` from a decoded JSON object."""
    if not isinstance(obj, dict):
        raise PlanError(f"a plan must be a JSON object, got {type(obj).__name__}")
    if obj.get("schema") != SCHEMA:
        raise PlanError(f"unknown plan schema {obj.get('schema')!r}; this umsearch reads {SCHEMA!r}")
    if "global_batch" not in obj:
        raise PlanError("plan is missing 'global_batch'")
    stages_raw = obj.get("stages")
    if not isinstance(stages_raw, list):
        raise PlanError(f"plan field 'stages' must be a list, got {stages_raw!r}")
    profile = obj.get("profile")
    if profile is not None and not isinstance(profile, str):
        raise PlanError(f"plan field 'profile' must be a path string, got {profile!r}")
    predicted = obj.get("predicted")
    if predicted is not None and not isinstance(predicted, dict):
        raise PlanError(f"plan field 'predicted' must be an object, got {predicted!r}")
    plan = Plan(
        global_batch=obj["global_batch"],
        stages=tuple(_stage(raw, s) for s, raw in enumerate(stages_raw)),
        predicted=predicted,
        profile=profile,
        meta={
            k: v
            for k, v in obj.items()
            if k not in {"schema", "global_batch", "stages", "predicted", "profile"}
        },
    )
    return validate_plan(plan, num_layers)


def load_plan(path: str | os.PathLike[str], num_layers: int | None = None) -> Plan:
    """Read and validate a plan file; errors name the file."""
    obj = read_json(path, "plan", PlanError)
    try:
        return plan_from_json(obj, num_layers)
    except PlanError as exc:
        raise PlanError(f"{path}: {exc}") from None


def save_plan(plan: Plan, path: str | os.PathLike[str]) -> Path:
    """Validate and write ``plan`` atomically."""
    return write_json(path, validate_plan(plan).to_json())


def resolve_profile_path(plan: Plan, plan_path: str | os.PathLike[str]) -> Path | None:
    """The plan's profile path, relative paths taken from the plan file's directory."""
    if plan.profile is None:
        return None
    p = Path(plan.profile)
    if p.is_absolute():
        return p
    here = Path(plan_path).parent / p
    return here if here.exists() or not p.exists() else p


def equal_split(batch: int, count: int) -> tuple[int, ...]:
    """``count`` contiguous microbatches as equal as possible (larger ones first)."""
    if not 1 <= count <= batch:
        raise PlanError(f"cannot split a batch of {batch} into {count} microbatches")
    q, r = divmod(batch, count)
    return tuple(q + 1 if i < r else q for i in range(count))


def uniform_plan(
    cuts: list[int] | tuple[int, ...], batch: int, microbatches: int, schedule: str
) -> Plan:
    """Equal-microbatch plan on the given cuts: ``schedule`` is ``gpipe`` or ``1f1b``.

    ``cuts`` are the stage boundaries ``[0, c1, ..., L]``.
    """
    split = equal_split(batch, microbatches)
    n = len(cuts) - 1
    stages = []
    for s in range(n):
        if schedule == "gpipe":
            warmup = len(split)
        elif schedule == "1f1b":
            warmup = n - s
        else:
            raise PlanError(f"unknown schedule {schedule!r}; use 'gpipe' or '1f1b'")
        stages.append(
            StagePlan(layers=(cuts[s], cuts[s + 1]), forward=split, backward=split, warmup=warmup)
        )
    return Plan(global_batch=batch, stages=tuple(stages))
