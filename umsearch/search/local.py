"""Local search: polish a genome by batches of random neighbours, keeping each improvement.

NSGA-II finds good regions; the fine structure of a fast plan (a ramp of a
few samples at fill and drain, a cap one microbatch larger, a cut one layer
over) is reached faster by hill climbing. Each step draws ``neighbours``
genomes one to three moves away (:mod:`umsearch.search.moves`), scores them in
one batch call and moves to the fastest feasible one if it is faster. The
climb ends after ``patience`` steps without gain; then ``kicks`` times the
search jumps a few moves away from the best and climbs again (iterated local
search). A climb draws the same neighbour again and again (a no-op move, the
same edit twice); :class:`Memo` scores each genome once.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from umsearch.search.genome import Genome, Rules
from umsearch.search.moves import cut_neighbours, list_neighbours, neighbour
from umsearch.search.scoring import FloatArray, Scorer


@dataclass(frozen=True, kw_only=True)
class ClimbConfig:
    """How hard the polish works; the defaults were tuned on the bundled spaces."""

    starts: int = 2
    """Climbs start from this many of the fastest distinct genomes found."""
    neighbours: int = 96
    """Random neighbours scored per step (one batch call)."""
    patience: int = 5
    """Steps without gain before a climb ends."""
    kicks: int = 32
    """Jumps away from the best, each followed by a fresh climb (most of the search's gain, and of
    its agreement across seeds, comes from here)."""
    kick_moves: int = 4
    """Random moves per jump."""
    stall: int = 12
    """Jumps in a row without gain after which the search stops jumping."""
    descent_margin: float = 0.005
    """A jump's climb ending within this fraction of the best so far is finished by :func:`descend` (0.005:
    0.5%; negative: never; a chain's first climb always is). A random sample of neighbours misses the one list edit that still gains, and the
    climbs that end close to the best are the ones worth it: on the two-regime profile, 0.005 took seeds
    that ended 0.8-1.1% behind the best to within 0.2%, at a fifth of the extra cost of finishing every climb."""


MEMO_SIZE = 20_000
"""Genomes a :class:`Memo` remembers before it forgets them all: the repeats come from the neighbourhood of the
genome being climbed from, so a few hundred steps' worth catch them (and a big model's genomes stay a few hundred
MB at most)."""


class Memo:
    """A :class:`~umsearch.search.scoring.Scorer` that scores each genome once: the answer for a genome
    seen before is the one it got then (the same, the scorer being deterministic), so a search gives the
    same plan with or without it and only ``score.count`` (plans actually scored) is lower."""

    def __init__(self, score: Scorer, size: int = MEMO_SIZE) -> None:
        self.score, self.size = score, size
        self.known: dict[Genome, tuple[float, float]] = {}

    def genome_times(self, genomes: Sequence[Genome]) -> tuple[FloatArray, FloatArray]:
        """:meth:`Scorer.genome_times` of ``genomes``, scoring only those not seen before."""
        if len(self.known) > self.size:
            self.known.clear()
        new = list(dict.fromkeys(g for g in genomes if g not in self.known))
        if new:
            t, mem = self.score.genome_times(new)
            self.known.update(zip(new, zip(t.tolist(), mem.tolist(), strict=True), strict=True))
        out = np.array([self.known[g] for g in genomes], dtype=np.float64).reshape(len(genomes), 2)
        return out[:, 0], out[:, 1]


@dataclass(frozen=True, kw_only=True)
class Step:
    """One accepted genome of a climb."""

    genome: Genome
    iteration_ms: float
    max_memory_bytes: float


StepHook = Callable[[Step], None]


def climb(start: Step, score: Memo, rules: Rules, rng: random.Random, config: ClimbConfig = ClimbConfig(),
          deadline: float = math.inf, on_step: StepHook | None = None) -> Step:  # fmt: skip
    """Hill-climb from ``start`` (feasible); returns the best step reached.

    ``deadline`` (a ``time.perf_counter`` value) only caps runaway climbs; with
    the default none, the result depends on the seed alone.
    """
    cur, fails = start, 0
    while fails < config.patience and time.perf_counter() < deadline:
        cands = [neighbour(cur.genome, rules, rng, moves=rng.randrange(1, 4), valid=True)
                 for _ in range(config.neighbours)]
        better = _faster(cands, cur, score)
        if better is not None:
            cur, fails = better, 0
            if on_step is not None:
                on_step(cur)
        else:
            fails += 1
    return cur


def _gains(ms: float, than_ms: float) -> bool:
    """Whether ``ms`` is faster than ``than_ms`` by more than rounding: what every local search here accepts."""
    return ms < than_ms * (1 - 1e-12)


def _faster(cands: Sequence[Genome], cur: Step, score: Memo) -> Step | None:
    """The fastest of ``cands`` (scored in one batch) if it is faster than ``cur``, else None."""
    t, mem = score.genome_times(cands)
    return _fastest_if_faster(cands, t, mem, cur)


def _fastest_if_faster(cands: Sequence[Genome], t: FloatArray, mem: FloatArray, cur: Step) -> Step | None:
    """The fastest of ``cands`` (scored ``t``, ``mem``) if it is faster than ``cur``, else None."""
    i = int(np.argmin(t))
    if _gains(float(t[i]), cur.iteration_ms):
        return Step(genome=cands[i], iteration_ms=float(t[i]), max_memory_bytes=float(mem[i]))
    return None


def iterated_climb(start: Step, score: Memo, rules: Rules, rng: random.Random,
                   config: ClimbConfig = ClimbConfig(), deadline: float = math.inf,
                   on_step: StepHook | None = None) -> Step:  # fmt: skip
    """:func:`climb` and :func:`descend`, then ``config.kicks`` times: jump from the best and climb again
    (and descend, if the climb ended close to the best), keeping the result only if it is faster. Returns
    the best step."""
    climbed = climb(start, score, rules, rng, config, deadline, on_step)
    best = descend(climbed, score, rules, deadline)
    if best is not climbed and on_step is not None:
        on_step(best)
    misses = 0
    for _ in range(config.kicks):
        if time.perf_counter() >= deadline or misses >= config.stall:
            break
        misses += 1
        jump = neighbour(best.genome, rules, rng, moves=config.kick_moves, valid=True)
        t, mem = score.genome_times([jump])
        if not np.isfinite(t[0]):
            continue
        trial = climb(Step(genome=jump, iteration_ms=float(t[0]), max_memory_bytes=float(mem[0])), score, rules, rng,
                      config, deadline)
        if trial.iteration_ms < best.iteration_ms * (1 + config.descent_margin):
            trial = descend(trial, score, rules, deadline)
        if _gains(trial.iteration_ms, best.iteration_ms):
            best, misses = trial, 0
            if on_step is not None:
                on_step(best)
    return best


def descend(start: Step, score: Memo, rules: Rules, deadline: float = math.inf) -> Step:
    """Steepest descent from ``start`` over every list edit (:func:`~umsearch.search.moves.list_neighbours`),
    one batch per step, until none is faster; returns the last step (``start`` itself if none was)."""
    return descend_all([start], score, rules, deadline)[0]


def descend_all(starts: Sequence[Step], score: Memo, rules: Rules, deadline: float = math.inf,
                budget: float = math.inf) -> list[Step]:  # fmt: skip
    """:func:`descend` from each of ``starts``, in lockstep: one batch call per step scores every unfinished
    descent's neighbours. Stops early at ``deadline`` or once the scorer has scored ``budget`` more plans.
    Returns each descent's last step, in the order of ``starts``."""
    cur = list(starts)
    active = list(range(len(cur)))
    stop_at = score.score.count + budget
    while active and time.perf_counter() < deadline and score.score.count < stop_at:
        cands = {i: list_neighbours(cur[i].genome, rules) for i in active}
        flat = [g for i in active for g in cands[i]]
        if not flat:
            break
        t, mem = score.genome_times(flat)
        moved, k = [], 0
        for i in active:
            n = len(cands[i])
            better = _fastest_if_faster(cands[i], t[k : k + n], mem[k : k + n], cur[i]) if n else None
            if better is not None:
                cur[i] = better
                moved.append(i)
            k += n
        active = moved
    return cur


