"""The distributed runtime: execute a plan for real, one process per stage.

Library use (inside your own process group, one rank per stage)::

    comm = StageComm.create(plan.num_stages, device)
    ex = StageExecutor(plan, rank, stage_module, loss_fn, comm, optimizer=opt)
    stats = ex.run_iteration(inputs if rank == 0 else None, targets if last else None)

or let :func:`run_plan` start the processes (torchrun, one rank per stage) for
you. The torchrun entry point, :mod:`umsearch.runtime.torchrun`, is not
imported here, so that ``python -m umsearch.runtime.torchrun`` runs it cleanly.
"""

from __future__ import annotations

from umsearch.runtime.comm import Comm, StageComm
from umsearch.runtime.config import LaunchConfig, RunConfig
from umsearch.runtime.executor import IterationStats, OpTiming, StageExecutor
from umsearch.runtime.launch import launch
from umsearch.runtime.run import RunResult, StepResult, run_plan

__all__ = [
    "Comm", "IterationStats", "LaunchConfig", "OpTiming", "RunConfig", "RunResult", "StageComm",
    "StageExecutor", "StepResult", "launch", "run_plan",
]  # fmt: skip
