"""Checks made before a plan runs: a plan that cannot run is refused with the reason.

Whether a plan deadlocks is a question about its action lists alone
(:func:`umsearch.core.deps.find_deadlock`): no profile, no durations, no
simulation. Whether it fits its profile (layer count, the I/W split its
actions use) is :meth:`umsearch.core.cost.CostModel.check`'s, asked by the
plan loader. The launching process runs :func:`preflight` before it starts
anything; every rank runs :func:`rank_preflight` on the model it has built
anyway (layer count, ``make_batch``, deadlock) before it talks to a peer, so a
plan started straight with torchrun is refused just the same.

:func:`check_measured_on` compares a run with the measurement behind its
prediction: another precision is refused, another device type said plainly
(then a gap between predicted and measured is the devices', not the model's).

:func:`memory_refusal` compares every process's predicted peak memory
(docs/model.md section 5) with what its device holds: a pure function of
byte counts, so ``umsearch run`` refuses a plan that cannot fit before it
starts anything (``--force-memory`` runs it anyway).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from umsearch.core.cost import CostModel
from umsearch.core.deps import check_deadlock
from umsearch.core.plan import Plan
from umsearch.core.profile import Profile, profile_precision
from umsearch.core.units import format_bytes
from umsearch.errors import PlanError
from umsearch.runtime.model_source import ModelFactory, ModelLike


def check_layers(plan: Plan, num_layers: int, what: str = "the model") -> None:
    """Raise PlanError unless the (checked) ``plan``'s stages tile exactly ``num_layers`` layers of ``what``."""
    if plan.num_layers != num_layers:
        raise PlanError(
            f"the plan covers layers [0, {plan.num_layers}) but {what} has {num_layers} layers; the last stage "
            f"must end at layer {num_layers} (search again with a profile of this model)"
        )


def check_batch(plan: Plan, model: ModelLike) -> None:
    """Raise PlanError unless ``model.make_batch(B)`` gives ``B`` samples on dim 0."""
    B = plan.global_batch
    inputs, targets = model.make_batch(B, torch.Generator().manual_seed(0))
    for what, t in (("inputs", inputs), ("targets", targets)):
        if not isinstance(t, torch.Tensor) or t.dim() == 0 or t.shape[0] != B:
            got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise PlanError(
                f"the model's make_batch({B}) returns {what} of shape {got}, not {B} samples on dim 0; "
                "fix make_batch so that it returns global_batch samples"
            )


def check_model(plan: Plan, model: ModelLike) -> None:
    """Raise PlanError when ``plan`` does not fit ``model``'s layers or batches."""
    check_layers(plan, len(model.layers))
    check_batch(plan, model)


def count_layers(factory: ModelFactory) -> int:
    """How many layers ``factory`` builds, cheaply where possible.

    Built on the ``meta`` device, modules allocate and initialise no weights, so
    counting the layers of a large model costs next to nothing; a builder that
    cannot run on ``meta`` (it reads tensor values, loads a file) is built for real.
    """
    try:
        with torch.device("meta"):
            return len(factory().layers)
    except Exception:  # noqa: BLE001 - any failure on meta: fall back to the real build below
        pass
    return len(factory().layers)


def preflight(plan: Plan, factory: ModelFactory | None = None, cost: CostModel | None = None) -> None:
    """The launching process's checks on a checked plan (:func:`umsearch.core.plan_rules.validate_plan` or the
    plan loader has run; neither is repeated here): no deadlock, the profile's layers and I/W split (``cost``), and
    the model's layer count (``factory``, built on ``meta``). Without ``factory`` no model code runs."""
    check_deadlock(plan)
    if cost is not None:
        cost.check(plan)
    if factory is not None:
        check_layers(plan, count_layers(factory))


def rank_preflight(plan: Plan, model: ModelLike) -> None:
    """A rank's checks of a checked plan on the model it built, before it talks to any peer."""
    check_model(plan, model)
    check_deadlock(plan)


# ---------------------------------------------------------------------------------------------------------------------
# Where and in which precision the profile was measured, against the run


DEVICE_TYPES = ("cpu", "cuda")
"""Device types a profile's ``device`` text may start with (``cuda: NVIDIA H200``, ``cpu: ...``)."""


@dataclass(frozen=True, kw_only=True)
class MeasuredOn:
    """How a run compares with the measurement behind its plan's prediction."""

    precision: str | None
    """The precision the run uses: the one asked for, else the profile's; None (fp32) when neither says."""
    warnings: tuple[str, ...]
    """What to tell the user (device type differs, precision unknown); a device the profile's text does not
    name (a hand-written profile) is not guessed at."""
    device_differs: bool
    """The profile was measured on another device type: predicted vs measured compares devices."""


def profile_device_type(profile: Profile) -> str | None:
    """``cpu`` or ``cuda`` from the profile's free-text ``device``; None when it does not say."""
    head = profile.device.split(":", 1)[0].strip().lower()
    return head if head in DEVICE_TYPES else None


