"""Named links: an interconnect stated by name, not measured (``umsearch profile --link-preset``,
the ``intra`` / ``inter`` links of a search space's ``[cluster]`` table).

Bandwidths are the vendor's peak per direction for one GPU's share of the
fabric, in GB/s (1e9 bytes), taken from the spec sheets named below. They are
upper bounds: NCCL point-to-point transfers reach less, so a prediction made
with them is optimistic on communication. Latencies are not on spec sheets;
they are the order of magnitude of a small NCCL point-to-point message on such a
link (a few microseconds inside a node, a few tens across InfiniBand), given so
that the model charges one per message.

Every link a user states, wherever it is read (a profile's ``link``, a plan's or a search space's
``cluster.intra`` / ``cluster.inter``, the ``--intra`` / ``--inter`` flags), passes
:func:`link_numbers`: finite, and within :data:`MIN_BANDWIDTH_GB_PER_S` to
:data:`MAX_BANDWIDTH_GB_PER_S` GB/s and 0 to :data:`MAX_LATENCY_MS` ms.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from umsearch.errors import UmsearchError

MIN_BANDWIDTH_GB_PER_S = 1e-3
"""Slowest link a user may state: 1 MB/s, eight times slower than a 10 Mb/s Ethernet from 1990
and 125 times slower than 1 Gb Ethernet. Anything below is a unit mistake (bytes/s or Mb/s written
as GB/s); 1e-300 would make a 1 MB message take 1e297 ms."""
MAX_BANDWIDTH_GB_PER_S = 1e9
"""Fastest link a user may state: 1e9 GB/s. No interconnect comes near it (NVLink 4: 450 GB/s per
direction; a GPU's own HBM3e: about 5,000 GB/s), but a link this fast is how a profile says that
transfers cost nothing (docs/model.md 8.7's example), and a fast link only shrinks times. 1e300 is a
unit mistake."""
MAX_LATENCY_MS = 1e4
"""Longest per-message latency a user may state: 10 s, in ms. Real links take microseconds
(0.005 ms over NVLink, 0.02 ms over InfiniBand); even a message across a continent takes 100 ms."""
_FIX = ("state bandwidth in GB/s (1 GB = 1e9 bytes) and latency in ms, e.g. 450 GB/s and 0.005 ms for "
        "NVLink 4 or 50 GB/s and 0.02 ms for InfiniBand NDR")  # fmt: skip


def _shown(value: int | float) -> str:
    """``value`` in a few characters: ``1e-300``, ``450``; a 400-digit integer is not spelled out."""
    try:
        return f"{float(value):g}".replace("e+0", "e").replace("e+", "e").replace("e-0", "e-")
    except OverflowError:
        return "a number over 1e308"


def _link_number(value: Any, where: str, error: type[UmsearchError], what: str, lo: float, hi: float,
                 unit: str) -> float:  # fmt: skip
    """One number of a link, in ``[lo, hi]``; ``error`` names ``where``, the value, the bounds and the fix."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise error(f"field {where} must be a number, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise error(f"field {where} must be finite, got {value!r}")
    bounds = f"a link's {what} is from {_shown(lo)} to {_shown(hi)} {unit}"
    if lo > 0 and value <= 0:
        raise error(f"field {where} must be positive, got {_shown(value)}; {bounds}; {_FIX}")
    if value < 0:
        raise error(f"field {where} = {_shown(value)} must be non-negative; {bounds}; {_FIX}")
    if not lo <= value <= hi:
        raise error(f"field {where} = {_shown(value)} {unit} is out of range: {bounds}; {_FIX}")
    return float(value)


def link_numbers(latency_ms: Any, bandwidth_gb_per_s: Any, where: str,
                 error: type[UmsearchError]) -> tuple[float, float]:  # fmt: skip
    """``(latency_ms, bandwidth_gb_per_s)`` of a stated link, checked: numbers, finite, latency 0 to
    :data:`MAX_LATENCY_MS` ms, bandwidth :data:`MIN_BANDWIDTH_GB_PER_S` to :data:`MAX_BANDWIDTH_GB_PER_S`
    GB/s; else ``error`` naming ``where.latency_ms`` or ``where.bandwidth_gb_per_s``, the value, the
    bounds and the fix. The one check of every link read (profile, plan, search space, flags)."""
    return (_link_number(latency_ms, f"{where}.latency_ms", error, "latency", 0.0, MAX_LATENCY_MS, "ms"),
            _link_number(bandwidth_gb_per_s, f"{where}.bandwidth_gb_per_s", error, "bandwidth",
                         MIN_BANDWIDTH_GB_PER_S, MAX_BANDWIDTH_GB_PER_S, "GB/s"))  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class LinkPreset:
    """A named interconnect: the link's numbers and where they come from."""

    name: str
    """The ``--link-preset`` value."""
    latency_ms: float
    """Per-message latency (an order of magnitude, not a spec value)."""
    bandwidth_gb_per_s: float
    """Peak bandwidth per direction for one GPU, GB/s."""
    what: str
    """The interconnect in words."""
    source: str
    """Where the bandwidth comes from."""

    def to_json(self) -> dict[str, Any]:
        return {"preset": self.name, "latency_ms": self.latency_ms, "bandwidth_gb_per_s": self.bandwidth_gb_per_s,
                "what": self.what, "source": self.source}  # fmt: skip


PRESETS: dict[str, LinkPreset] = {p.name: p for p in (
    LinkPreset(name="nvlink4", latency_ms=0.005, bandwidth_gb_per_s=450.0,
               what="NVLink 4 inside an HGX/DGX H100 or H200 node (18 links per GPU)",
               source="NVIDIA H100/H200 SXM spec: NVLink 900 GB/s bidirectional, 450 GB/s per direction"),
    LinkPreset(name="nvlink3", latency_ms=0.005, bandwidth_gb_per_s=300.0,
               what="NVLink 3 inside an HGX/DGX A100 node (12 links per GPU)",
               source="NVIDIA A100 SXM spec: NVLink 600 GB/s bidirectional, 300 GB/s per direction"),
    LinkPreset(name="pcie5", latency_ms=0.01, bandwidth_gb_per_s=64.0,
               what="PCIe 5.0 x16 between GPUs of one node (no NVLink)",
               source="PCI-SIG PCIe 5.0: 32 GT/s x 16 lanes, 128b/130b coding: about 64 GB/s per direction "
                      "(NVIDIA H100 PCIe spec: 128 GB/s bidirectional)"),
    LinkPreset(name="pcie4", latency_ms=0.01, bandwidth_gb_per_s=32.0,
               what="PCIe 4.0 x16 between GPUs of one node (no NVLink)",
               source="PCI-SIG PCIe 4.0: 16 GT/s x 16 lanes: about 32 GB/s per direction "
                      "(NVIDIA A100 PCIe spec: 64 GB/s bidirectional)"),
    LinkPreset(name="ib-ndr", latency_ms=0.02, bandwidth_gb_per_s=50.0,
               what="InfiniBand NDR between nodes, one 400 Gb/s port per GPU (as in DGX H100)",
               source="NVIDIA ConnectX-7 / Quantum-2 NDR: 400 Gb/s per port = 50 GB/s per direction"),
    LinkPreset(name="ib-hdr", latency_ms=0.02, bandwidth_gb_per_s=25.0,
               what="InfiniBand HDR between nodes, one 200 Gb/s port per GPU (as in DGX A100)",
               source="NVIDIA ConnectX-6 / Quantum HDR: 200 Gb/s per port = 25 GB/s per direction"),
)}  # fmt: skip
"""Every preset by name."""

ONE_GPU_DEFAULT = "nvlink4"
"""The preset a one-GPU profile takes when the link is not given: GPUs of one node, the usual
pipeline; said on screen and in the profile."""
