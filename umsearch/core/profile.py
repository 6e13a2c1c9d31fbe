"""The profile (``umsearch.core.profile/1``): what a model costs, layer by layer.

MODEL.md section 1. A :class:`Profile` is immutable and validated on
construction; :func:`load_profile` reads one from JSON and every rejection
names the field, the bad value and what to do about it.
"""

from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from umsearch.core.errors import ProfileError
from umsearch.core.jsonio import read_json, write_json

SCHEMA = "umsearch.core.profile/1"


@dataclass(frozen=True, kw_only=True)
class Link:
    """Point-to-point link between neighbouring stages."""

    latency_ms: float
    """Fixed cost of one message, in milliseconds."""
    bandwidth_gb_per_s: float
    """Throughput in GB/s, 1 GB = 1e9 bytes."""


@dataclass(frozen=True, kw_only=True)
class LayerProfile:
    """One layer of the ``nn.Sequential``, measured at every size of the profile."""

    name: str
    """Human-readable layer name."""
    fwd_ms: tuple[float, ...]
    """Forward time per measured microbatch size, in ms."""
    bwd_ms: tuple[float, ...]
    """Backward time per measured microbatch size, in ms."""
    out_bytes: float
    """Bytes per sample of the layer's output (and of its gradient)."""
    stash_bytes: float
    """Bytes per sample autograd keeps from this layer's forward until its backward."""
    param_bytes: float
    """Bytes of the layer's parameters."""


@dataclass(frozen=True, kw_only=True)
class Profile:
    """A measured model: ordered layers, sizes, input size and link."""

    model: str
    """What was measured (zoo name and arguments, or an import path)."""
    device: str
    """Where it was measured, honestly (e.g. ``cpu: 1 thread, Xeon``)."""
    dtype: str
    """Compute dtype of the measurement."""
    microbatch_sizes: tuple[int, ...]
    """Ascending measured sizes, starting at 1."""
    input_bytes: float
    """Bytes of one input sample fed to layer 0."""
    layers: tuple[LayerProfile, ...]
    """The layers ``0..L-1``."""
    link: Link
    """Link between neighbouring stages."""
    extra: dict[str, Any] = field(default_factory=dict, compare=False)
    """Fields beyond the contract (model spec, calibration report); kept on save."""

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def to_json(self) -> dict[str, Any]:
        """The ``umsearch.core.profile/1`` object, extra fields included."""
        out: dict[str, Any] = {
            "schema": SCHEMA,
            "model": self.model,
            "device": self.device,
            "dtype": self.dtype,
            "microbatch_sizes": list(self.microbatch_sizes),
            "input_bytes": self.input_bytes,
            "layers": [
                {
                    "name": lay.name,
                    "fwd_ms": list(lay.fwd_ms),
                    "bwd_ms": list(lay.bwd_ms),
                    "out_bytes": lay.out_bytes,
                    "stash_bytes": lay.stash_bytes,
                    "param_bytes": lay.param_bytes,
                }
                for lay in self.layers
            ],
            "link": {
                "latency_ms": self.link.latency_ms,
                "bandwidth_gb_per_s": self.link.bandwidth_gb_per_s,
            },
        }
        for key, value in self.extra.items():
            out.setdefault(key, value)
        return out


