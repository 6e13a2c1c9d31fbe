"""The profile (``umsearch.profile/2``): what a model costs, layer by layer (docs/model.md section 1).

A :class:`Profile` is immutable and validated on construction from JSON;
:func:`load_profile` reads one and every rejection names the field, the bad
value and what to do about it. ``umsearch.profile/1`` files load unchanged
(they are profile/2 files without the optional fields); everything written is
profile/2.

Beyond the contract a profile may record how it was measured: per value the
spread (``*_iqr_ms``) and the raw medians before the monotone fit
(``*_raw_ms``), which layers were pooled, a quality report and the
calibration check. They are optional, kept on load and save, and never change
a prediction. A profile whose measurement was interrupted says so in
``partial`` (``{"reason": ...}``; absent in a whole one, and in every profile
from before the field): :func:`check_not_partial` refuses it unless allowed.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from umsearch.core.field_checks import (
    MAX_BYTES,
    check_keys,
    integer,
    mapping,
    number,
    required,
    text,
)
from umsearch.core.links import link_numbers
from umsearch.errors import ProfileError, UmsearchError
from umsearch.storage.jsonio import read_json, write_json

SCHEMA = "umsearch.profile/2"
SCHEMAS = ("umsearch.profile/1", SCHEMA)
"""Schemas :func:`load_profile` reads."""

QUANTITIES = ("fwd", "bwd", "bwd_input", "bwd_weight")
"""The per-size time quantities of a layer; ``{q}_ms`` is the value, ``{q}_iqr_ms`` its spread
and ``{q}_raw_ms`` the medians before the monotone fit."""

EXTRA_KEYS = frozenset({
    "model_spec", "largest_size_that_fit", "requested_sizes", "calibration", "quality", "pooled",
    "measurement", "precision", "link_source", "partial",
})  # fmt: skip
"""Top-level fields beyond the contract that profiles may carry (how they were measured)."""

PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
"""Training precisions a profile's ``precision`` field may name (MODEL's ``dtype`` stays free text)."""


def profile_precision(profile: Profile) -> str | None:
    """The precision the profile was measured in (one of :data:`PRECISIONS`); None when it does not say
    (profiles older than the field). A value outside :data:`PRECISIONS` raises :class:`ProfileError`."""
    value = profile.extra.get("precision")
    if value is None:
        return None
    if value not in PRECISIONS:
        raise ProfileError(f"profile field 'precision' is {value!r}; it takes one of {', '.join(PRECISIONS)} "
                           "(profile again with umsearch profile --dtype ...)")  # fmt: skip
    return str(value)

_SEE = "docs/model.md section 1"


def profile_partial(profile: Profile) -> str | None:
    """Why the profile is partial (its measurement was interrupted: ``{"reason": ..., ...}`` in the JSON),
    or None for a whole one (every profile from before the field)."""
    raw = profile.extra.get("partial")
    return None if raw is None else str(raw["reason"])


def check_not_partial(profile: Profile, allow: bool, where: str = "the profile", *,
                      flag: str | None = "--allow-partial") -> None:  # fmt: skip
    """Refuse a partial profile (:func:`profile_partial`) unless ``allow`` (``flag``; None: the command has
    no such flag, so the fix is only to profile again)."""
    why = profile_partial(profile)
    if why is not None and not allow:
        anyway = f", or pass {flag} to use it anyway" if flag else ""
        raise ProfileError(f"{where} is partial: {why}; its layer times rest on fewer rounds than asked for. "
                           f"Profile again and let it finish{anyway}")  # fmt: skip


def _partial(raw: Any) -> dict[str, Any] | None:
    """The ``partial`` field: absent or null (a whole profile), or an object with a text ``reason``."""
    if raw is None:
        return None
    obj = mapping(raw, "partial", ProfileError)
    text(required(obj, "reason", "partial.", ProfileError, "umsearch/measure/profiler.py"), "partial.reason",
         ProfileError)  # fmt: skip
    return obj


@dataclass(frozen=True, kw_only=True)
class Link:
    """Point-to-point link between any two ranks."""

    latency_ms: float
    """Fixed cost of one message, in milliseconds."""
    bandwidth_gb_per_s: float
    """Throughput in GB/s, 1 GB = 1e9 bytes."""

    def to_json(self) -> dict[str, float]:
        return {"latency_ms": self.latency_ms, "bandwidth_gb_per_s": self.bandwidth_gb_per_s}


def link_from_json(raw: Any, where: str, error: type[UmsearchError], see: str) -> Link:
    """A ``{latency_ms, bandwidth_gb_per_s}`` object (the profile's ``link``, a cluster's ``intra`` /
    ``inter``), within :func:`umsearch.core.links.link_numbers`'s physical bounds; ``error`` names
    ``where``, the value, the bounds and the fix."""
    obj = mapping(raw, where, error)
    check_keys(obj, {"latency_ms", "bandwidth_gb_per_s"}, f"{where}.", error)
    latency, bandwidth = link_numbers(required(obj, "latency_ms", f"{where}.", error, see),
                                      required(obj, "bandwidth_gb_per_s", f"{where}.", error, see), where, error)  # fmt: skip
    return Link(latency_ms=latency, bandwidth_gb_per_s=bandwidth)


@dataclass(frozen=True, kw_only=True)
class RuntimeCosts:
    """The runtime's own fixed costs (docs/model.md sections 4 and 7); zero until calibrated."""

    op_overhead_ms: float = 0.0
    """Time the runtime adds to every compute action beyond its layers' own time."""
    message_overhead_ms: float = 0.0
    """Compute-timeline time of one cross-rank message, charged to its sender and to every action
    that needs it."""
    message_overhead_ms_per_mib: float = 0.0
    """Added to ``message_overhead_ms`` per MiB (2**20 bytes) of the message, wherever that is charged
    (docs/model.md (version 2.1))."""
    stage_scale: tuple[tuple[int, float], ...] = ()
    """Strictly ascending ``(k, s)`` points: the layer times of a stage of k layers are multiplied by
    s(k), linear between points and constant beyond the ends; empty: s = 1 (docs/model.md (version 2.1))."""
    ranges: tuple[tuple[int, int, float], ...] = ()
    """Measured ``(lo, hi, scale)`` of exact stage ranges ``[lo, hi)``; they win over
    :attr:`stage_scale` (docs/model.md (version 2.1))."""
    calibration: dict[str, Any] | None = field(default=None, compare=False)
    """How the values were fitted (probe plans, residual); None when never calibrated."""

    def to_json(self) -> dict[str, Any]:
        """The ``runtime`` object; the v2.1 fields only where set, so a v2 profile stays v2."""
        out: dict[str, Any] = {"op_overhead_ms": self.op_overhead_ms, "message_overhead_ms": self.message_overhead_ms}
        if self.message_overhead_ms_per_mib:
            out["message_overhead_ms_per_mib"] = self.message_overhead_ms_per_mib
        if self.stage_scale:
            out["stage_scale"] = [[k, s] for k, s in self.stage_scale]
        if self.ranges:
            out["ranges"] = [{"lo": lo, "hi": hi, "scale": sc} for lo, hi, sc in self.ranges]
        if self.calibration is not None:
            out["calibration"] = self.calibration
        return out


