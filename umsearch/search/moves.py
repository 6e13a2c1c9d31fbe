"""Neighbourhood moves: small random edits of a genome, shared by mutation and local search.

Each move edits a :class:`Genes` in place and may leave it breaking the
space's rules; :meth:`Genes.to_genome` repairs. Moves on a microbatch list
either touch one stage or, with :data:`SHARED_PROB`, every stage that had the
same list: good plans tend to share one sequence across stages, and editing
them together keeps neighbouring stages from waiting on each other's
partitions (splitting or merging a microbatch on every stage that shares a
boundary).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from umsearch.search.genome import (
    POLICY_COUNT,
    Genome,
    Rules,
    default_rank_caps,
    repair,
    repair_cuts,
    repair_lists,
    shaped_sequence,
    strict_cuts,
)

SHARED_PROB = 0.5
"""Chance that a list move applies to every stage sharing the edited list."""

Rng = random.Random
"""Moves draw from Python's generator: the search draws millions of small numbers, and numpy's
generator costs microseconds per call."""


@dataclass(kw_only=True)
class Genes:
    """A genome taken apart for editing: lists of its fields, the microbatch lists kept as tuples.

    Moves replace whole lists and record the stages they touched in
    ``fresh``, so that :meth:`to_genome` re-checks only those; a move that
    changes the structure sets ``fresh`` to None (check everything).
    """

    v: int
    placement: str
    cuts: list[int]
    forward: list[tuple[int, ...]]
    backward: list[tuple[int, ...]]
    recompute: list[bool]
    split: list[bool]
    cap: list[int]
    rank_cap: list[int]
    w_cap: list[int]
    policy: list[int]
    fresh: set[int] | None
    knobs_valid: bool = False
    """Whether everything but the ``fresh`` lists is known to obey the rules: the genome taken apart did,
    and no move since broke a cut (the move that can, clears it when it does)."""
    caps_over: bool = False
    """Whether a cap may have passed its ceiling (the only way a cap move breaks the rules; the genome is built
    with it lowered to the ceiling, as the repair would)."""

    @classmethod
    def of(cls, g: Genome, valid: bool = False) -> Genes:
        """``g`` taken apart; ``valid``: ``g`` is known to obey the rules (it came from :func:`repair`)."""
        return cls(v=g.v, placement=g.placement, cuts=list(g.cuts), forward=list(g.forward), backward=list(g.backward),
                   recompute=list(g.recompute), split=list(g.split), cap=list(g.cap), rank_cap=list(g.rank_cap),
                   w_cap=list(g.w_cap), policy=list(g.policy), fresh=set(), knobs_valid=valid)  # fmt: skip

    def copy(self) -> Genes:
        return Genes(v=self.v, placement=self.placement, cuts=list(self.cuts), forward=list(self.forward),
                     backward=list(self.backward), recompute=list(self.recompute), split=list(self.split),
                     cap=list(self.cap), rank_cap=list(self.rank_cap), w_cap=list(self.w_cap),
                     policy=list(self.policy), fresh=None if self.fresh is None else set(self.fresh),
                     knobs_valid=self.knobs_valid, caps_over=self.caps_over)  # fmt: skip

    def set_list(self, which: list[tuple[int, ...]], j: int, values: Sequence[int]) -> None:
        """Stage ``j``'s forward or backward list (``which``) becomes ``values``; a stage that does not
        recompute keeps its backward equal to its forward."""
        which[j] = tuple(values)
        if which is self.forward and not self.recompute[j]:
            self.backward[j] = which[j]
        if self.fresh is not None:
            self.fresh.add(j)

    def to_genome(self, rules: Rules) -> Genome:
        """The genome, repaired (see :func:`~umsearch.search.genome.repair`)."""
        ready = self.fresh is not None and self.knobs_valid
        if ready:  # only the fresh lists and the caps can break the rules: mend them before the genome is built
            repair_lists(self.forward, self.backward, self.recompute, self.fresh or (), rules)
            if self.caps_over:
                self.cap = [min(c, rules.batch) for c in self.cap]
                self.rank_cap = [min(c, rules.batch * self.v) for c in self.rank_cap]
        g = Genome(v=self.v, placement=self.placement, cuts=tuple(self.cuts), forward=tuple(self.forward),
                   backward=tuple(self.backward), recompute=tuple(self.recompute), split=tuple(self.split),
                   cap=tuple(self.cap), rank_cap=tuple(self.rank_cap), w_cap=tuple(self.w_cap),
                   policy=tuple(self.policy))  # fmt: skip
        return g if ready else repair(g, rules, self.fresh)


def _split(seq: list[int], rules: Rules, rng: Rng) -> list[int]:
    big = [j for j, v in enumerate(seq) if v > 1]
    if not big:
        return seq
    j = big[rng.randrange(len(big))]
    a = seq[j] // 2 if rng.random() < 0.5 else rng.randrange(1, seq[j])
    return seq[:j] + [a, seq[j] - a] + seq[j + 1 :]


def _merge(seq: list[int], rules: Rules, rng: Rng) -> list[int]:
    if len(seq) < 2:
        return seq
    j = rng.randrange(len(seq) - 1)
    return seq[:j] + [seq[j] + seq[j + 1]] + seq[j + 2 :]


def _shift(seq: list[int], rules: Rules, rng: Rng) -> list[int]:
    """Move a few samples across one boundary between neighbouring microbatches."""
    if len(seq) < 2:
        return seq
    j = rng.randrange(len(seq) - 1)
    d = rng.randrange(1, max(2, min(seq[j], seq[j + 1]) // 2 + 1))
    d = -d if rng.random() < 0.5 else d
    a, b = seq[j] + d, seq[j + 1] - d
    return seq if a < 1 or b < 1 else seq[:j] + [a, b] + seq[j + 2 :]


def _edge(seq: list[int], rules: Rules, rng: Rng) -> list[int]:
    """Rescale the first or last microbatch (pipeline fill and drain), its neighbour absorbing the change."""
    if len(seq) < 2:
        return seq
    j, k = (0, 1) if rng.random() < 0.5 else (len(seq) - 1, len(seq) - 2)
    new = max(1, int(round(seq[j] * rng.choice([0.5, 0.75, 1.25, 1.5]))))
    rest = seq[k] - (new - seq[j])
    if rest < 1:
        return seq
    out = list(seq)
    out[j], out[k] = new, rest
    return out


def _rescale(seq: list[int], rules: Rules, rng: Rng) -> list[int]:
    """Every microbatch scaled by one factor: fewer, larger ones or more, smaller ones."""
    f = rng.choice([0.5, 0.67, 0.8, 1.25, 1.5, 2.0])
    return [max(1, int(round(v * f))) for v in seq]


def random_shape(rules: Rules, rng: Rng) -> tuple[int, ...]:
    """A random ramp-shaped list (see :func:`umsearch.search.genome.shaped_sequence`)."""
    body = int(rules.sizes[rng.randrange(len(rules.sizes))])
    head, tail = rng.randrange(1, body + 1), rng.randrange(1, body + 1)
    return shaped_sequence(rules, body, head, rng.randrange(0, 4), tail, rng.randrange(0, 4))


def _reshape(seq: list[int], rules: Rules, rng: Rng) -> list[int]:
    return list(random_shape(rules, rng))


ListMove = Callable[[list[int], Rules, Rng], list[int]]
LIST_MOVES: tuple[ListMove, ...] = (_split, _merge, _shift, _shift, _edge, _edge, _rescale, _reshape)


def list_move(g: Genes, rules: Rules, rng: Rng) -> None:
    """One edit of one microbatch list, on one stage or on every stage sharing it."""
    s = rng.randrange(len(g.forward))
    lists = g.backward if g.recompute[s] and rng.random() < 0.5 else g.forward
    old = lists[s]
    new = LIST_MOVES[rng.randrange(len(LIST_MOVES))](list(old), rules, rng)
    targets = [t for t in range(len(lists)) if lists[t] == old] if rng.random() < SHARED_PROB else [s]
    for t in targets:
        g.set_list(lists, t, new)


def copy_list(g: Genes, rules: Rules, rng: Rng) -> None:
    """A stage's forward list copied to its neighbours, or to every stage."""
    s = rng.randrange(len(g.forward))
    S = len(g.forward)
    targets = list(range(S)) if rng.random() < 0.5 else [t for t in (s - 1, s + 1) if 0 <= t < S]
    for t in targets:
        g.set_list(g.forward, t, g.forward[s])