def _number(value: Any, where: str, *, positive: bool = False) -> float:
    """A finite, non-negative (or strictly positive) number, else a ProfileError naming ``where``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ProfileError(f"profile field {where} must be a number, got {value!r}")
    v = float(value)
    if not math.isfinite(v):
        raise ProfileError(f"profile field {where} must be finite, got {value!r}")
    if v < 0 or (positive and v == 0):
        need = "positive" if positive else "non-negative"
        raise ProfileError(f"profile field {where} must be {need}, got {value!r}")
    return v


def _get(obj: dict[str, Any], key: str, where: str) -> Any:
    if key not in obj:
        raise ProfileError(f"profile is missing field {where}{key!r}; add it (see MODEL.md section 1)")
    return obj[key]


def _text(obj: dict[str, Any], key: str, where: str = "") -> str:
    value = _get(obj, key, where)
    if not isinstance(value, str):
        raise ProfileError(f"profile field {where}{key!r} must be a string, got {value!r}")
    return value


def _sizes(raw: Any) -> tuple[int, ...]:
    if not isinstance(raw, list) or len(raw) < 2:
        raise ProfileError(
            f"profile field 'microbatch_sizes' must list at least two sizes (got {raw!r}): times "
            "above the largest size are extrapolated from the last two; measure e.g. [1, 2, 4, 8]"
        )
    sizes: list[int] = []
    for i, v in enumerate(raw):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ProfileError(f"profile field microbatch_sizes[{i}] must be a positive integer, got {v!r}")
        sizes.append(v)
    if sizes[0] != 1:
        raise ProfileError(f"profile field 'microbatch_sizes' must start with 1, got {sizes!r}; measure size 1 too")
    for a, b in zip(sizes, sizes[1:], strict=False):
        if b <= a:
            raise ProfileError(
                f"profile field 'microbatch_sizes' must be strictly ascending, got {sizes!r}"
            )
    return tuple(sizes)


def _times(raw: Any, where: str, n: int) -> tuple[float, ...]:
    if not isinstance(raw, list):
        raise ProfileError(f"profile field {where} must be a list of times in ms, got {raw!r}")
    if len(raw) != n:
        raise ProfileError(
            f"profile field {where} has {len(raw)} values but 'microbatch_sizes' has {n}; "
            "give one time per measured size"
        )
    return tuple(_number(v, f"{where}[{i}]") for i, v in enumerate(raw))


def _layer(raw: Any, i: int, n: int) -> LayerProfile:
    where = f"layers[{i}]."
    if not isinstance(raw, dict):
        raise ProfileError(f"profile field layers[{i}] must be an object, got {raw!r}")
    return LayerProfile(
        name=_text(raw, "name", where),
        fwd_ms=_times(_get(raw, "fwd_ms", where), f"layers[{i}].fwd_ms", n),
        bwd_ms=_times(_get(raw, "bwd_ms", where), f"layers[{i}].bwd_ms", n),
        out_bytes=_number(_get(raw, "out_bytes", where), f"layers[{i}].out_bytes"),
        stash_bytes=_number(_get(raw, "stash_bytes", where), f"layers[{i}].stash_bytes"),
        param_bytes=_number(_get(raw, "param_bytes", where), f"layers[{i}].param_bytes"),
    )


_CONTRACT_KEYS = {"schema", "model", "device", "dtype", "microbatch_sizes", "input_bytes", "layers", "link"}


def profile_from_json(obj: Any) -> Profile:
    """Validate a decoded ``umsearch.core.profile/1`` object and build the :class:`Profile`."""
    if not isinstance(obj, dict):
        raise ProfileError(f"a profile must be a JSON object, got {type(obj).__name__}")
    schema = obj.get("schema")
    if schema != SCHEMA:
        raise ProfileError(
            f"unknown profile schema {schema!r}; this umsearch reads {SCHEMA!r} "
            "(re-run `umsearch profile` to produce one)"
        )
    sizes = _sizes(_get(obj, "microbatch_sizes", ""))
    layers_raw = _get(obj, "layers", "")
    if not isinstance(layers_raw, list) or not layers_raw:
        raise ProfileError(f"profile field 'layers' must be a non-empty list, got {layers_raw!r}")
    link_raw = _get(obj, "link", "")
    if not isinstance(link_raw, dict):
        raise ProfileError(f"profile field 'link' must be an object, got {link_raw!r}")
    link = Link(
        latency_ms=_number(_get(link_raw, "latency_ms", "link."), "link.latency_ms"),
        bandwidth_gb_per_s=_number(
            _get(link_raw, "bandwidth_gb_per_s", "link."), "link.bandwidth_gb_per_s", positive=True
        ),
    )
    return Profile(
        model=_text(obj, "model"),
        device=_text(obj, "device"),
        dtype=_text(obj, "dtype"),
        microbatch_sizes=sizes,
        input_bytes=_number(_get(obj, "input_bytes", ""), "input_bytes"),
        layers=tuple(_layer(raw, i, len(sizes)) for i, raw in enumerate(layers_raw)),
        link=link,
        extra={k: v for k, v in obj.items() if k not in _CONTRACT_KEYS},
    )


def load_profile(path: str | os.PathLike[str]) -> Profile:
    """Read and validate a profile file; errors name the file, the field and the value."""
    obj = read_json(path, "profile", ProfileError)
    try:
        return profile_from_json(obj)
    except ProfileError as exc:
        raise ProfileError(f"{path}: {exc}") from None


def save_profile(profile: Profile, path: str | os.PathLike[str]) -> Path:
    """Write ``profile`` atomically as ``umsearch.core.profile/1`` JSON."""
    return write_json(path, profile.to_json())


def file_sha256(path: str | os.PathLike[str]) -> str:
    """Hex sha256 of a file's bytes (plans record which profile they were searched on)."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
