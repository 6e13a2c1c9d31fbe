"""Scoring candidates: the one place the search turns plans and genomes into numbers.

Explicit plans (the peer schedules' orders, edited orders) go through the
batch evaluator; genomes go through the order generator, which makes their
action lists and times them in the same pass. Both count what they score,
and both keep a candidate feasible only when it fits the memory limit.

On a cluster (a :class:`~umsearch.search.factorize.ClusterPlacement`) every candidate
is one replica's plan, made a data-parallel plan before it is scored; the
generator times one replica on a representative link, and the evaluator then
scores the generated plans exactly (every replica, the all-reduces included).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from umsearch.core.cost import CostTables
from umsearch.core.plan import Plan
from umsearch.search.factorize import ClusterPlacement
from umsearch.search.genome import Genome, Rules
from umsearch.search.orders import Generated, generate, pack_genomes
from umsearch.sim.population import ArrayPlan, decode, evaluate, pack

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

    def __init__(self, rules: Rules, tables: CostTables, memory_limit: float,
                 placement: ClusterPlacement | None = None) -> None:  # fmt: skip
        self.rules, self.tables, self.memory_limit = rules, tables, memory_limit
        self.placement = placement
        """Where candidates run on a cluster; None: one pipeline, the profile's link."""
        self.generator_tables = tables if placement is None else placement.generator_tables(tables)
        self.count = 0
        """Candidates scored so far."""

    def _stamped(self, candidates: Sequence[ArrayPlan]) -> Sequence[ArrayPlan]:
        return candidates if self.placement is None else self.placement.stamp_all(candidates)

    def stamp(self, ap: ArrayPlan) -> ArrayPlan:
        """``ap`` as the plan this scorer scores (on a cluster: its data-parallel plan)."""
        return ap if self.placement is None else self.placement.stamp(ap)

    def plans(self, candidates: Sequence[ArrayPlan]) -> tuple[FloatArray, FloatArray]:
        """(iteration time, fullest rank's memory) of explicit plans; time inf where infeasible
        (deadlock or over the memory limit)."""
        res = evaluate(pack(self._stamped(candidates)), self.tables)
        self.count += len(candidates)
        return np.where(res.max_memory_bytes <= self.memory_limit, res.iteration_ms, np.inf), res.max_memory_bytes

    def genomes(self, genomes: Sequence[Genome]) -> Generated:
        """Generate the genomes' action lists, timed by the generator (on a cluster: one replica on
        its representative link, no all-reduce; :meth:`genome_objectives` is exact)."""
        gen = generate(pack_genomes(genomes, self.rules), self.generator_tables, self.memory_limit)
        self.count += len(genomes)
        return gen

    def genome_objectives(self, genomes: Sequence[Genome]) -> tuple[FloatArray, FloatArray]:
        """(iteration time, fullest rank's memory) of genomes, the memory limit not applied."""
        gen = self.genomes(genomes)
        if self.placement is None:
            return gen.iteration_ms, gen.max_memory_bytes
        res = evaluate(gen.packed_plans(self.rules.ranks, **self.placement.fields), self.tables)
        return res.iteration_ms, res.max_memory_bytes

    def genome_times(self, genomes: Sequence[Genome]) -> tuple[FloatArray, FloatArray]:
        """(iteration time, fullest rank's memory) of genomes; time inf where over the memory limit."""
        t, mem = self.genome_objectives(genomes)
        return np.where(mem <= self.memory_limit, t, np.inf), mem

    def _one(self, gen: Generated, g: Genome, c: int) -> ArrayPlan:
        return gen.array_plan(g, self.rules, c, **({} if self.placement is None else self.placement.fields))

    def scored_genome(self, g: Genome, name: str = "umsearch", method: str = "") -> Scored:
        """One genome as a :class:`Scored` plan with its generated actions."""
        gen = self.genomes([g])
        if self.placement is not None:
            s = self.scored_plan(self._one(gen, g, 0), name, method, count=False)
            return Scored(name=name, plan=s.plan, iteration_ms=s.iteration_ms, peak_memory_bytes=s.peak_memory_bytes,
                          method=method, genome=g)  # fmt: skip
        plan = decode(gen.array_plan(g, self.rules, 0))
        peaks = tuple(float(v) for v in gen.ranks_of(0, gen.peak_memory_bytes))
        return Scored(name=name, plan=plan, iteration_ms=float(gen.iteration_ms[0]), peak_memory_bytes=peaks,
                      method=method, genome=g)  # fmt: skip

    def scored_plan(self, ap: ArrayPlan, name: str, method: str = "", *, count: bool = True) -> Scored:
        """One explicit plan as a :class:`Scored` (on a cluster, made this placement's plan first)."""
        ap = self._stamped([ap])[0]
        res = evaluate(pack([ap]), self.tables)
        self.count += count
        return Scored(name=name, plan=decode(ap), iteration_ms=float(res.iteration_ms[0]),
                      peak_memory_bytes=tuple(float(v) for v in res.ranks_of(0, res.peak_memory_bytes)),
                      method=method)  # fmt: skip
