"""Where the processes of a data-parallel plan sit (docs/model.md section 9): which process is which
replica's pipeline rank, and which samples each replica trains on.

A plan with ``data_parallel = D`` runs on ``R * D`` processes: world rank ``w`` is the device of
(replica ``d``, pipeline rank ``r``) under the plan's layout (:func:`umsearch.core.cluster.device`).
Replica ``d`` trains on samples ``[d * B/D, (d+1) * B/D)`` of the global batch; under ``zero1`` its copy
of a stage (rank ``d`` of the stage's copies) also steps shard ``d`` of the stage's optimizer states. No
torch here: the launcher and the CLI ask it before anything is built.
"""

from __future__ import annotations

from dataclasses import dataclass

from umsearch.core.cluster import device
from umsearch.core.plan import Plan
from umsearch.errors import RuntimeExecutionError


def world_size(plan: Plan) -> int:
    """Processes the plan runs on: ``R`` ranks times ``D`` replicas."""
    return plan.ranks * plan.data_parallel


def replica_worlds(plan: Plan) -> tuple[tuple[int, ...], ...]:
    """``[d][r]``: the world rank of replica ``d``'s pipeline rank ``r`` (the plan's layout)."""
    R, D = plan.ranks, plan.data_parallel
    return tuple(tuple(device(d, r, R, D, plan.layout) for r in range(R)) for d in range(D))


def stage_copies(plan: Plan) -> tuple[tuple[int, ...], ...]:
    """``[r]``: the world ranks of pipeline rank ``r``'s ``D`` copies, ascending."""
    worlds = replica_worlds(plan)
    return tuple(tuple(sorted(w[r] for w in worlds)) for r in range(plan.ranks))


@dataclass(frozen=True)
class Seat:
    """Where one process sits: its replica and its pipeline rank."""

    replica: int
    rank: int

    @classmethod
    def of(cls, plan: Plan, world_rank: int) -> Seat:
        """The replica and rank of ``world_rank``; raises unless it is one of the plan's processes."""
        for d, ranks in enumerate(replica_worlds(plan)):
            if world_rank in ranks:
                return cls(replica=d, rank=ranks.index(world_rank))
        raise RuntimeExecutionError(f"process {world_rank} is not one of the plan's {world_size(plan)} "
                                    f"({plan.ranks} ranks x {plan.data_parallel} replicas)")  # fmt: skip

    def samples(self, plan: Plan) -> tuple[int, int]:
        """``(first, count)``: this replica's consecutive samples of the global batch."""
        n = plan.replica_batch
        return self.replica * n, n


def check_world(plan: Plan, started: int) -> None:
    """Raise unless ``started`` processes are exactly one per device the plan needs (``R x D``)."""
    need = world_size(plan)
    if started != need:
        has = f"{plan.ranks} rank(s)" if plan.data_parallel == 1 else \
            f"{plan.ranks} rank(s) x {plan.data_parallel} replicas = {need} processes"  # fmt: skip
        raise RuntimeExecutionError(
            f"the plan has {has} but torchrun started {started} process(es); start exactly one per rank "
            f"{'' if plan.data_parallel == 1 else 'and replica '}(--nnodes x --nproc-per-node = {need})"
        )
