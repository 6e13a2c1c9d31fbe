"""Data-parallel replicas on a two-tier cluster (docs/model.md section 9): where each device sits, which
link a message or a stage's all-reduce uses, and what the ring all-reduce costs.

A plan with ``data_parallel = D`` runs as ``D`` replicas of its ``R``-rank pipeline on ``R * D``
devices; ``layout`` says which device replica ``d``'s rank ``r`` is, and ``gpus_per_node`` which
node a device is on. The simulators, the search and the pictures all ask these functions, so the
placement rules exist once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from umsearch.core.field_checks import check_keys, integer, mapping, number, required
from umsearch.core.profile import Link, link_from_json
from umsearch.errors import PlanError

MIB = 1 << 20
"""Bytes in a MiB: ``bucket_mib`` counts in these."""
DEFAULT_BUCKET_MIB = 25.0
"""Gradient bucket cap of a plan built in code or by the search: PyTorch DDP's ``bucket_cap_mb``."""
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
    return ring_ms(param_bytes, replicas, link.latency_ms, ms_per_byte(link))


def ring_ms(param_bytes: float, replicas: int, latency_ms: float, per_byte_ms: float) -> float:
    """:func:`allreduce_ms` on a link given by its latency and ms per byte (scalars: the compiled evaluator
    compiles this very function)."""
    d = replicas
    return 2 * (d - 1) / d * param_bytes * per_byte_ms + 2 * (d - 1) * latency_ms


def bucket_cap_bytes(bucket_mib: float | None) -> float:
    """The cap of one gradient bucket in bytes; ``None`` (a version 2.2 plan): no cap, one bucket per stage."""
    return math.inf if bucket_mib is None else bucket_mib * MIB


def bucket_firsts(param_prefix: npt.NDArray[np.float64], lo: int, hi: int, cap_bytes: float,
                  out: npt.NDArray[np.int64]) -> int:  # fmt: skip
    """docs/model.md section 9: the gradient buckets of stage ``[lo, hi)``, filled in reverse layer order,
    each of at most ``cap_bytes`` parameter bytes (``param_prefix``: bytes of layers ``[0, i)``); a layer
    larger than the cap is a bucket of its own. Writes each bucket's lowest layer to ``out``, in the order
    the buckets fill (so ``out[0]`` holds the top layers and the last entry is ``lo``); returns the count.
    A bucket's layers run from its lowest layer up to the previous bucket's. Plain Python on scalars and
    arrays: the compiled evaluator compiles this very function."""
    m = 0
    top = hi  # one past the open bucket's highest layer
    for i in range(hi - 1, lo - 1, -1):
        if top > i + 1 and param_prefix[top] - param_prefix[i] > cap_bytes:
            out[m] = i + 1
            m += 1
            top = i + 1
    out[m] = lo
    return m + 1


def bucket_ready_ms(end_ms: float, duration_ms: float, below_ms: float, total_ms: float) -> float:
    """docs/model.md section 9: when a bucket's gradients are complete in the stage's last backward (a ``B``,
    or a ``W`` when split) that ends at ``end_ms`` after ``duration_ms``. Layer ``i`` is complete once the
    layers above it and ``i`` itself have taken their share of the duration (by their profiled backward
    times); so a bucket whose lowest layer is ``a`` is ready ``duration * T[lo, a) / T[lo, hi)`` before the
    end (``below_ms`` = ``T[lo, a)``, ``total_ms`` = ``T[lo, hi)``). The bucket holding ``lo`` is ready at
    the end itself, as is every bucket of a stage whose backward times are all 0."""
    if below_ms <= 0.0 or total_ms <= 0.0:
        return end_ms
    return end_ms - duration_ms * (below_ms / total_ms)


def chain_allreduces(ready: npt.NDArray[np.float64], took: npt.NDArray[np.float64], rank: npt.NDArray[np.int64],
                     n: int, order: npt.NDArray[np.int64], free: npt.NDArray[np.float64],
                     start: npt.NDArray[np.float64]) -> float:  # fmt: skip
    """docs/model.md section 9: all-reduces ``0..n-1``, each ready at ``ready[i]`` and taking ``took[i]`` on
    rank ``rank[i]``, run one at a time per rank in the order they become ready (the lower index first on a
    tie); writes each one's start to ``start`` and returns the latest end (0 for none). ``order`` (n) and
    ``free`` (one per rank) are scratch. Plain Python: the compiled evaluator compiles this very function."""
    for i in range(n):  # stable insertion sort by ready time
        k = i
        while k > 0 and ready[order[k - 1]] > ready[i]:
            order[k] = order[k - 1]
            k -= 1
        order[k] = i
    for i in range(n):
        free[rank[i]] = 0.0
    last = 0.0
    for k in range(n):
        i = order[k]
        r = rank[i]
        start[i] = max(ready[i], free[r])
        free[r] = start[i] + took[i]
        last = max(last, free[r])
    return last


MAX_BUCKET_MIB = 1e9
"""The largest bucket cap a plan may name (a PiB: no stage comes close; ``null`` means no cap)."""


def bucket_mib_from_json(obj: dict[str, Any]) -> float | None:
    """The plan field ``bucket_mib`` of a plan/2 object: a positive number of MiB, or ``null`` for no cap.
    Absent, it is :data:`DEFAULT_BUCKET_MIB`, except in a plan with replicas, where it reads as version 2.2
    (no cap), so that older plan files keep their predicted times."""
    if "bucket_mib" not in obj:
        return None if obj.get("data_parallel", 1) != 1 else DEFAULT_BUCKET_MIB
    raw = obj["bucket_mib"]
    if raw is None:
        return None
    return number(raw, "bucket_mib (MiB per gradient bucket, e.g. 25, or null for one bucket per stage)",
                  PlanError, positive=True, limit=MAX_BUCKET_MIB)


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
