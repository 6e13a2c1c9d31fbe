"""The plan (``umsearch.plan/2``): ranks, stages placed on them, and every rank's action list.

docs/model.md sections 2 and 3. :class:`Plan` is what a schedule *is*: global
batch, ranks, stages, actions. It is frozen and hashable, so equal plans
compare equal and the search can deduplicate them. Its neighbours:
:mod:`umsearch.core.plan_rules` (:func:`~umsearch.core.plan_rules.validate_plan`,
the gate every plan passes) and :mod:`umsearch.core.plan_io` (plan files: a
plan with its prediction and provenance, to and from JSON and disk, version 1
files included).

Version 2.2 (docs/model.md section 9) adds optional fields for data-parallel
replicas on a cluster: ``data_parallel``, ``cluster``, ``layout``, ``zero1``.
A plan without them means what it meant, and is written without them.
Version 2.3 adds ``bucket_mib``, the gradient bucket cap of the all-reduce
(section 9): 25 MiB (DDP's) for a plan built in code; ``None`` (no cap, one
all-reduce per stage) is version 2.2, which a replicated plan file without the
field means.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from umsearch.core.actions import Action
from umsearch.core.cluster import DEFAULT_BUCKET_MIB, DEFAULT_LAYOUT, Cluster
from umsearch.errors import PlanError

SCHEMA = "umsearch.plan/2"
SCHEMA_V1 = "umsearch.plan/1"

MAX_RANKS = 256
"""Most ranks a plan may have: the most a search plans for (``ranks`` of a search space, and R of
R x D on a cluster), and more than any pipeline runs (torchtitan's largest go to a few dozen)."""
MAX_STAGES_PER_RANK = 64
"""Most stages a search puts on one rank (``[schedule] stages_per_rank``)."""
MAX_PLAN_STAGES = MAX_RANKS * MAX_STAGES_PER_RANK
"""Most stages a plan may have (16,384): what the largest search space can make. A stage holds at
least one layer, so a plan checked against a profile has at most its layer count."""
MAX_MICROBATCHES = 100_000
"""Most microbatches one stage may list: the search space's ``[microbatch] max_count`` bound too."""
MAX_ACTIONS = 1 << 21
"""Most actions a plan may list over all its ranks (2,097,152; checking that many takes seconds):
five times the 100,000-microbatch, two-stage 1F1B plan, far more than any search makes. Every
forward and every backward microbatch needs an action, so it bounds the microbatches listed over
all stages too."""


@dataclass(frozen=True, kw_only=True)
class Stage:
    """One model chunk: a layer range, the rank holding it, and how it splits the batch."""

    layers: tuple[int, int]
    """Half-open layer range ``[lo, hi)``."""
    rank: int
    """The rank (device) that holds and runs this stage."""
    forward: tuple[int, ...]
    """Forward microbatch sizes, in sample order; they sum to the global batch."""
    backward: tuple[int, ...]
    """Backward microbatch sizes, in sample order; equal to ``forward`` unless ``recompute``."""
    recompute: bool = False
    """Whether the stage keeps only its inputs and rebuilds each backward microbatch's graph."""

    @property
    def lo(self) -> int:
        return self.layers[0]

    @property
    def hi(self) -> int:
        return self.layers[1]

    def to_json(self) -> dict[str, Any]:
        return {"layers": list(self.layers), "rank": self.rank, "forward": list(self.forward),
                "backward": list(self.backward), "recompute": self.recompute}  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class Plan:
    """A full pipeline schedule for one global batch (hashable; see :class:`PlanDocument` for files)."""

    global_batch: int
    """``B``: samples per iteration."""
    ranks: int
    """``R``: devices of the pipeline, ``0..R-1``."""
    stages: tuple[Stage, ...]
    """Stages in model order; stage ``j`` runs layers after stage ``j-1``'s."""
    actions: tuple[tuple[Action, ...], ...]
    """``actions[r]``: rank r's actions, in the order it runs them."""
    data_parallel: int = 1
    """``D``: identical replicas of the pipeline, each training on ``B / D`` samples (docs/model.md 9)."""
    cluster: Cluster | None = None
    """Nodes and their two links; None: every message uses the profile's link."""
    layout: str = DEFAULT_LAYOUT
    """Which device replica d's rank r is: ``dp_inner`` (``r * D + d``) or ``pp_inner`` (``d * R + r``)."""
    zero1: bool = False
    """Whether optimizer states are sharded over the replicas (memory only)."""
    bucket_mib: float | None = DEFAULT_BUCKET_MIB
    """Cap of one gradient bucket of the all-reduce in MiB (docs/model.md 9, version 2.3); None: no cap, each
    stage all-reduced whole once its last backward ends (version 2.2)."""

    @property
    def replica_batch(self) -> int:
        """Samples one replica trains on: what every stage's lists sum to."""
        return self.global_batch // self.data_parallel

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    @property
    def num_layers(self) -> int:
        """Layers the plan covers (the last stage's end)."""
        return self.stages[-1].hi

    def stages_of(self, rank: int) -> tuple[int, ...]:
        """Indices of the stages rank ``rank`` holds, ascending."""
        return tuple(j for j, st in enumerate(self.stages) if st.rank == rank)

    @cached_property
    def uses_split(self) -> tuple[bool, ...]:
        """Per stage: whether any of its backwards is split into ``I`` and ``W``."""
        split = [False] * self.num_stages
        for acts in self.actions:
            for a in acts:
                if a.is_split:
                    split[a.stage] = True
        return tuple(split)

    @property
    def equal_microbatches(self) -> bool:
        """Whether every stage runs the same list forward and backward (what torch's schedules run)."""
        first = self.stages[0].forward
        return all(st.forward == first and st.backward == first for st in self.stages)

    def to_json(self) -> dict[str, Any]:
        """The contract fields of a plan/2 file (no prediction, no provenance); the section 9 fields
        only where they differ from their defaults, so older plans are written as before, except
        ``bucket_mib``, written with replicas (a replicated file without it reads as version 2.2) or
        where it is not the default (``null``: no cap)."""
        out = {"schema": SCHEMA, "global_batch": self.global_batch, "ranks": self.ranks,
               "stages": [s.to_json() for s in self.stages],
               "actions": [[str(a) for a in acts] for acts in self.actions]}  # fmt: skip
        if self.data_parallel != 1:
            out["data_parallel"] = self.data_parallel
        if self.cluster is not None:
            out["cluster"] = self.cluster.to_json()
        if self.layout != DEFAULT_LAYOUT:
            out["layout"] = self.layout
        if self.zero1:
            out["zero1"] = True
        if self.data_parallel != 1 or self.bucket_mib != DEFAULT_BUCKET_MIB:
            mib = self.bucket_mib
            out["bucket_mib"] = int(mib) if mib is not None and float(mib).is_integer() else mib
        return out


def equal_split(batch: int, count: int) -> tuple[int, ...]:
    """``count`` contiguous microbatches as equal as possible, larger ones first (as torch splits)."""
    if not 1 <= count <= batch:
        raise PlanError(f"cannot split a batch of {batch} into {count} microbatches")
    q, r = divmod(batch, count)
    return tuple(q + 1 if i < r else q for i in range(count))


def placed_plan(cuts: Sequence[int], placement: Sequence[int], batch: int, forward: Sequence[Sequence[int]],
                actions: Sequence[Sequence[Action]], backward: Sequence[Sequence[int]] | None = None,
                recompute: Sequence[bool] | None = None) -> Plan:  # fmt: skip
    """A plan from cut points ``[0, c1, ..., L]``, the rank of each stage, its lists and the actions."""
    n = len(cuts) - 1
    back = backward if backward is not None else forward
    rec = recompute if recompute is not None else [False] * n
    stages = tuple(Stage(layers=(cuts[j], cuts[j + 1]), rank=placement[j], forward=tuple(forward[j]),
                         backward=tuple(back[j]), recompute=rec[j]) for j in range(n))  # fmt: skip
    return Plan(global_batch=batch, ranks=max(placement) + 1, stages=stages, actions=tuple(tuple(a) for a in actions))
