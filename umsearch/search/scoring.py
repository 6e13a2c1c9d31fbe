"""Scoring candidates: the one place the search turns plans and genomes into numbers.

Explicit plans (the peer schedules' orders, edited orders) go through the
batch evaluator; genomes go through the order generator, which makes their
action lists and times them in the same pass. Both count what they score,
and both keep a candidate feasible only when it fits the memory limit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from umsearch.core.cost import CostTables
from umsearch.core.plan import Plan
from umsearch.search.genome import Genome, Rules
from umsearch.search.orders import Generated, generate, pack_genomes
from umsearch.sim.batch import ArrayPlan, decode, evaluate, pack

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, kw_only=True)
class Scored:
    """A plan with its simulated cost."""

    name: str
    """Who produced it: ``umsearch`` or a baseline's name."""
    plan: Plan
    """The plan itself (explicit actions)."""
    iteration_ms: float
    """Predicted iteration time."""
    peak_memory_bytes: tuple[float, ...]
    """Predicted peak memory per rank."""
    method: str = ""
    """How it was found, for reports."""
    genome: Genome | None = None
    """The genome it was generated from (search candidates only)."""

    @property
    def max_memory(self) -> float:
        return max(self.peak_memory_bytes)


class Scorer:
    """Scores array plans and genomes of one space against one set of cost tables."""

    def __init__(self, rules: Rules, tables: CostTables, memory_limit: float) -> None:
        self.rules, self.tables, self.memory_limit = rules, tables, memory_limit
        self.count = 0
        """Candidates scored so far."""

    def plans(self, candidates: Sequence[ArrayPlan]) -> tuple[FloatArray, FloatArray]:
        """(iteration time, fullest rank's memory) of explicit plans; time inf where infeasible
        (deadlock or over the memory limit)."""
        res = evaluate(pack(candidates), self.tables)
        self.count += len(candidates)
        return np.where(res.max_memory_bytes <= self.memory_limit, res.iteration_ms, np.inf), res.max_memory_bytes

    def genomes(self, genomes: Sequence[Genome]) -> Generated:
        """Generate and time the genomes' action lists."""
        gen = generate(pack_genomes(genomes, self.rules), self.tables, self.memory_limit)
        self.count += len(genomes)
        return gen

    def genome_times(self, genomes: Sequence[Genome]) -> tuple[FloatArray, FloatArray]:
        """(iteration time, fullest rank's memory) of genomes; time inf where over the memory limit."""
        gen = self.genomes(genomes)
        ok = gen.max_memory_bytes <= self.memory_limit
        return np.where(ok, gen.iteration_ms, np.inf), gen.max_memory_bytes

    def scored_genome(self, g: Genome, name: str = "umsearch", method: str = "") -> Scored:
        """One genome as a :class:`Scored` plan with its generated actions."""
        gen = self.genomes([g])
        plan = decode(gen.array_plan(g, self.rules, 0))
        peaks = tuple(float(v) for v in gen.ranks_of(0, gen.peak_memory_bytes))
        return Scored(name=name, plan=plan, iteration_ms=float(gen.iteration_ms[0]), peak_memory_bytes=peaks,
                      method=method, genome=g)  # fmt: skip

    def scored_plan(self, ap: ArrayPlan, name: str, method: str = "") -> Scored:
        """One explicit plan as a :class:`Scored`."""
        res = evaluate(pack([ap]), self.tables)
        self.count += 1
        return Scored(name=name, plan=decode(ap), iteration_ms=float(res.iteration_ms[0]),
                      peak_memory_bytes=tuple(float(v) for v in res.ranks_of(0, res.peak_memory_bytes)),
                      method=method)  # fmt: skip
