"""When NSGA-II has converged: the stopping rule on progress that replaces a fixed generation count.

After every generation the search hands :class:`Convergence` the fastest time
found so far of each structure (chunks per rank, placement). It stops once,
over the last ``stall`` generations, no structure that could still matter
(within :data:`WINDOW` of the fastest) got more than ``tolerance`` faster, or
once the ``ceiling`` is reached. A structure first seen counts as progress.
Pure bookkeeping: the same history, the same answer.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
"""A structure's key."""

WINDOW = 0.02
"""Structures slower than the fastest by more than this share never keep the search going: their
slow improvements would run every search to the ceiling without changing the plan."""


@dataclass(kw_only=True)
class Convergence(Generic[K]):
    """The stopping rule's state (see the module docstring)."""

    stall: int
    """Generations over which some structure must improve by ``tolerance`` for the search to go on."""
    tolerance: float
    """Relative gain (0.001: 0.1%) below which a structure counts as stalled."""
    ceiling: int
    """Most generations in all."""
    history: list[tuple[int, dict[K, float]]] = field(default_factory=list)
    """(generations run, best time per structure) at each record, oldest first."""

    def record(self, generations: int, best: Mapping[K, float]) -> None:
        """Note the best time per structure after ``generations`` generations."""
        self.history.append((generations, dict(best)))

    def done(self) -> bool:
        """Whether to stop: the ceiling reached, or no structure within :data:`WINDOW` of the fastest got
        faster by more than ``tolerance`` over the last ``stall`` generations."""
        if not self.history:
            return False
        gens, now = self.history[-1]
        if gens >= self.ceiling:
            return True
        past = [b for g, b in self.history if g <= gens - self.stall]
        if not past:
            return False
        then = past[-1]
        fastest = min(now.values(), default=math.inf)
        return not any(t < then.get(k, math.inf) * (1 - self.tolerance)
                       for k, t in now.items() if t <= fastest * (1 + WINDOW))  # fmt: skip
