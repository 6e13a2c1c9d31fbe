"""Neighbourhood moves: small random edits of a plan, shared by mutation and local search.

Each move edits a :class:`Genes` in place and may leave it breaking the space's
rules; :meth:`Genes.to_plan` repairs. Moves on a microbatch list either touch
one stage or, with :data:`SHARED_PROB`, every stage that had the same list:
good plans tend to share one sequence across stages, and editing them together
keeps neighbouring stages from waiting on each other's partitions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from umsearch.core.plan import Plan
from umsearch.search.genome import Rules, cuts_of, make_plan, shaped_sequence

SHARED_PROB = 0.5
"""Chance that a list move applies to every stage sharing the edited list."""


@dataclass(kw_only=True)
class Genes:
    """A plan taken apart for editing; lists are per stage."""

    cuts: list[int]
    forward: list[list[int]]
    backward: list[list[int]]
    warmup: list[int]
    recompute: list[bool]

    @classmethod
    def of(cls, plan: Plan) -> Genes:
        st = plan.stages
        return cls(cuts=cuts_of(plan), forward=[list(x.forward) for x in st], backward=[list(x.backward) for x in st],
                   warmup=[x.warmup for x in st], recompute=[x.recompute for x in st])  # fmt: skip

    @classmethod
    def of_cuts(cls, cuts: list[int], rules: Rules) -> Genes:
        """Genes with these cuts and empty lists (the repair fills them); warmups 1F1B-like."""
        S = rules.stages
        return cls(cuts=list(cuts), forward=[[] for _ in range(S)], backward=[[] for _ in range(S)],
                   warmup=[S - s for s in range(S)], recompute=[False] * S)  # fmt: skip

    def copy(self) -> Genes:
        return Genes(cuts=list(self.cuts), forward=[list(x) for x in self.forward],
                     backward=[list(x) for x in self.backward], warmup=list(self.warmup),
                     recompute=list(self.recompute))  # fmt: skip

    def take_stage(self, other: Genes, s: int) -> None:
        """Stage ``s``'s lists, warmup and recompute flag copied from ``other`` (not its cuts)."""
        self.forward[s], self.backward[s] = list(other.forward[s]), list(other.backward[s])
        self.warmup[s], self.recompute[s] = other.warmup[s], other.recompute[s]

    def to_plan(self, rules: Rules) -> Plan:
        return make_plan(rules, self.cuts, self.forward, self.backward, self.warmup, self.recompute)


def _pick_list(g: Genes, rng: np.random.Generator) -> tuple[int, list[list[int]]]:
    """A stage and which of its lists to edit (backward only where it recomputes)."""
    s = int(rng.integers(len(g.forward)))
    lists = g.backward if g.recompute[s] and rng.random() < 0.5 else g.forward
    return s, lists


def _split(seq: list[int], rules: Rules, rng: np.random.Generator) -> list[int]:
    big = [j for j, v in enumerate(seq) if v > 1]
    if not big:
        return seq
    j = big[int(rng.integers(len(big)))]
    a = seq[j] // 2 if rng.random() < 0.5 else int(rng.integers(1, seq[j]))
    return seq[:j] + [a, seq[j] - a] + seq[j + 1 :]


def _merge(seq: list[int], rules: Rules, rng: np.random.Generator) -> list[int]:
    if len(seq) < 2:
        return seq
    j = int(rng.integers(len(seq) - 1))
    return seq[:j] + [seq[j] + seq[j + 1]] + seq[j + 2 :]


