"""The distributed runtime: execute a plan/2 for real, one process per rank.

Library use (inside your own process group, one process per rank)::

    comm = RankComm.create(plan_links(plan), device)
    ex = StageExecutor(plan, rank, stage_modules, loss_fn, comm, optimizer=opt)
    stats = ex.run_iteration(inputs, targets)  # inputs on the rank of stage 0, targets on the last's

A data-parallel plan runs one process per rank of every replica
(:mod:`umsearch.runtime.placement`: ``Seat.of(plan, dist.get_rank())`` gives its replica
and rank); it passes ``replicas=replica_worlds(plan)`` to ``RankComm.create``, gives the
executor ``grad_sync=GradSync.create(plan, dist.get_rank())`` and its replica's
``plan.replica_batch`` samples of every batch.
``stage_modules`` holds one module per stage the rank holds, in stage order
(:func:`umsearch.runtime.model_source.stage_module` cuts them from a model). Or let
:func:`run_plan` start the processes (torchrun, one per rank) for you.

:mod:`umsearch.nn.backward` (the split backward, also used by the
profiler) and :mod:`umsearch.runtime.stage` (one stage's compute) need no
process group. Names are imported on first use, so importing one submodule
does not import the others; the torchrun entry point,
:mod:`umsearch.runtime.torchrun`, is not exported, so that ``python -m
umsearch.runtime.torchrun`` runs it cleanly.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Comm": "comm", "RankComm": "comm", "plan_links": "comm",
    "LaunchConfig": "config", "RunConfig": "config",
    "IterationStats": "executor", "StageExecutor": "executor",
    "GradSync": "gradsync",
    "LayerRecord": "timing",
    "PlanSchedule": "plan_schedule",
    "launch": "launch",
    "RunResult": "run_plan", "StepResult": "run_plan", "run_plan": "run_plan",
    "WeightWork": "umsearch.nn.backward", "backward_full": "umsearch.nn.backward",
    "backward_input": "umsearch.nn.backward", "backward_weight": "umsearch.nn.backward",
}  # fmt: skip
"""Exported name -> the submodule of this package (or the full module name) that defines it."""

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module if "." in module else f"{__name__}.{module}"), name)