REFINE_MOVED = 2
""":func:`refine` moves at most this many stage boundaries at once."""


def refine(start: Step, score: Memo, rules: Rules, budget: float, deadline: float = math.inf,
           on_step: StepHook | None = None) -> Step:  # fmt: skip
    """A variable-neighbourhood descent from ``start``: a list descent, then, one boundary moved first and
    two when no single one gains, every :func:`~umsearch.search.moves.cut_neighbours` genome finished by
    a list descent of its own (all in lockstep); the fastest end, if faster, is the new start (back to one
    boundary), until none is. Stops early once ``budget`` plans were scored. Returns the best step.

    A boundary's best place depends on the lists and the lists' on the boundaries, so a plan the climbs
    leave can be a cut and a few list edits away from a faster one, none of which gains alone: on simnet1
    (R = 4, B = 64) seeds ended at two such plans 0.32% and 0.63% behind the best found, and this took
    both to 0.13% behind it."""
    stop_at = score.score.count + budget
    best = descend(start, score, rules, deadline)
    moved = 1
    while moved <= REFINE_MOVED and time.perf_counter() < deadline and score.score.count < stop_at:
        cands = cut_neighbours(best.genome, rules, moved)
        if not cands:
            break
        t, mem = score.genome_times(cands)
        starts = [Step(genome=g, iteration_ms=float(a), max_memory_bytes=float(m))
                  for g, a, m in zip(cands, t, mem, strict=True) if np.isfinite(a)]  # fmt: skip
        ends = descend_all(starts, score, rules, deadline, stop_at - score.score.count)
        end = min(ends, key=lambda st: st.iteration_ms, default=None)
        if end is not None and _gains(end.iteration_ms, best.iteration_ms):
            best, moved = end, 1
            if on_step is not None:
                on_step(best)
        else:
            moved += 1
    return best