@dataclass(frozen=True, kw_only=True)
class LayerProfile:
    """One layer of the model, measured at every size of the profile."""

    name: str
    """Human-readable layer name."""
    fwd_ms: tuple[float, ...]
    """Forward time per measured microbatch size, in ms."""
    bwd_ms: tuple[float, ...]
    """Full backward time per measured size, in ms."""
    out_bytes: float
    """Bytes per sample of the layer's output (and of its gradient)."""
    stash_bytes: float
    """Bytes per sample autograd keeps from this layer's forward until its backward."""
    param_bytes: float
    """Bytes of the layer's parameters."""
    boundary_shared_bytes: float = 0.0
    """Bytes per sample that this layer and the one before both save (one storage: the earlier layer's saved
    output is this layer's saved input); a stage running both keeps them once (docs/model.md 5, version 2.3).
    0 for the first layer, and where the profile does not say (older profiles)."""
    input_saved_bytes: float | None = None
    """Bytes per sample of its input that the layer itself saves (what a recomputing stage's kept input and
    the rebuilt graph share, docs/model.md 5); None (read as 0) where the profile does not say."""
    weight_stash_bytes: float | None = None
    """Bytes per sample of its saved tensors that the layer, run alone, still holds after its input-gradient
    half ``I`` (what ``W`` needs, docs/model.md 5); None (read as all of ``stash_bytes``: ``I`` frees
    nothing, as before version 2.3) where the profile does not say."""
    stash_fixed_bytes: float = 0.0
    """Bytes the layer saves per microbatch whatever its size (a mask, position ids, a loss's scalars), beyond
    ``stash_bytes`` per sample; held until the stage's last backward (``I`` frees none of it, docs/model.md 5,
    version 2.3). 0 where the profile does not say (older profiles)."""
    bwd_input_ms: tuple[float, ...] | None = None
    """Input-gradient part of the backward per size (needed by plans using ``I``/``W``)."""
    bwd_weight_ms: tuple[float, ...] | None = None
    """Weight-gradient part of the backward per size."""
    spread_ms: dict[str, tuple[float, ...]] = field(default_factory=dict, compare=False)
    """Interquartile range of each measured quantity per size (``fwd``, ``bwd``, ...), when recorded."""
    raw_ms: dict[str, tuple[float, ...]] = field(default_factory=dict, compare=False)
    """Medians before the monotone fit, per quantity, when recorded."""

    @property
    def has_split(self) -> bool:
        """Whether the layer's backward can be split into ``I`` and ``W`` parts."""
        return self.bwd_input_ms is not None and self.bwd_weight_ms is not None

    def times(self, quantity: str) -> tuple[float, ...] | None:
        """``fwd_ms``, ``bwd_ms``, ``bwd_input_ms`` or ``bwd_weight_ms`` by quantity name."""
        value: tuple[float, ...] | None = getattr(self, f"{quantity}_ms")
        return value

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name}
        for q in QUANTITIES:
            values = self.times(q)
            if values is not None:
                out[f"{q}_ms"] = list(values)
        for q, values in self.spread_ms.items():
            out[f"{q}_iqr_ms"] = list(values)
        for q, values in self.raw_ms.items():
            out[f"{q}_raw_ms"] = list(values)
        out.update(out_bytes=self.out_bytes, stash_bytes=self.stash_bytes, param_bytes=self.param_bytes)
        if self.boundary_shared_bytes:
            out["boundary_shared_bytes"] = self.boundary_shared_bytes
        if self.input_saved_bytes is not None:
            out["input_saved_bytes"] = self.input_saved_bytes
        if self.weight_stash_bytes is not None:
            out["weight_stash_bytes"] = self.weight_stash_bytes
        if self.stash_fixed_bytes:
            out["stash_fixed_bytes"] = self.stash_fixed_bytes
        return out


