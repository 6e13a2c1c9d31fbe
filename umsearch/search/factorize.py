"""Factorizations of a cluster: which (ranks R, replicas D, layout, ZeRO-1) are worth a search.

A cluster of ``nodes x gpus_per_node`` devices runs ``D`` replicas of an
``R``-rank pipeline, ``R x D`` = the devices (docs/model.md section 9). Every
divisor R of the devices is a candidate; it is pruned before any search when
it cannot work: more ranks than layers (or than a search plans for), ``D`` not
dividing the batch, or a smallest possible stage that does not fit the memory
limit even with ZeRO-1. Both layouts are kept where they differ (they do not
with one rank, one replica, one node or one device per node). Pure functions of
numbers: the search and the tests call them alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from umsearch.core.cluster import LAYOUTS, Cluster, replica_nodes
from umsearch.core.cost import CostTables, device_state_factor
from umsearch.core.profile import Link
from umsearch.sim.population import ArrayPlan


@dataclass(frozen=True, kw_only=True)
class Factorization:
    """One way to use the devices: ``ranks`` x ``replicas``, a layout, and whether ZeRO-1 may shard
    the optimizer states (where memory binds)."""

    ranks: int
    """R: devices of one pipeline."""
    replicas: int
    """D: data-parallel replicas."""
    layout: str = "dp_inner"
    """``dp_inner`` (a stage's copies side by side) or ``pp_inner`` (a replica's ranks side by side)."""
    zero1: bool = False
    """Whether plans may shard optimizer states over the replicas (kept only where a plan needs it)."""

    @property
    def label(self) -> str:
        """``R=4 x D=4 dp_inner`` (``+zero1`` where allowed)."""
        return f"R={self.ranks} x D={self.replicas} {self.layout}" + (" +zero1" if self.zero1 else "")


@dataclass(frozen=True, kw_only=True)
class Pruned:
    """A factorization left out before searching, and why."""

    factorization: Factorization
    reason: str


@dataclass(frozen=True, kw_only=True)
class Memory:
    """What memory pruning needs of a profile: per-layer parameter and stash bytes, the limit."""

    param_bytes: tuple[float, ...]
    """Per layer, parameter bytes."""
    stash_bytes: tuple[float, ...]
    """Per layer, stash bytes per sample."""
    state_factor: float
    """Bytes of training state per parameter byte."""
    limit: float
    """Per-device memory limit (bytes)."""
    tied_bytes: float = 0.0
    """Bytes ``param_bytes`` counts more than once: each tied weight's ``(len(layers) - 1) * bytes``
    (docs/model.md 5, version 2.3)."""
    stash_fixed_bytes: tuple[float, ...] = ()
    """Per layer, bytes saved per microbatch whatever its size (empty: none)."""


def divisors(n: int) -> list[int]:
    """Every divisor of ``n``, ascending."""
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})


state_factor = device_state_factor
"""Bytes of state per parameter byte on a device (:func:`umsearch.core.cost.device_state_factor`)."""


def smallest_stage_bytes(mem: Memory, ranks: int, replicas: int, zero1: bool) -> float:
    """A lower bound on the fullest device's memory of any plan on ``ranks`` ranks: the fullest rank holds
    at least ``1/R`` of the parameters (each tied weight once) and at least the largest layer; and the rank
    holding layer ``k`` holds its state and, during its backward, at least one sample of its stash (kept or
    rebuilt). The two may be different ranks, so the bound is the larger, not their sum."""
    factor = state_factor(mem.state_factor, replicas, zero1)
    params = max((sum(mem.param_bytes) - mem.tied_bytes) / ranks, max(mem.param_bytes))
    holding = max(factor * p + s for p, s in zip(mem.param_bytes, mem.stash_bytes, strict=True))
    return max(factor * params, holding)


def comfortable_bytes(mem: Memory, ranks: int, replicas: int, batch: int) -> float:
    """Memory of a rank holding ``1/R`` of the model with all ``B / D`` samples of its replica
    stashed at once (GPipe's worst case), without ZeRO-1: below the limit, memory never binds. Every
    layer's fixed stash counts once per sample, more than any plan saves of it."""
    per_sample = sum(mem.stash_bytes) / ranks * (batch // replicas)
    return mem.state_factor * sum(mem.param_bytes) / ranks + per_sample + sum(mem.stash_fixed_bytes) * batch


def _same_layouts(ranks: int, replicas: int, cluster: Cluster) -> bool:
    """Whether both layouts place every message and all-reduce on the same kind of link."""
    return ranks == 1 or replicas == 1 or cluster.gpus_per_node == 1 or ranks * replicas <= cluster.gpus_per_node


def factorizations(devices: int, batch: int, num_layers: int, cluster: Cluster, mem: Memory, *,
                   max_ranks: int, ranks: int = 0) -> tuple[list[Factorization], list[Pruned]]:  # fmt: skip
    """The factorizations worth a search (ascending R, ``dp_inner`` first) and those pruned, with the
    reason. ``ranks`` > 0 keeps only that R. ZeRO-1 is allowed where memory binds (see
    :func:`comfortable_bytes`) and required where the smallest stage only fits with it."""
    keep: list[Factorization] = []
    pruned: list[Pruned] = []
    for R in divisors(devices):
        D = devices // R
        if ranks and R != ranks:
            continue
        layouts = ("dp_inner",) if _same_layouts(R, D, cluster) else LAYOUTS
        why = _reason(R, D, batch, num_layers, mem, max_ranks)
        zero1 = D > 1 and (comfortable_bytes(mem, R, D, batch) > mem.limit
                           or smallest_stage_bytes(mem, R, D, zero1=False) > mem.limit)
        for layout in layouts:
            f = Factorization(ranks=R, replicas=D, layout=layout, zero1=zero1)
            (pruned.append(Pruned(factorization=f, reason=why)) if why else keep.append(f))
    return keep, pruned


def _reason(R: int, D: int, batch: int, num_layers: int, mem: Memory, max_ranks: int) -> str:
    """Why R x D cannot work ("" if it may)."""
    if R > num_layers:
        return f"R = {R} ranks but the profile has {num_layers} layers"
    if R > max_ranks:
        return f"R = {R} ranks; a search plans for at most {max_ranks}"
    if batch % D:
        return f"D = {D} replicas do not divide B = {batch}"
    need = smallest_stage_bytes(mem, R, D, zero1=D > 1)
    if need > mem.limit:
        with_z = " even with ZeRO-1" if D > 1 else ""
        return f"the smallest possible stage needs {need / 1e9:.3g} GB > the limit of {mem.limit / 1e9:.3g} GB{with_z}"
    return ""


def representative_link(cluster: Cluster, f: Factorization) -> Link:
    """The link most of replica 0's neighbouring ranks talk over (``inter`` on a tie): the order
    generator times one replica with one link; the evaluator then scores every replica exactly."""
    nodes = replica_nodes(cluster, f.ranks, f.replicas, f.layout, 0)
    crossing = sum(a != b for a, b in zip(nodes, nodes[1:], strict=False))
    return cluster.inter if 2 * crossing >= len(nodes) - 1 and crossing else cluster.intra


@dataclass(frozen=True, kw_only=True)
class ClusterPlacement:
    """One factorization on one cluster: how a search's candidates become data-parallel plans."""

    factorization: Factorization
    cluster: Cluster
    batch: int
    """The global batch B (a replica's lists sum to ``B / D``)."""

    @property
    def fields(self) -> dict[str, Any]:
        """The :class:`~umsearch.sim.population.ArrayPlan` fields that make one replica's plan this
        factorization's data-parallel plan."""
        f = self.factorization
        return {"batch": self.batch, "replicas": f.replicas, "cluster": self.cluster, "layout": f.layout,
                "zero1": f.zero1}  # fmt: skip

    def stamp(self, ap: ArrayPlan) -> ArrayPlan:
        """``ap`` (one replica's plan) as the data-parallel plan of this factorization (``ap`` itself
        when it already is: templates are stamped once, their copies need nothing)."""
        f = self.factorization
        if (ap.cluster is self.cluster and ap.batch == self.batch and ap.replicas == f.replicas
                and ap.layout == f.layout and ap.zero1 == f.zero1):  # fmt: skip
            return ap
        return replace(ap, **self.fields)

    def stamp_all(self, aps: Sequence[ArrayPlan]) -> list[ArrayPlan]:
        return [self.stamp(ap) for ap in aps]

    def generator_tables(self, tables: CostTables) -> CostTables:
        """The cost tables the order generator times one replica with: the representative link and,
        with ZeRO-1, the sharded state factor (so its memory budget is right)."""
        f, link = self.factorization, representative_link(self.cluster, self.factorization)
        return replace(tables, latency_ms=link.latency_ms, ms_per_byte=1.0 / (link.bandwidth_gb_per_s * 1e6),
                       state_factor=state_factor(tables.state_factor, f.replicas, f.zero1))  # fmt: skip

    def bound_tables(self, tables: CostTables) -> CostTables:
        """Cost tables under which :func:`~umsearch.search.bound.lower_bound` stays a bound: the
        cheaper latency of the two links (all-reduces only add time) and, where ZeRO-1 is allowed,
        its sharded state factor (the least state a device can hold)."""
        f = self.factorization
        lat = min(self.cluster.intra.latency_ms, self.cluster.inter.latency_ms)
        return replace(tables, latency_ms=lat, state_factor=state_factor(tables.state_factor, f.replicas, f.zero1))
