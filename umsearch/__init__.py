"""umsearch: plan pipeline-parallel training with unequal microbatches.

The public API, following the data flow (names are imported on first use, so
``import umsearch`` stays cheap and imports torch only for what needs it)::

    from umsearch import load_profile, load_space, run_search, simulate, CostModel
    space = load_space("search_spaces/default.toml")
    result = run_search(space, load_profile(space.profile))
    print(simulate(result.best.plan, CostModel(load_profile(space.profile))).iteration_ms)

- profile and plan: :class:`Profile`, :func:`load_profile`, :class:`Plan`,
  :class:`Stage`, :class:`Action`, :func:`save_plan`; a plan file is read
  through one gate, :func:`load_plan_file` (checked once, with its profile and
  model: ``load_plan_file(path).plan``), and a plan built in code checked with
  :func:`validate_plan`;
- cost and simulation: :class:`CostModel`, :func:`simulate`;
- schedules: :data:`PEER_SCHEDULES` (torch's orders as action lists), :func:`warmup_rule`;
- search: :class:`SearchSpace`, :func:`load_space`, :func:`run_search`;
- runtime (torch): :class:`StageExecutor`, :class:`RankComm`, :func:`run_plan`.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.2.0"

_EXPORTS = {
    "Profile": "core.profile", "load_profile": "core.profile", "save_profile": "core.profile",
    "Plan": "core.plan", "Stage": "core.plan", "PlanDocument": "core.plan_io", "save_plan": "core.plan_io", "validate_plan": "core.plan_rules",
    "Action": "core.actions", "load_plan_file": "core.loader",
    "CostModel": "core.cost", "simulate": "sim.reference",
    "PEER_SCHEDULES": "core.schedules", "warmup_rule": "core.schedules",
    "SearchSpace": "search.space", "load_space": "search.space", "run_search": "search.driver",
    "StageExecutor": "runtime", "RankComm": "runtime", "run_plan": "runtime",
}  # fmt: skip

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'umsearch' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"umsearch.{_EXPORTS[name]}"), name)
    globals()[name] = value
    return value