@dataclass(frozen=True, kw_only=True)
class TiedWeight:
    """One weight that several layers share (tied input and output embeddings): each of them counts it in its
    ``param_bytes``, a rank holding several of them holds it once (docs/model.md 5, version 2.3)."""

    layers: tuple[int, ...]
    """The layers that hold it, ascending, at least two."""
    bytes: float
    """Its size in bytes."""

    def to_json(self) -> dict[str, Any]:
        return {"layers": list(self.layers), "bytes": self.bytes}


@dataclass(frozen=True, kw_only=True)
class Profile:
    """A measured model: ordered layers, sizes, input size, link and runtime costs."""

    model: str
    """What was measured (zoo name and arguments, or an import path)."""
    device: str
    """Where it was measured, honestly (e.g. ``cpu: 1 thread, Xeon``)."""
    dtype: str
    """Compute dtype of the measurement."""
    microbatch_sizes: tuple[int, ...]
    """Ascending measured sizes, starting at 1, at least two."""
    input_bytes: float
    """Bytes of one input sample fed to layer 0."""
    layers: tuple[LayerProfile, ...]
    """The layers ``0..L-1``."""
    link: Link
    """Link between any two ranks."""
    runtime: RuntimeCosts = field(default_factory=RuntimeCosts)
    """The runtime's fixed costs per action and per message."""
    tied_weights: tuple[TiedWeight, ...] = ()
    """Weights shared by several layers (version 2.3); empty where the profile does not say (older profiles:
    every layer's parameters counted on its own)."""
    extra: dict[str, Any] = field(default_factory=dict, compare=False)
    """Measurement records beyond the contract (:data:`EXTRA_KEYS`); kept on save."""

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def layers_without_split(self, lo: int, hi: int) -> list[int]:
        """Layers of ``[lo, hi)`` whose backward has no I/W split."""
        return [i for i in range(lo, hi) if not self.layers[i].has_split]

    def to_json(self) -> dict[str, Any]:
        """The ``umsearch.profile/2`` object, measurement records included."""
        out: dict[str, Any] = {
            "schema": SCHEMA, "model": self.model, "device": self.device, "dtype": self.dtype,
            "microbatch_sizes": list(self.microbatch_sizes), "input_bytes": self.input_bytes,
            "layers": [lay.to_json() for lay in self.layers],
            "link": self.link.to_json(),
        }  # fmt: skip
        rt = self.runtime
        if rt != RuntimeCosts() or rt.calibration is not None:
            out["runtime"] = rt.to_json()
        if self.tied_weights:
            out["tied_weights"] = [t.to_json() for t in self.tied_weights]
        for key, value in self.extra.items():
            out.setdefault(key, value)
        return out


