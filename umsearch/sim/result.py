"""What a simulation of one iteration says: per-action records, per-rank totals and, with
data-parallel replicas (docs/model.md section 9), every stage's gradient all-reduce."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from umsearch.core.actions import ActionRecord


@dataclass(frozen=True, kw_only=True)
class AllReduceSpan:
    """The gradient all-reduce of one stage across its replicas (docs/model.md section 9)."""

    stage: int
    """The stage whose copies all-reduce."""
    rank: int
    """The rank holding the stage: its all-reduces run one at a time."""
    ready_ms: float
    """When the stage's last ``B`` or ``W`` has ended in every replica."""
    start_ms: float
    """When it starts: ready, and the rank's previous all-reduce over."""
    end_ms: float


@dataclass(frozen=True, kw_only=True)
class SimResult:
    """What one plan costs under the model (docs/model.md sections 4 and 5)."""

    deadlock: bool
    """True when no action could start while some remained."""
    iteration_ms: float | None
    """Latest end of any action of any replica or of any all-reduce; None on deadlock."""
    busy_ms: tuple[float, ...] | None
    """Per rank, the sum of its actions' durations (overheads included); None on deadlock."""
    peak_memory_bytes: tuple[float, ...] | None
    """Per rank, state plus peak activations; None on deadlock."""
    rank_end_ms: tuple[float, ...]
    """Per rank, the end of its last action that ran (the latest over replicas)."""
    records: tuple[ActionRecord, ...] = field(repr=False)
    """Every action that ran in replica :attr:`replica`, in start order."""
    blocked: tuple[str, ...] = ()
    """On deadlock: each stuck rank's action and the input it waits for."""
    compute_end_ms: float | None = None
    """Latest end of any action of any replica; None on deadlock."""
    allreduce_end_ms: float | None = None
    """Latest end of any all-reduce; None on deadlock or without one (one replica)."""
    allreduces: tuple[AllReduceSpan, ...] = ()
    """Per stage, its all-reduce, in stage order (empty with one replica)."""
    replica: int = 0
    """The replica whose actions :attr:`records` holds: the one whose actions end last (the lowest
    on ties)."""

    @property
    def ranks(self) -> int:
        return len(self.rank_end_ms)

    @property
    def bubble_fraction(self) -> float | None:
        """Idle share of all ranks over the iteration: ``1 - sum(busy) / (R * T)``."""
        if self.iteration_ms is None or self.busy_ms is None or self.iteration_ms <= 0:
            return None
        return 1.0 - sum(self.busy_ms) / (len(self.busy_ms) * self.iteration_ms)

    def rank_bubble(self, r: int) -> float | None:
        """Idle share of rank ``r`` over the iteration."""
        if self.iteration_ms is None or self.busy_ms is None or self.iteration_ms <= 0:
            return None
        return 1.0 - self.busy_ms[r] / self.iteration_ms

    def predicted(self) -> dict[str, Any]:
        """The plan file's ``predicted`` block (with replicas, also the compute and all-reduce ends)."""
        out = {
            "iteration_ms": self.iteration_ms,
            "peak_memory_bytes": None if self.peak_memory_bytes is None else list(self.peak_memory_bytes),
            "busy_ms": None if self.busy_ms is None else list(self.busy_ms),
            "bubble_fraction": self.bubble_fraction,
        }
        if self.allreduces:
            out["compute_end_ms"] = self.compute_end_ms
            out["allreduce_end_ms"] = self.allreduce_end_ms
        return out
