"""The genome: a fixed-length vector in [0, 1) that always decodes to a valid plan.

Layout for S stages: ``S - 1`` cut genes, then per stage five genes:
microbatch size, head size (a smaller first microbatch shortens pipeline
fill), warmup, recompute, backward size (used only when recomputing). Sorting
the cut genes and spacing them by one layer makes every cut vector a valid
partition; the size genes index the allowed sizes, so every decoded stage
covers the batch exactly. Crossover and mutation therefore never produce an
invalid plan; deadlocks remain possible and are scored infeasible.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from umsearch.batch_eval import PackedPlans
from umsearch.plan import Plan, StagePlan

GENES_PER_STAGE = 5


@dataclass(frozen=True, kw_only=True)
class Encoding:
    """How genomes map to plans for one search space."""

    num_layers: int
    stages: int
    batch: int
    sizes: tuple[int, ...]
    """Allowed microbatch sizes, ascending."""
    max_count: int
    """Most microbatches per stage."""
    schedule: str
    """``gpipe``, ``1f1b`` or ``any``."""
    recompute: bool
    """Whether recompute may be chosen."""

    @property
    def length(self) -> int:
        return self.stages - 1 + GENES_PER_STAGE * self.stages

    def cuts(self, x: npt.NDArray[np.float64]) -> list[int]:
        g = np.sort(np.clip(x[: self.stages - 1], 0.0, 1.0 - 1e-12))
        span = self.num_layers - self.stages + 1
        return [0, *[int(v * span) + i + 1 for i, v in enumerate(g)], self.num_layers]

    def _size(self, gene: float) -> int:
        i = min(int(gene * len(self.sizes)), len(self.sizes) - 1)
        # Fewer than B / max_count samples per microbatch would exceed the count limit.
        least = -(-self.batch // self.max_count)
        return max(self.sizes[i], least)

    def sequence(self, size_gene: float, head_gene: float) -> tuple[int, ...]:
        """``[head, size, size, ..., rest]`` summing to the batch."""
        b = self._size(size_gene)
        head = max(1, min(b, int(round(head_gene * b + 0.5 - 1e-9))))
        head = min(head, self.batch)
        seq = [head]
        left = self.batch - head
        while left > 0:
            take = min(b, left)
            seq.append(take)
            left -= take
        # A tiny remainder is merged rather than paid for as one more op.
        if len(seq) > 2 and seq[-1] < self.sizes[0]:
            seq[-2] += seq.pop()
        while len(seq) > self.max_count:
            seq[-2] += seq.pop()
        return tuple(seq)

    def decode(self, x: npt.NDArray[np.float64]) -> Plan:
        cuts = self.cuts(x)
        stages = []
        for s in range(self.stages):
            g = x[self.stages - 1 + GENES_PER_STAGE * s : self.stages - 1 + GENES_PER_STAGE * (s + 1)]
            fwd = self.sequence(g[0], g[1])
            rec = bool(self.recompute and g[3] >= 0.5)
            bwd = self.sequence(g[4], 1.0) if rec else fwd
            if self.schedule == "gpipe":
                warm = len(fwd)
            elif self.schedule == "1f1b":
                warm = self.stages - s
            else:
                warm = 1 + min(int(g[2] * len(fwd)), len(fwd) - 1)
            stages.append(StagePlan(layers=(cuts[s], cuts[s + 1]), forward=fwd, backward=bwd,
                                    warmup=warm, recompute=rec))  # fmt: skip
        return Plan(global_batch=self.batch, stages=tuple(stages))

    def encode_uniform(self, cuts: list[int], size: int, schedule: str) -> npt.NDArray[np.float64]:
        """A genome decoding to an equal-microbatch plan (for seeding the population)."""
        span = self.num_layers - self.stages + 1
        x = np.zeros(self.length)
        x[: self.stages - 1] = [(c - i - 1 + 0.5) / span for i, c in enumerate(cuts[1:-1])]
        i = self.sizes.index(size) if size in self.sizes else int(np.searchsorted(self.sizes, size))
        i = min(i, len(self.sizes) - 1)
        for s in range(self.stages):
            o = self.stages - 1 + GENES_PER_STAGE * s
            m = -(-self.batch // size)
            warm = m if schedule == "gpipe" else min(self.stages - s, m)
            x[o : o + GENES_PER_STAGE] = [(i + 0.5) / len(self.sizes), 1.0 - 1e-9,
                                          (warm - 1 + 0.5) / m, 0.0, (i + 0.5) / len(self.sizes)]  # fmt: skip
        return np.clip(x, 0.0, 1.0 - 1e-9)


def pack_genomes(enc: Encoding, X: npt.NDArray[np.float64]) -> tuple[PackedPlans, list[Plan]]:
    """Decode a population and pack it for :func:`umsearch.batch_eval.evaluate`."""
    from umsearch.batch_eval import pack_plans

    plans = [enc.decode(x) for x in X]
    return pack_plans(plans), plans