def _fail(message: str) -> ProfileError:
    return ProfileError(f"profile {message}")


def _sizes(raw: Any) -> tuple[int, ...]:
    if not isinstance(raw, list) or len(raw) < 2:
        raise ProfileError(
            f"profile field 'microbatch_sizes' must list at least two sizes (got {raw!r}): times "
            "above the largest size are extrapolated from the last two; measure e.g. [1, 2, 4, 8]"
        )
    sizes = tuple(integer(v, f"microbatch_sizes[{i}]", ProfileError, lo=1) for i, v in enumerate(raw))
    if sizes[0] != 1:
        raise ProfileError(f"profile field 'microbatch_sizes' must start with 1, got {list(sizes)}; measure size 1 too")
    if any(b <= a for a, b in zip(sizes, sizes[1:], strict=False)):
        raise ProfileError(f"profile field 'microbatch_sizes' must be strictly ascending, got {list(sizes)}")
    return sizes


def _times(raw: Any, where: str, n: int) -> tuple[float, ...]:
    if not isinstance(raw, list):
        raise ProfileError(f"profile field {where} must be a list of times in ms, got {raw!r}")
    if len(raw) != n:
        raise ProfileError(
            f"profile field {where} has {len(raw)} values but 'microbatch_sizes' has {n}; "
            "give one time per measured size"
        )
    return tuple(number(v, f"{where}[{i}]", ProfileError) for i, v in enumerate(raw))


_LAYER_KEYS = frozenset({"name", "out_bytes", "stash_bytes", "param_bytes", "boundary_shared_bytes",
                         "input_saved_bytes", "weight_stash_bytes", "stash_fixed_bytes"}
                        | {f"{q}_{s}" for q in QUANTITIES for s in ("ms", "iqr_ms", "raw_ms")})  # fmt: skip


def _layer(raw: Any, i: int, n: int) -> LayerProfile:
    where = f"layers[{i}]."
    obj = mapping(raw, f"layers[{i}]", ProfileError)
    check_keys(obj, _LAYER_KEYS, where, ProfileError)

    def get(key: str) -> Any:
        return required(obj, key, where, ProfileError, _SEE)

    def series(key: str) -> tuple[float, ...] | None:
        return _times(obj[key], f"{where}{key}", n) if key in obj else None

    split_in, split_w = series("bwd_input_ms"), series("bwd_weight_ms")
    if (split_in is None) != (split_w is None):
        raise ProfileError(f"profile layer {i} gives only one of bwd_input_ms and bwd_weight_ms; give both or neither")
    byte = {k: number(get(k), f"{where}{k}", ProfileError, limit=MAX_BYTES)
            for k in ("out_bytes", "stash_bytes", "param_bytes")}  # fmt: skip
    optional = {k: number(obj[k], f"{where}{k}", ProfileError, limit=MAX_BYTES)
                for k in ("boundary_shared_bytes", "input_saved_bytes", "weight_stash_bytes") if k in obj}  # fmt: skip
    for k, value in optional.items():
        if value > byte["stash_bytes"]:
            raise ProfileError(f"profile {where}{k} = {value:g} is more than the layer's stash_bytes "
                               f"{byte['stash_bytes']:g}: a layer shares or keeps only what it saves; fix the "
                               "profile or measure it again")  # fmt: skip
    if i == 0 and optional.get("boundary_shared_bytes"):
        raise ProfileError(f"profile {where}boundary_shared_bytes must be 0 for the first layer (no layer before it)")
    fixed = number(obj.get("stash_fixed_bytes", 0.0), f"{where}stash_fixed_bytes", ProfileError, limit=MAX_BYTES)
    return LayerProfile(
        name=text(get("name"), f"{where}name", ProfileError),
        fwd_ms=_times(get("fwd_ms"), f"{where}fwd_ms", n),
        bwd_ms=_times(get("bwd_ms"), f"{where}bwd_ms", n),
        bwd_input_ms=split_in, bwd_weight_ms=split_w, **byte, **optional, stash_fixed_bytes=fixed,
        spread_ms={q: v for q in QUANTITIES if (v := series(f"{q}_iqr_ms")) is not None},
        raw_ms={q: v for q in QUANTITIES if (v := series(f"{q}_raw_ms")) is not None},
    )  # fmt: skip


