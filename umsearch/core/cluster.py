"""Data-parallel replicas on a two-tier cluster (docs/model.md section 9): where each device sits, which
link a message or a stage's all-reduce uses, and what the ring all-reduce costs.

A plan with ``data_parallel = D`` runs as ``D`` replicas of its ``R``-rank pipeline on ``R * D``
devices; ``layout`` says which device replica ``d``'s rank ``r`` is, and ``gpus_per_node`` which
node a device is on. The simulators, the search and the pictures all ask these functions, so the
placement rules exist once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from umsearch.core.errors import PlanError
from umsearch.core.fields import check_keys, integer, mapping, required
from umsearch.core.profile import Link, link_from_json

LAYOUTS = ("dp_inner", "pp_inner")
"""``dp_inner`` (the default): a stage's copies sit side by side; ``pp_inner``: a replica's ranks do."""
DEFAULT_LAYOUT = "dp_inner"
_SEE = "docs/model.md section 9"


@dataclass(frozen=True, kw_only=True)
class Cluster:
    """Nodes of ``gpus_per_node`` devices; ``intra`` links devices of one node, ``inter`` of two."""

    gpus_per_node: int
    """``G``: device ``g`` is on node ``g // G``."""
    intra: Link
    """Link between two devices of one node."""
    inter: Link
    """Link between devices of different nodes."""

    def to_json(self) -> dict[str, Any]:
        return {"gpus_per_node": self.gpus_per_node, "intra": self.intra.to_json(), "inter": self.inter.to_json()}


def device(replica: int, rank: int, ranks: int, replicas: int, layout: str) -> int:
    """The device of replica ``replica``'s rank ``rank`` (``dp_inner``: ``r * D + d``; ``pp_inner``:
    ``d * R + r``). Either way it grows with the rank and with the replica."""
    return rank * replicas + replica if layout == "dp_inner" else replica * ranks + rank


def replica_nodes(cluster: Cluster, ranks: int, replicas: int, layout: str, replica: int) -> tuple[int, ...]:
    """The node of each rank of replica ``replica``."""
    return tuple(device(replica, r, ranks, replicas, layout) // cluster.gpus_per_node for r in range(ranks))


def copies_span_nodes(cluster: Cluster, rank: int, ranks: int, replicas: int, layout: str) -> bool:
    """Whether the ``replicas`` copies of a stage on rank ``rank`` sit on more than one node."""
    return len({device(d, rank, ranks, replicas, layout) // cluster.gpus_per_node for d in range(replicas)}) > 1


def ms_per_byte(link: Link) -> float:
    """Transfer time of one byte on ``link`` (1 GB/s is 1e6 bytes per ms)."""
    return 1.0 / (link.bandwidth_gb_per_s * 1e6)


def allreduce_ms(param_bytes: float, replicas: int, link: Link) -> float:
    """The ring all-reduce of ``param_bytes`` over ``replicas`` copies on ``link``:
    ``2 (D-1)/D * P / (bandwidth * 1e6) + 2 (D-1) * latency`` (0 for one copy)."""
    d = replicas
    return 2 * (d - 1) / d * param_bytes * ms_per_byte(link) + 2 * (d - 1) * link.latency_ms


def cluster_from_json(raw: Any) -> Cluster:
    """The plan field ``cluster``; raises PlanError naming the bad value and the fix."""
    obj = mapping(raw, "cluster", PlanError)
    check_keys(obj, {"gpus_per_node", "intra", "inter"}, "cluster.", PlanError)
    gpn = required(obj, "gpus_per_node", "cluster.", PlanError, _SEE)
    if isinstance(gpn, int) and not isinstance(gpn, bool) and gpn < 1:
        raise PlanError(f"plan field cluster.gpus_per_node = {gpn} must be at least 1 (devices per node)")
    return Cluster(
        gpus_per_node=integer(gpn, "cluster.gpus_per_node", PlanError, lo=1),
        intra=link_from_json(required(obj, "intra", "cluster.", PlanError, _SEE), "cluster.intra", PlanError, _SEE),
        inter=link_from_json(required(obj, "inter", "cluster.", PlanError, _SEE), "cluster.inter", PlanError, _SEE),
    )