def _shift(seq: list[int], rules: Rules, rng: np.random.Generator) -> list[int]:
    """Move a few samples across one boundary between neighbouring microbatches."""
    if len(seq) < 2:
        return seq
    j = int(rng.integers(len(seq) - 1))
    d = int(rng.integers(1, max(2, min(seq[j], seq[j + 1]) // 2 + 1)))
    if rng.random() < 0.5:
        d = -d
    a, b = seq[j] + d, seq[j + 1] - d
    if a < 1 or b < 1:
        return seq
    return seq[:j] + [a, b] + seq[j + 2 :]


def _edge(seq: list[int], rules: Rules, rng: np.random.Generator) -> list[int]:
    """Rescale the first or last microbatch (pipeline fill and drain), its neighbour absorbing the change."""
    if len(seq) < 2:
        return seq
    first = rng.random() < 0.5
    j, k = (0, 1) if first else (len(seq) - 1, len(seq) - 2)
    new = max(1, int(round(seq[j] * float(rng.choice([0.5, 0.75, 1.25, 1.5])))))
    rest = seq[k] - (new - seq[j])
    if rest < 1:
        return seq
    out = list(seq)
    out[j], out[k] = new, rest
    return out


def _rescale(seq: list[int], rules: Rules, rng: np.random.Generator) -> list[int]:
    """Every microbatch scaled by one factor: fewer, larger ones or more, smaller ones."""
    f = float(rng.choice([0.67, 0.8, 1.25, 1.5]))
    return [max(1, int(round(v * f))) for v in seq]


def random_shape(rules: Rules, rng: np.random.Generator) -> tuple[int, ...]:
    """A random ramp-shaped list (see :func:`umsearch.search.genome.shaped_sequence`)."""
    body = int(rules.sizes[int(rng.integers(len(rules.sizes)))])
    head = int(rng.integers(1, body + 1))
    tail = int(rng.integers(1, body + 1))
    return shaped_sequence(rules, body, head, int(rng.integers(0, 4)), tail, int(rng.integers(0, 4)))


def _reshape(seq: list[int], rules: Rules, rng: np.random.Generator) -> list[int]:
    return list(random_shape(rules, rng))


ListMove = Callable[[list[int], Rules, np.random.Generator], list[int]]
LIST_MOVES: tuple[ListMove, ...] = (_split, _merge, _shift, _shift, _edge, _edge, _rescale, _reshape)


def list_move(g: Genes, rules: Rules, rng: np.random.Generator) -> None:
    """One edit of one microbatch list, on one stage or on every stage sharing it."""
    s, lists = _pick_list(g, rng)
    old = lists[s]
    new = LIST_MOVES[int(rng.integers(len(LIST_MOVES)))](old, rules, rng)
    targets = [t for t in range(len(lists)) if lists[t] == old] if rng.random() < SHARED_PROB else [s]
    for t in targets:
        lists[t] = list(new)


def copy_list(g: Genes, rules: Rules, rng: np.random.Generator) -> None:
    """A stage's forward list copied to a neighbour, or to every stage."""
    s = int(rng.integers(len(g.forward)))
    if rng.random() < 0.5:
        targets = list(range(len(g.forward)))
    else:
        targets = [t for t in (s - 1, s + 1) if 0 <= t < len(g.forward)]
    for t in targets:
        g.forward[t] = list(g.forward[s])


def cut_move(g: Genes, rules: Rules, rng: np.random.Generator) -> None:
    """One stage boundary moved by one or a few layers."""
    if len(g.cuts) < 3:
        return
    i = int(rng.integers(1, len(g.cuts) - 1))
    step = 1 if rng.random() < 0.7 else int(rng.integers(2, 4))
    g.cuts[i] += step if rng.random() < 0.5 else -step


def warmup_move(g: Genes, rules: Rules, rng: np.random.Generator) -> None:
    """One stage runs one forward more or fewer ahead of its first backward."""
    s = int(rng.integers(len(g.warmup)))
    if rng.random() < 0.8:
        g.warmup[s] += 1 if rng.random() < 0.5 else -1
    else:
        g.warmup[s] = int(rng.integers(1, len(g.forward[s]) + 1))


def recompute_move(g: Genes, rules: Rules, rng: np.random.Generator) -> None:
    """Toggle recompute on one stage; a stage turning it on starts with backward = forward."""
    s = int(rng.integers(len(g.recompute)))
    g.recompute[s] = not g.recompute[s]
    g.backward[s] = list(g.forward[s])


PlanMove = Callable[[Genes, Rules, np.random.Generator], None]


def plan_moves(rules: Rules) -> tuple[PlanMove, ...]:
    """The moves that can change something under ``rules``, weighted by repetition."""
    moves: list[PlanMove] = [list_move, list_move, list_move, list_move, copy_list]
    if rules.stages > 1:
        moves += [cut_move, cut_move]
    if rules.schedule == "any":
        moves += [warmup_move, warmup_move]
    if rules.recompute:
        moves.append(recompute_move)
    return tuple(moves)


def neighbour(plan: Plan, rules: Rules, rng: np.random.Generator, moves: int = 1) -> Plan:
    """``plan`` after ``moves`` random moves, repaired."""
    table = plan_moves(rules)
    g = Genes.of(plan)
    for _ in range(moves):
        table[int(rng.integers(len(table)))](g, rules, rng)
    return g.to_plan(rules)
