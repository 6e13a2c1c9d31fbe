"""Local search: polish a plan by batches of random neighbours, keeping each improvement.

NSGA-II finds good regions; the fine structure of a fast plan (a ramp of a few
samples at fill and drain, one warmup more on a stage, a cut one layer over)
is reached faster by hill climbing. Each step draws ``neighbours`` plans one
to three moves away (:mod:`umsearch.search.moves`), scores them in one batch
call and moves to the fastest feasible one if it is faster. The climb ends
after ``patience`` steps without gain; then ``kicks`` times the search jumps a
few moves away from the best and climbs again (iterated local search).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from umsearch.core.plan import Plan
from umsearch.search.genome import Rules
from umsearch.search.moves import neighbour
from umsearch.search.scoring import Scorer


@dataclass(frozen=True, kw_only=True)
class ClimbConfig:
    """How hard the polish works; the defaults were tuned on the bundled spaces."""

    starts: int = 5
    """Climbs start from this many of the fastest distinct plans NSGA-II found."""
    neighbours: int = 192
    """Random neighbours scored per step (one batch call)."""
    patience: int = 6
    """Steps without gain before a climb ends."""
    kicks: int = 12
    """Jumps away from the best, each followed by a fresh climb."""
    kick_moves: int = 4
    """Random moves per jump."""


@dataclass(frozen=True, kw_only=True)
class Step:
    """One accepted plan of a climb."""

    plan: Plan
    iteration_ms: float
    peak_memory_bytes: tuple[float, ...]


StepHook = Callable[[Step], None]


def climb(start: Step, score: Scorer, rules: Rules, memory_limit: float, rng: np.random.Generator,
          config: ClimbConfig = ClimbConfig(), deadline: float = math.inf, on_step: StepHook | None = None) -> list[Step]:  # fmt: skip
    """Hill-climb from ``start`` (feasible); returns every accepted step, ``start`` first.

    ``deadline`` (a ``time.perf_counter`` value) only caps runaway climbs; with
    the default none, the result depends on the seed alone.
    """
    path = [start]
    fails = 0
    while fails < config.patience and time.perf_counter() < deadline:
        cur = path[-1]
        cands = [neighbour(cur.plan, rules, rng, moves=int(rng.integers(1, 4))) for _ in range(config.neighbours)]
        sc = score(cands)
        i = sc.fastest(memory_limit)
        if i is not None and sc.time_ms[i] < cur.iteration_ms * (1 - 1e-12):
            step = Step(plan=cands[i], iteration_ms=float(sc.time_ms[i]),
                        peak_memory_bytes=tuple(float(m) for m in sc.memory[i]))  # fmt: skip
            path.append(step)
            fails = 0
            if on_step is not None:
                on_step(step)
        else:
            fails += 1
    return path


def iterated_climb(start: Step, score: Scorer, rules: Rules, memory_limit: float, rng: np.random.Generator,
                   config: ClimbConfig = ClimbConfig(), deadline: float = math.inf,
                   on_step: StepHook | None = None) -> list[Step]:  # fmt: skip
    """:func:`climb`, then ``config.kicks`` times: jump from the best and climb again, keeping
    the result only if it is faster. Returns every step that improved on the best, ``start`` first.
    """
    path = climb(start, score, rules, memory_limit, rng, config, deadline, on_step)
    for _ in range(config.kicks):
        if time.perf_counter() >= deadline:
            break
        best = path[-1]
        jump = neighbour(best.plan, rules, rng, moves=config.kick_moves)
        sc = score([jump])
        if sc.fastest(memory_limit) is None:
            continue
        restart = Step(plan=jump, iteration_ms=float(sc.time_ms[0]), peak_memory_bytes=tuple(float(m) for m in sc.memory[0]))
        trial = climb(restart, score, rules, memory_limit, rng, config, deadline)
        if trial[-1].iteration_ms < best.iteration_ms * (1 - 1e-12):
            path.append(trial[-1])
            if on_step is not None:
                on_step(trial[-1])
    return path