def check_measured_on(profile: Profile | None, *, device_type: str, precision: str | None) -> MeasuredOn:
    """Compare a run (``device_type`` ``cpu``/``cuda``, ``precision`` asked for or None) with ``profile``.

    A precision other than the profile's is refused (:class:`PlanError` with the fix): every
    prediction would be for another arithmetic. A profile measured on another device type is said
    plainly, as is a profile that does not record its precision; both still run. ``run``,
    ``validate``, ``calibrate`` and ``tune`` call this before they start anything.
    """
    if profile is None:
        return MeasuredOn(precision=precision, warnings=(), device_differs=False)
    warnings = []
    measured = profile_precision(profile)
    used: str | None = measured
    if measured is None:
        used = precision
        warnings.append(f"the plan's profile does not record its precision (measured before the field existed; its "
                        f"dtype says {profile.dtype!r}); this run uses {used or 'fp32'}: if that is not what was "
                        f"measured, profile again with umsearch profile ... --dtype {used or 'fp32'}")  # fmt: skip
    elif precision is not None and precision != measured:
        raise PlanError(f"the plan's profile was measured in {measured} but this run asks for --dtype {precision}: "
                        f"every prediction would be for another precision; run with --dtype {measured} (or without "
                        f"--dtype), or profile again with umsearch profile ... --dtype {precision} and search again")  # fmt: skip
    where = profile_device_type(profile)
    differs = where is not None and where != device_type
    if differs:
        backend = "nccl" if where == "cuda" else "gloo"
        warnings.append(f"the plan's profile was measured on {where} ({profile.device}) but this run uses "
                        f"{device_type}: measured times will differ from the prediction because the devices differ, "
                        f"not because the model is wrong; profile on this device (umsearch profile ... --device "
                        f"{device_type}) and search again, or run on {where} (--backend {backend})")  # fmt: skip
    return MeasuredOn(precision=used, warnings=tuple(warnings), device_differs=differs)


def backend_device_type(backend: str) -> str:
    """The device type a run's backend uses: ``cuda`` for NCCL, ``cpu`` for gloo."""
    return "cuda" if backend == "nccl" else "cpu"


# ---------------------------------------------------------------------------------------------------------------------
# Predicted memory against the devices'


@dataclass(frozen=True, kw_only=True)
class DeviceMemory:
    """What the processes on one device may fill."""

    name: str
    """How the message names it: ``cuda:1 (NVIDIA H100 80GB HBM3)``, ``this host's available memory``.
    Processes whose devices have the same name share it (CPU ranks share the host)."""
    bytes: float
    """A GPU's total memory; the host's available memory."""


def _ranks_text(ranks: Sequence[int]) -> str:
    ordered = sorted(set(ranks))
    return f"rank {ordered[0]}" if len(ordered) == 1 else "ranks " + ", ".join(map(str, ordered))


def memory_refusal(peaks: Sequence[float], devices: Sequence[DeviceMemory],
                   ranks: Sequence[int] | None = None) -> str | None:  # fmt: skip
    """Why the plan's processes do not fit their devices' memory, in one line; None when they fit.

    ``peaks[i]`` is process ``i``'s predicted peak (docs/model.md section 5), ``devices[i]`` its device and
    ``ranks[i]`` its pipeline rank (default ``i``; data-parallel copies of a rank repeat it). First the
    largest single peak above its device's memory is named; then processes sharing a device (by name:
    CPU ranks on one host) must fit together.
    """
    if len(peaks) != len(devices) or (ranks is not None and len(ranks) != len(peaks)):
        raise ValueError(f"{len(peaks)} peaks, {len(devices)} devices and {len(ranks or peaks)} ranks must match")
    rank_of = list(ranks) if ranks is not None else list(range(len(peaks)))
    over = [(p - d.bytes, i) for i, (p, d) in enumerate(zip(peaks, devices, strict=True)) if p > d.bytes]
    if over:
        _, i = max(over)
        return (f"rank {rank_of[i]} is predicted to peak at {format_bytes(peaks[i])} (docs/model.md section 5) but "
                f"{devices[i].name} has {format_bytes(devices[i].bytes)}")  # fmt: skip
    shared: dict[str, list[int]] = {}
    for i, d in enumerate(devices):
        shared.setdefault(d.name, []).append(i)
    for name, members in shared.items():
        total = sum(peaks[i] for i in members)
        have = devices[members[0]].bytes
        if len(members) > 1 and total > have:
            top = max(members, key=lambda i: peaks[i])
            return (f"{_ranks_text([rank_of[i] for i in members])} ({len(members)} processes) share {name}: "
                    f"together predicted to peak at {format_bytes(total)} (docs/model.md section 5; rank "
                    f"{rank_of[top]} the most, {format_bytes(peaks[top])}) but it has {format_bytes(have)}")  # fmt: skip
    return None


def check_memory(peaks: Sequence[float], devices: Sequence[DeviceMemory], ranks: Sequence[int] | None = None) -> None:
    """Raise :class:`PlanError` with :func:`memory_refusal`'s line and the ways out, unless the plan fits."""
    why = memory_refusal(peaks, devices, ranks)
    if why is not None:
        raise PlanError(f"{why}: the run would run out of memory; search again with --memory-limit at or below the "
                        "device's memory, or pass --force-memory to run anyway")  # fmt: skip