_RUNTIME_KEYS = frozenset({"op_overhead_ms", "message_overhead_ms", "message_overhead_ms_per_mib", "stage_scale",
                           "ranges", "calibration"})  # fmt: skip


def _stage_scale(raw: Any) -> tuple[tuple[int, float], ...]:
    if not isinstance(raw, list) or not raw:
        raise ProfileError(f"profile field runtime.stage_scale must be a non-empty list of [k, s] pairs, got {raw!r}; "
                           "e.g. [[1, 1.0], [8, 0.9]]")  # fmt: skip
    points: list[tuple[int, float]] = []
    for i, pair in enumerate(raw):
        where = f"runtime.stage_scale[{i}]"
        if not isinstance(pair, list) or len(pair) != 2:
            raise ProfileError(f"profile field {where} must be a [k, s] pair, got {pair!r}")
        k = integer(pair[0], f"{where}[0]", ProfileError, lo=1)
        s = number(pair[1], f"{where}[1]", ProfileError, positive=True)
        if points and k <= points[-1][0]:
            raise ProfileError(f"profile field {where} has k = {k} after k = {points[-1][0]}; "
                               "list the layer counts k strictly ascending")  # fmt: skip
        points.append((k, s))
    return tuple(points)


def _ranges(raw: Any, num_layers: int) -> tuple[tuple[int, int, float], ...]:
    if not isinstance(raw, list):
        raise ProfileError(f"profile field runtime.ranges must be a list of {{lo, hi, scale}}, got {raw!r}")
    seen: dict[tuple[int, int], int] = {}
    out: list[tuple[int, int, float]] = []
    for i, item in enumerate(raw):
        where = f"runtime.ranges[{i}]"
        obj = mapping(item, where, ProfileError)
        check_keys(obj, {"lo", "hi", "scale"}, f"{where}.", ProfileError)
        lo = integer(required(obj, "lo", f"{where}.", ProfileError, _SEE), f"{where}.lo", ProfileError)
        hi = integer(required(obj, "hi", f"{where}.", ProfileError, _SEE), f"{where}.hi", ProfileError)
        scale = number(required(obj, "scale", f"{where}.", ProfileError, _SEE), f"{where}.scale", ProfileError,
                       positive=True)  # fmt: skip
        if not lo < hi <= num_layers:
            raise ProfileError(f"profile field {where} = [{lo}, {hi}) is not a layer range of this {num_layers}-layer "
                               f"model; give 0 <= lo < hi <= {num_layers}")  # fmt: skip
        if (lo, hi) in seen:
            raise ProfileError(f"profile field {where} repeats the range [{lo}, {hi}) of runtime.ranges[{seen[lo, hi]}]; "
                               "keep one scale per range")  # fmt: skip
        seen[lo, hi] = i
        out.append((lo, hi, scale))
    return tuple(out)


def _runtime(raw: Any, num_layers: int) -> RuntimeCosts:
    obj = mapping(raw, "runtime", ProfileError)
    check_keys(obj, _RUNTIME_KEYS, "runtime.", ProfileError)
    calibration = obj.get("calibration")
    if calibration is not None:
        mapping(calibration, "runtime.calibration", ProfileError)
    return RuntimeCosts(
        op_overhead_ms=number(obj.get("op_overhead_ms", 0.0), "runtime.op_overhead_ms", ProfileError),
        message_overhead_ms=number(obj.get("message_overhead_ms", 0.0), "runtime.message_overhead_ms", ProfileError),
        message_overhead_ms_per_mib=number(obj.get("message_overhead_ms_per_mib", 0.0),
                                           "runtime.message_overhead_ms_per_mib", ProfileError),
        stage_scale=_stage_scale(obj["stage_scale"]) if "stage_scale" in obj else (),
        ranges=_ranges(obj["ranges"], num_layers) if "ranges" in obj else (),
        calibration=calibration,
    )  # fmt: skip