def cut_move(g: Genes, rules: Rules, rng: Rng) -> None:
    """One stage boundary moved by one or a few layers."""
    if len(g.cuts) < 3:
        return
    i = rng.randrange(1, len(g.cuts) - 1)
    step = 1 if rng.random() < 0.7 else rng.randrange(2, 4)
    g.cuts[i] += step if rng.random() < 0.5 else -step
    if not g.cuts[i - 1] < g.cuts[i] < g.cuts[i + 1]:
        g.knobs_valid = False  # the cuts crossed: the repair moves them apart


def cap_move(g: Genes, rules: Rules, rng: Rng) -> None:
    """One stage or rank (or all of them) may run further ahead, or less far."""
    caps = g.rank_cap if rng.random() < 0.6 else g.cap
    f = rng.choice([0.5, 0.75, 0.9, 1.1, 1.33, 2.0])
    which = range(len(caps)) if rng.random() < 0.3 else [rng.randrange(len(caps))]
    ceiling = rules.batch * (g.v if caps is g.rank_cap else 1)
    for j in which:
        caps[j] = max(1, int(round(caps[j] * f)) + (1 if f > 1 else -1 if caps[j] > 1 else 0))
        g.caps_over |= caps[j] > ceiling


def rank_knob_move(g: Genes, rules: Rules, rng: Rng) -> None:
    """One rank's weight-gradient cap changes, or it picks its actions by another policy."""
    r = rng.randrange(len(g.w_cap))
    if rng.random() < 0.5:
        g.policy[r] = (g.policy[r] + rng.randrange(1, POLICY_COUNT)) % POLICY_COUNT
    else:
        g.w_cap[r] = max(1, g.w_cap[r] + rng.choice([-2, -1, 1, 2, 4]))


