"""docs/model.md section 8 as data: the reference profiles and plans every simulator must reproduce exactly."""

from __future__ import annotations

from collections.abc import Sequence

from umsearch.core.actions import parse_actions
from umsearch.core.cluster import Cluster
from umsearch.core.plan import Plan, Stage
from umsearch.core.profile import LayerProfile, Link, Profile, RuntimeCosts


def unit_profile(layers: int, *, split: bool = True, op_overhead_ms: float = 0.0,
                 message_overhead_ms: float = 0.0) -> Profile:  # fmt: skip
    """Section 8's profile: fwd 1, bwd 2 (I = W = 1), stash 10, params 100, free transfers."""
    lay = tuple(
        LayerProfile(name=f"l{i}", fwd_ms=(1.0, 1.0), bwd_ms=(2.0, 2.0), out_bytes=0.0, stash_bytes=10.0,
                     param_bytes=100.0, bwd_input_ms=(1.0, 1.0) if split else None,
                     bwd_weight_ms=(1.0, 1.0) if split else None)
        for i in range(layers)
    )  # fmt: skip
    return Profile(model="unit", device="none", dtype="none", microbatch_sizes=(1, 2), input_bytes=0.0, layers=lay,
                   link=Link(latency_ms=0.0, bandwidth_gb_per_s=1.0),
                   runtime=RuntimeCosts(op_overhead_ms=op_overhead_ms, message_overhead_ms=message_overhead_ms))  # fmt: skip


def explicit_plan(batch: int, placement: Sequence[int], lists: Sequence[Sequence[int]],
                  actions: Sequence[str], layers_per_stage: int = 1) -> Plan:  # fmt: skip
    """A plan with one list per stage (forward = backward) and rank lists in docs/model.md notation."""
    n = layers_per_stage
    stages = tuple(Stage(layers=(j * n, (j + 1) * n), rank=r, forward=tuple(lists[j]), backward=tuple(lists[j]))
                   for j, r in enumerate(placement))  # fmt: skip
    return Plan(global_batch=batch, ranks=len(actions), stages=stages,
                actions=tuple(parse_actions(a) for a in actions))  # fmt: skip


EXAMPLE3 = explicit_plan(4, [0, 1, 0, 1], [[1] * 4] * 4, [
    "0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 2B2 2B3 0B2 0B3",
    "1F0 1F1 3F0 3B0 3F1 3B1 1F2 1B0 1F3 1B1 3F2 3B2 3F3 3B3 1B2 1B3",
])
"""Section 8.3: Interleaved1F1B, 2 ranks, 4 stages, 4 microbatches of 1."""

EXAMPLE4 = explicit_plan(4, [0, 1, 1, 0], [[1] * 4] * 4, [
    "0F0 0F1 0F2 3F0 3I0 3W0 3F1 3I1 3W1 0F3 0I0 0W0 3F2 3I2 3W2 0I1 0W1 3F3 3I3 3W3 0I2 0W2 0I3 0W3",
    "1F0 2F0 1F1 2F1 2I0 2W0 1F2 1I0 1W0 2F2 2I1 2W1 1F3 1I1 1W1 2F3 2I2 2W2 1I2 2I3 1I3 1W2 2W3 1W3",
])
"""Section 8.4: ZBVZeroBubble, V-shape, I/W split."""

EXAMPLE5 = explicit_plan(4, [0, 1, 0, 1], [[1, 3], [2, 2], [4], [2, 2]], [
    "0F0 0F1 2F0 2B0 0B0 0B1",
    "1F0 1F1 3F0 3B0 3F1 3B1 1B0 1B1",
])
"""Section 8.5: unequal and interleaved."""

EXAMPLE5_DEADLOCK = explicit_plan(4, [0, 1, 0, 1], [[1, 3], [2, 2], [4], [2, 2]], [
    "0F0 2F0 0F1 2B0 0B0 0B1",
    "1F0 1F1 3F0 3B0 3F1 3B1 1B0 1B1",
])
"""Section 8.5 with 2F0 moved before 0F1: deadlocks."""


def warmup_plan(batch: int, lists: Sequence[tuple[Sequence[int], Sequence[int], int, bool]],
                layers_per_stage: int = 1) -> Plan:  # fmt: skip
    """One stage per rank; per stage (forward, backward, warmup, recompute), orders by the warmup rule."""
    from umsearch.core.schedules import warmup_rule

    n = layers_per_stage
    stages = tuple(Stage(layers=(j * n, (j + 1) * n), rank=j, forward=tuple(f), backward=tuple(b), recompute=rec)
                   for j, (f, b, _, rec) in enumerate(lists))  # fmt: skip
    actions = tuple(warmup_rule(j, f, b, w) for j, (f, b, w, _) in enumerate(lists))
    return Plan(global_batch=batch, ranks=len(lists), stages=stages, actions=actions)


def example1(schedule: str) -> Plan:
    """Section 8.1: four ranks, B = 8 in eight microbatches of 1, GPipe or 1F1B."""
    ones = [1] * 8
    return warmup_plan(8, [(ones, ones, 8 if schedule == "gpipe" else 4 - j, False) for j in range(4)])


EXAMPLE2 = warmup_plan(8, [([1, 3, 4], [2, 6], 1, True), ([4, 4], [8], 2, True)])
"""Section 8.2: two recomputing stages whose partitions deadlock."""


def example8_profile() -> Profile:
    """Section 8.8's profile: section 8's four layers with 1000 output bytes and 1,000,000 parameter
    bytes each (the profile's own link is replaced by the cluster's)."""
    import dataclasses

    base = unit_profile(4)
    layers = tuple(dataclasses.replace(x, out_bytes=1000.0, param_bytes=1_000_000.0) for x in base.layers)
    return dataclasses.replace(base, layers=layers)


EXAMPLE8_CLUSTER = Cluster(gpus_per_node=2, intra=Link(latency_ms=0.5, bandwidth_gb_per_s=1.0),
                           inter=Link(latency_ms=1.0, bandwidth_gb_per_s=0.1))  # fmt: skip
"""Section 8.8's cluster: nodes of two devices, intra 0.5 ms and 1 GB/s, inter 1 ms and 0.1 GB/s."""


def example8(layout: str = "dp_inner", zero1: bool = False) -> Plan:
    """Section 8.8: B = 8 on D = 2 replicas of two ranks, one stage of two layers each, lists [2, 2]."""
    import dataclasses

    plan = explicit_plan(4, [0, 1], [[2, 2], [2, 2]], ["0F0 0F1 0B0 0B1", "1F0 1B0 1F1 1B1"], layers_per_stage=2)
    return dataclasses.replace(plan, global_batch=8, data_parallel=2, cluster=EXAMPLE8_CLUSTER, layout=layout,
                               zero1=zero1)  # fmt: skip