def _tied_weights(raw: Any, layers: tuple[LayerProfile, ...]) -> tuple[TiedWeight, ...]:
    """The ``tied_weights`` field: objects ``{layers, bytes}``, each naming two or more distinct layers, its
    bytes within the ``param_bytes`` of every layer it names (all ties of a layer together too)."""
    if not isinstance(raw, list):
        raise ProfileError(f"profile field tied_weights must be a list of {{layers, bytes}}, got {raw!r}")
    L = len(layers)
    out: list[TiedWeight] = []
    held = [0.0] * L
    for k, item in enumerate(raw):
        where = f"tied_weights[{k}]"
        obj = mapping(item, where, ProfileError)
        check_keys(obj, {"layers", "bytes"}, f"{where}.", ProfileError)
        names = required(obj, "layers", f"{where}.", ProfileError, _SEE)
        if not isinstance(names, list):
            raise ProfileError(f"profile field {where}.layers must be a list of layer indexes, got {names!r}")
        idx = tuple(sorted(integer(v, f"{where}.layers[{i}]", ProfileError, hi=L - 1) for i, v in enumerate(names)))
        if len(set(idx)) != len(idx) or len(idx) < 2:
            raise ProfileError(f"profile field {where}.layers must list two or more distinct layers, got {names!r}; "
                               "a weight held by one layer is not tied: leave it out")  # fmt: skip
        size = number(required(obj, "bytes", f"{where}.", ProfileError, _SEE), f"{where}.bytes", ProfileError,
                      limit=MAX_BYTES)  # fmt: skip
        for i in idx:
            held[i] += size
            if held[i] > layers[i].param_bytes:
                raise ProfileError(f"profile field {where}.bytes = {size:g} makes layer {i}'s tied weights "
                                   f"{held[i]:g} bytes, more than its param_bytes {layers[i].param_bytes:g}: a layer "
                                   "counts a tied weight in its own parameters; fix the profile or measure it again")  # fmt: skip
        out.append(TiedWeight(layers=idx, bytes=size))
    return tuple(out)


_CONTRACT_KEYS = frozenset({"schema", "model", "device", "dtype", "microbatch_sizes", "input_bytes", "layers",
                            "link", "runtime", "tied_weights"})  # fmt: skip


def profile_from_json(obj: Any) -> Profile:
    """Validate a decoded ``umsearch.profile/1`` or ``/2`` object and build the :class:`Profile`."""
    if not isinstance(obj, dict):
        raise ProfileError(f"a profile must be a JSON object, got {type(obj).__name__}")
    schema = obj.get("schema")
    if schema not in SCHEMAS:
        raise ProfileError(
            f"unknown profile schema {schema!r}; this umsearch reads {' and '.join(map(repr, SCHEMAS))} "
            "(re-run `umsearch profile` to produce one)"
        )
    check_keys(obj, _CONTRACT_KEYS | EXTRA_KEYS, "", ProfileError)

    def get(key: str, where: str = "", o: dict[str, Any] = obj) -> Any:
        return required(o, key, where, ProfileError, _SEE)

    sizes = _sizes(get("microbatch_sizes"))
    layers_raw = get("layers")
    if not isinstance(layers_raw, list) or not layers_raw:
        raise ProfileError(f"profile field 'layers' must be a non-empty list, got {layers_raw!r}")
    link = link_from_json(get("link"), "link", ProfileError, _SEE)
    layers = tuple(_layer(raw, i, len(sizes)) for i, raw in enumerate(layers_raw))
    return Profile(
        model=text(get("model"), "model", ProfileError),
        device=text(get("device"), "device", ProfileError),
        dtype=text(get("dtype"), "dtype", ProfileError),
        microbatch_sizes=sizes,
        input_bytes=number(get("input_bytes"), "input_bytes", ProfileError, limit=MAX_BYTES),
        layers=layers,
        link=link,
        runtime=_runtime(obj["runtime"], len(layers_raw)) if "runtime" in obj else RuntimeCosts(),
        tied_weights=_tied_weights(obj["tied_weights"], layers) if "tied_weights" in obj else (),
        extra={k: v for k, v in obj.items() if k in EXTRA_KEYS and not (k == "partial" and _partial(v) is None)},
    )


def load_profile(path: str | os.PathLike[str]) -> Profile:
    """Read and validate a profile file; errors name the file, the field and the value."""
    obj = read_json(path, "profile", ProfileError)
    try:
        return profile_from_json(obj)
    except ProfileError as exc:
        raise ProfileError(f"{path}: {exc}") from None


def save_profile(profile: Profile, path: str | os.PathLike[str]) -> Path:
    """Write ``profile`` atomically as ``umsearch.profile/2`` JSON."""
    return write_json(path, profile.to_json())


def file_sha256(path: str | os.PathLike[str]) -> str:
    """Hex sha256 of a file's bytes (plans record which profile they were searched on)."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()