def split_move(g: Genes, rules: Rules, rng: Rng) -> None:
    """Split backwards on or off: one stage, or all stages at once."""
    if rng.random() < 0.5:
        value = not all(g.split)
        g.split = [value] * len(g.split)
    else:
        j = rng.randrange(len(g.split))
        g.split[j] = not g.split[j]


def recompute_move(g: Genes, rules: Rules, rng: Rng) -> None:
    """Toggle recompute on one stage; a stage turning it on starts with backward = forward."""
    s = rng.randrange(len(g.recompute))
    g.recompute[s] = not g.recompute[s]
    g.backward[s] = g.forward[s]


def memory_move(g: Genes, rules: Rules, rng: Rng) -> None:
    """Lower the memory of the stage whose stash peaks (its stash per sample times its largest
    microbatch where the stash is held): recompute it, halve its microbatches where the stash is held,
    or let it and its rank run fewer samples ahead. What a genome over the memory limit needs first."""
    cuts = repair_cuts(g.cuts, len(g.forward), rules.num_layers)
    stash = rules.stage_stash(cuts)
    held = [g.backward[j] if g.recompute[j] else g.forward[j] for j in range(len(stash))]
    peak = [s * max(h, default=0) for s, h in zip(stash, held, strict=True)]
    j = max(range(len(peak)), key=lambda i: (peak[i], -i))
    roll = rng.random()
    if rules.recompute and not g.recompute[j] and roll < 0.4:
        g.recompute[j] = True
        g.backward[j] = g.forward[j]
        if g.fresh is not None:
            g.fresh.add(j)
    elif roll < 0.8:
        halves = [h for v in held[j] for h in (v // 2, v - v // 2) if h > 0]
        g.set_list(g.backward if g.recompute[j] else g.forward, j, halves)
    else:
        r = rules.placement_of(g.v, g.placement)[j] if len(g.rank_cap) == rules.ranks else 0
        g.cap[j] = max(1, g.cap[j] // 2)
        g.rank_cap[r] = max(1, g.rank_cap[r] // 2)


def structure_move(g: Genes, rules: Rules, rng: Rng) -> None:
    """Another number of chunks per rank, or the other placement: new balanced-ish cuts, lists and
    knobs carried over stage by stage in proportion."""
    options = [(v, p) for v in rules.stages_per_rank for p in (rules.placements if v > 1 else ("loop",))
               if (v, p) != (g.v, g.placement if g.v > 1 else "loop")]  # fmt: skip
    if not options:
        return
    v, p = options[rng.randrange(len(options))]
    S_old, S = len(g.forward), rules.ranks * v
    pick = [min(S_old - 1, j * S_old // S) for j in range(S)]
    L = rules.num_layers
    g.cuts = [round(j * L / S) for j in range(S + 1)]
    g.forward = [g.forward[i] for i in pick]
    g.backward = [g.backward[i] for i in pick]
    g.fresh = None
    g.recompute = [g.recompute[i] for i in pick]
    g.split = [g.split[i] for i in pick]
    g.v, g.placement = v, p
    g.cap = [rules.batch] * S
    g.rank_cap = list(default_rank_caps(rules, v, g.forward))


def list_edits(seq: Sequence[int]) -> list[list[int]]:
    """Every one-step edit of a microbatch list: one sample moved across each boundary either way, each
    neighbouring pair merged, each microbatch halved (the rules may still snap the result)."""
    s = list(seq)
    out: list[list[int]] = []
    for j in range(len(s) - 1):
        for d in (1, -1):
            if s[j] + d >= 1 and s[j + 1] - d >= 1:
                out.append(s[:j] + [s[j] + d, s[j + 1] - d] + s[j + 2 :])
        out.append(s[:j] + [s[j] + s[j + 1]] + s[j + 2 :])
    out += [s[:j] + [v // 2, v - v // 2] + s[j + 1 :] for j, v in enumerate(s) if v > 1]
    return out


def list_neighbours(g: Genome, rules: Rules) -> list[Genome]:
    """Every distinct genome one :func:`list_edits` edit away from ``g`` (valid): each distinct forward list
    edited on all the stages that share it, and on each of them alone. Deterministic, in a fixed order."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for j, f in enumerate(g.forward):
        groups.setdefault(f, []).append(j)
    out: dict[Genome, None] = {}
    for seq, stages in groups.items():
        targets = [stages] + ([[j] for j in stages] if len(stages) > 1 else [])
        for edit in list_edits(seq):
            for chosen in targets:
                genes = Genes.of(g, valid=True)
                for j in chosen:
                    genes.set_list(genes.forward, j, edit)
                out[genes.to_genome(rules)] = None
    out.pop(g, None)
    return list(out)


def cut_neighbours(g: Genome, rules: Rules, moved: int) -> list[Genome]:
    """Every genome with ``moved`` distinct stage boundaries of ``g`` (valid) each moved by one layer, either
    way, the stages keeping at least one layer each; everything else as in ``g``. Deterministic, in a fixed
    order. A cut's best place depends on the lists and the lists' on the cuts, so a descent tries these as
    starts of list descents (:func:`umsearch.search.local.refine`)."""
    shifts = [(i, d) for i in range(1, len(g.cuts) - 1) for d in (-1, 1)]
    out: dict[Genome, None] = {}
    for combo in itertools.combinations(shifts, moved):
        cuts = list(g.cuts)
        for i, d in combo:
            cuts[i] += d
        if len({i for i, _ in combo}) == moved and strict_cuts(cuts, rules):
            out[replace(g, cuts=tuple(cuts))] = None
    return list(out)


PlanMove = Callable[[Genes, Rules, Rng], None]


def moves_for(rules: Rules) -> tuple[PlanMove, ...]:
    """The moves that can change something under ``rules``, weighted by repetition (worked out once per rules)."""
    table: tuple[PlanMove, ...] | None = rules.memo.get("moves")
    if table is None:
        table = rules.memo["moves"] = _moves_for(rules)
    return table


def _moves_for(rules: Rules) -> tuple[PlanMove, ...]:
    moves: list[PlanMove] = [list_move, list_move, list_move, list_move, copy_list, cut_move, cut_move,
                             cap_move, cap_move, rank_knob_move]  # fmt: skip
    if rules.split:
        moves.append(split_move)
    if rules.recompute:
        moves.append(recompute_move)
    if rules.memory_binds and any(rules.stash):
        moves += [memory_move, memory_move]
    if len(rules.stages_per_rank) > 1 or len(rules.placements) > 1:
        moves.append(structure_move)
    return tuple(moves)


def neighbour(g: Genome, rules: Rules, rng: Rng, moves: int = 1, *, valid: bool = False) -> Genome:
    """``g`` after ``moves`` random moves, repaired; ``valid``: ``g`` is known to obey ``rules`` (the
    repair then checks only what the moves touched). The same genome either way."""
    table = moves_for(rules)
    genes = Genes.of(g, valid)
    for _ in range(moves):
        table[rng.randrange(len(table))](genes, rules, rng)
    return genes.to_genome(rules)
