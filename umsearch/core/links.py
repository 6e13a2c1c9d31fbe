"""Named links: an interconnect stated by name, not measured (``umsearch profile --link-preset``,
the ``intra`` / ``inter`` links of a search space's ``[cluster]`` table).

Bandwidths are the vendor's peak per direction for one GPU's share of the
fabric, in GB/s (1e9 bytes), taken from the spec sheets named below. They are
upper bounds: NCCL point-to-point transfers reach less, so a prediction made
with them is optimistic on communication. Latencies are not on spec sheets;
they are the order of magnitude of a small NCCL point-to-point message on such a
link (a few microseconds inside a node, a few tens across InfiniBand), given so
that the model charges one per message.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


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
