"""The genome: a plan's structure plus the knobs of the order generator, and the rules it obeys.

A :class:`Genome` says how many chunks each rank holds and how they are
placed, where the model is cut, every stage's forward and backward
microbatch lists, which stages recompute and which split their backwards into
I and W, and the knobs :mod:`umsearch.search.orders` turns into every rank's
action order: per stage how many samples may be in flight, per rank how many
weight gradients may wait and whether forwards prefer the deeper chunk.
Variation operators may leave a genome breaking the space's :class:`Rules`
(a list not summing to ``B``, too many microbatches, crossed cuts);
:func:`repair` maps any genome to the nearest valid one, so every candidate
becomes a valid plan.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

from umsearch.core.profile import Profile
from umsearch.core.schedules import placement
from umsearch.errors import SearchSpaceError
from umsearch.search.space import SearchSpace

POLICY_COUNT = 5
"""Per-rank policies of the order generator (:data:`umsearch.search.orders.POLICIES`)."""


@dataclass(frozen=True, kw_only=True)
class Rules:
    """What every candidate of one search space satisfies."""

    num_layers: int
    """Layers L of the profile."""
    ranks: int
    """Ranks R."""
    batch: int
    """Global batch B."""
    sizes: tuple[int, ...]
    """Allowed microbatch sizes, ascending; one remainder per list may fall outside."""
    max_count: int
    """Most microbatches per list."""
    stages_per_rank: tuple[int, ...]
    """Chunks per rank allowed (each at most L / R)."""
    placements: tuple[str, ...]
    """``loop`` and/or ``vshape`` (used when a rank holds several chunks)."""
    split: bool
    """Whether backwards may split into I and W (the space allows it and the profile has the times)."""
    recompute: bool
    """Whether a stage may recompute."""
    memory_limit: float = math.inf
    """Per-device memory limit (bytes): what the lower bound (:mod:`~umsearch.search.bound`) may assume."""
    stash: tuple[float, ...] = ()
    """Per layer, stash bytes per sample (empty: unknown), for moves that lower a stage's memory."""
    all_peer_counts: bool = True
    """Whether the baselines try the looped peers at every stage count torch accepts (``[schedule]
    peer_stage_counts = "all"``) or only at the space's own."""
    memory_binds: bool = False
    """Whether the limit is below GPipe's worst case on a balanced split (``1/R`` of the training state
    and of ``B`` samples' stash per rank): only then do moves aim at memory."""

    @classmethod
    def of(cls, space: SearchSpace, profile: Profile) -> Rules:
        """The rules of ``space`` for ``profile``; refuses impossible spaces with the fix."""
        L, R = profile.num_layers, space.ranks
        if R > L:
            raise SearchSpaceError(f"ranks = {R} but the profile has only {L} layers; use at most {L}")
        spr = tuple(v for v in space.schedule.stages_per_rank if R * v <= L)
        if not spr:
            raise SearchSpaceError(
                f"stages_per_rank = {list(space.schedule.stages_per_rank)} needs at least {R * min(space.schedule.stages_per_rank)} "
                f"layers on {R} ranks but the profile has {L}; allow 1 stage per rank"
            )
        sizes = tuple(space.microbatch_sizes)
        if sizes[-1] * space.microbatch.max_count < space.global_batch:
            raise SearchSpaceError(
                f"microbatch.max_count = {space.microbatch.max_count} microbatches of at most {sizes[-1]} samples "
                f"cannot hold global_batch = {space.global_batch}; raise microbatch.max_count or microbatch.max"
            )
        split = space.schedule.split_backward and all(lay.has_split for lay in profile.layers)
        return cls(num_layers=L, ranks=R, batch=space.global_batch, sizes=sizes, max_count=space.microbatch.max_count,
                   stages_per_rank=spr, placements=space.schedule.placements, split=split, recompute=space.schedule.recompute,
                   memory_limit=space.memory_limit, stash=tuple(float(lay.stash_bytes) for lay in profile.layers),
                   memory_binds=_binds(space, profile),
                   all_peer_counts=space.schedule.peer_stage_counts == "all")  # fmt: skip

    @property
    def largest(self) -> int:
        return self.sizes[-1]

    @cached_property
    def snap_table(self) -> tuple[int, ...]:
        """``snap_table[v]``: the allowed size nearest ``v`` (the smaller on a tie), for ``v <= largest``."""
        out = []
        for v in range(self.largest + 1):
            i = bisect_left(self.sizes, v)
            below, above = self.sizes[max(i - 1, 0)], self.sizes[min(i, len(self.sizes) - 1)]
            out.append(above if above - v < v - below else below)
        return tuple(out)

    @cached_property
    def allowed(self) -> frozenset[int]:
        return frozenset(self.sizes)

    def valid_sequence(self, seq: Sequence[int]) -> bool:
        """Whether ``seq`` already obeys the rules (a fast check: most edited lists do)."""
        if not 0 < len(seq) <= self.max_count or sum(seq) != self.batch or not 1 <= seq[-1] <= self.largest:
            return False
        return self.allowed.issuperset(seq[:-1])

    @cached_property
    def _repaired(self) -> dict[tuple[int, ...], tuple[int, ...]]:
        return {}

    def fixed(self, seq: tuple[int, ...]) -> tuple[int, ...]:
        """:func:`repair_sequence` of ``seq``, remembered: the search repairs the same lists again and again."""
        out = self._repaired.get(seq)
        if out is None:
            if len(self._repaired) > 200_000:
                self._repaired.clear()
            out = self._repaired[seq] = repair_sequence(seq, self)
        return out

    def stage_stash(self, cuts: Sequence[int]) -> list[float]:
        """Per stage ``[cuts[j], cuts[j+1])``, its stash bytes per sample (zeros when unknown)."""
        if not self.stash:
            return [0.0] * (len(cuts) - 1)
        return [sum(self.stash[a:b]) for a, b in zip(cuts, cuts[1:], strict=False)]

    @cached_property
    def _placements(self) -> dict[tuple[int, str], tuple[int, ...]]:
        return {}

    @cached_property
    def memo(self) -> dict[str, Any]:
        """What other modules work out once per rules and ask for on every neighbour (the moves that apply)."""
        return {}

    def placement_of(self, v: int, kind: str) -> tuple[int, ...]:
        """The rank of each of the ``R * v`` stages (remembered: every candidate scored asks)."""
        out = self._placements.get((v, kind))
        if out is None:
            out = self._placements[v, kind] = placement("vshape" if v > 1 and kind == "vshape" else "loop", self.ranks, v)
        return out


def _binds(space: SearchSpace, profile: Profile) -> bool:
    lay = profile.layers
    worst = (space.state_factor * sum(x.param_bytes for x in lay) + sum(x.stash_bytes for x in lay) * space.global_batch)
    fixed = sum(x.stash_fixed_bytes for x in lay) * space.global_batch  # version 2.3's per-microbatch part, at most B
    return worst / space.ranks + fixed > space.memory_limit


@dataclass(frozen=True, kw_only=True)
class Genome:
    """One candidate: structure and order knobs (hashable; equal genomes are duplicates)."""

    v: int
    """Chunks (stages) per rank; the plan has ``R * v`` stages."""
    placement: str
    """``loop`` or ``vshape`` (irrelevant when v = 1)."""
    cuts: tuple[int, ...]
    """Stage boundaries ``0 = c0 < ... < cS = L``."""
    forward: tuple[tuple[int, ...], ...]
    """Per stage, its forward microbatch sizes."""
    backward: tuple[tuple[int, ...], ...]
    """Per stage, its backward microbatch sizes (the forward list unless it recomputes)."""
    recompute: tuple[bool, ...]
    """Per stage, whether it recomputes."""
    split: tuple[bool, ...]
    """Per stage, whether its backwards run as I then W."""
    cap: tuple[int, ...]
    """Per stage, samples it may hold forwarded but not yet back-propagated (I or B) before it waits."""
    rank_cap: tuple[int, ...]
    """Per rank, the same limit over all its stages together (what sets a 1F1B-like steady state)."""
    w_cap: tuple[int, ...]
    """Per rank, weight gradients that may wait before W goes ahead of new forwards."""
    policy: tuple[int, ...]
    """Per rank, how it picks among ready actions (:data:`umsearch.search.orders.POLICIES`)."""

    @property
    def stages(self) -> int:
        return len(self.cuts) - 1

    def __hash__(self) -> int:
        """The dataclass's hash of every field, computed once: a climb hashes each genome several times (its
        memo, the search's record of what it found), and a genome is some hundred small ints."""
        h: int | None = self.__dict__.get("_hash")
        if h is None:
            h = hash((self.v, self.placement, self.cuts, self.forward, self.backward, self.recompute, self.split,
                      self.cap, self.rank_cap, self.w_cap, self.policy))  # fmt: skip
            object.__setattr__(self, "_hash", h)
        return h

    def __getstate__(self) -> dict[str, object]:
        # Without the cached hash: a string's hash differs between processes (a chain's worker is another one).
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}


def greedy_split(batch: int, size: int) -> tuple[int, ...]:
    """``[size, ..., size, remainder]`` covering ``batch``."""
    q, r = divmod(batch, size)
    return (size,) * q + ((r,) if r else ())


def repair_sequence(seq: Sequence[int], rules: Rules) -> tuple[int, ...]:
    """The valid list closest to ``seq``: allowed sizes, sum ``B``, at most ``max_count`` entries.

    Sizes are snapped to allowed ones in order until the batch is covered (the
    one that overshoots is cut to the remainder); a short list is filled up
    with the largest size; a long one has its smallest neighbouring pairs
    merged. Only the last microbatch may be a remainder outside the allowed sizes.
    """
    if rules.valid_sequence(seq):
        return tuple(seq)
    out: list[int] = []
    left = rules.batch
    snapped, top = rules.snap_table, rules.largest
    for v in seq:
        if left == 0:
            break
        take = v if v == left and v <= top else min(snapped[min(max(v, 0), top)], left)
        out.append(take)
        left -= take
    while left > 0:
        take = min(rules.largest, left)
        out.append(take)
        left -= take
    while len(out) > rules.max_count:
        j = min(range(len(out) - 1), key=lambda i: out[i] + out[i + 1])
        merged = out[j] + out[j + 1]
        if merged > rules.largest or (j + 1 < len(out) - 1 and merged not in rules.allowed):
            return greedy_split(rules.batch, rules.largest)
        out[j : j + 2] = [merged]
    return tuple(out)


def repair_cuts(cuts: Sequence[int], stages: int, num_layers: int) -> tuple[int, ...]:
    """``stages + 1`` boundaries, strictly increasing from 0 to L, as close to ``cuts``' inner ones as possible."""
    L = num_layers
    inner = sorted(int(c) for c in cuts[1:-1])[: stages - 1]
    while len(inner) < stages - 1:  # too few: split the widest stages
        bounds = [0, *inner, L]
        j = max(range(len(bounds) - 1), key=lambda i: bounds[i + 1] - bounds[i])
        inner = sorted([*inner, (bounds[j] + bounds[j + 1]) // 2])
    for i in range(len(inner)):  # lift crossed or too-low cuts
        inner[i] = max(inner[i], i + 1, inner[i - 1] + 1 if i else 1)
    for i in range(len(inner) - 1, -1, -1):  # then push down the ones that ran past the end
        inner[i] = min(inner[i], L - (stages - 1 - i), inner[i + 1] - 1 if i + 1 < len(inner) else L - 1)
    return (0, *inner, L)


def _fit(values: Sequence[int], n: int, fill: int) -> tuple[int, ...]:
    """``values`` cut or padded (with ``fill``) to length ``n``."""
    out = tuple(values[:n])
    return out + (fill,) * (n - len(out))


def repair(g: Genome, rules: Rules, fresh: Collection[int] | None = None) -> Genome:
    """``g`` made valid under ``rules`` (the same object when it already is).

    ``fresh``: when given, only the lists of these stages may break the rules
    (the others come unchanged from a valid genome of the same structure), so
    only they are checked: the search repairs every neighbour it makes.
    """
    if fresh is not None and _knobs_ok(g, rules):
        f_lists, b_lists = list(g.forward), list(g.backward)
        repair_lists(f_lists, b_lists, g.recompute, fresh, rules)
        if f_lists == list(g.forward) and b_lists == list(g.backward):
            return g
        return replace(g, forward=tuple(f_lists), backward=tuple(b_lists))
    v = g.v if g.v in rules.stages_per_rank else min(rules.stages_per_rank, key=lambda x: (abs(x - g.v), x))
    kind = g.placement if g.placement in rules.placements else rules.placements[0]
    S = rules.ranks * v
    if fresh is not None and (v != g.v or len(g.forward) != S or len(g.backward) != S):
        fresh = None
    cuts = repair_cuts(g.cuts, S, rules.num_layers) if len(g.cuts) != S + 1 or not strict_cuts(g.cuts, rules) else g.cuts
    rec = tuple(rules.recompute and j < len(g.recompute) and g.recompute[j] for j in range(S))
    if fresh is None:
        fwd = tuple(rules.fixed(tuple(g.forward[min(j, len(g.forward) - 1)]) if g.forward else ()) for j in range(S))
        bwd = tuple(rules.fixed(tuple(g.backward[j])) if rec[j] and j < len(g.backward) else fwd[j] for j in range(S))
    else:
        fwd = tuple(rules.fixed(f) if j in fresh else f for j, f in enumerate(g.forward))
        bwd = tuple((rules.fixed(b) if j in fresh else b) if rec[j] else fwd[j] for j, b in enumerate(g.backward))
    split = tuple(rules.split and j < len(g.split) and g.split[j] for j in range(S))
    cap = tuple(max(1, min(c, rules.batch)) for c in _fit(g.cap, S, rules.batch))
    rank_cap = tuple(max(1, min(c, rules.batch * v)) for c in _fit(g.rank_cap, rules.ranks, rules.batch * v))
    w_cap = tuple(max(1, c) for c in _fit(g.w_cap, rules.ranks, 1))
    policy = tuple(int(d) % POLICY_COUNT for d in _fit(g.policy, rules.ranks, 0))
    fixed = Genome(v=v, placement=kind, cuts=cuts, forward=fwd, backward=bwd, recompute=rec, split=split,
                   cap=cap, rank_cap=rank_cap, w_cap=w_cap, policy=policy)  # fmt: skip
    return g if fixed == g else fixed


def repair_lists(forward: list[tuple[int, ...]], backward: list[tuple[int, ...]], recompute: Sequence[bool],
                 fresh: Collection[int], rules: Rules) -> None:  # fmt: skip
    """The ``fresh`` stages' lists made valid in place (a stage that does not recompute gets its forward
    list as its backward one)."""
    for j in fresh:
        forward[j] = rules.fixed(forward[j])
        backward[j] = rules.fixed(backward[j]) if recompute[j] else forward[j]


def _knobs_ok(g: Genome, rules: Rules) -> bool:
    """Everything but the lists obeys ``rules`` (checked with C-speed builtins: the common case)."""
    R, S, B = rules.ranks, rules.ranks * g.v, rules.batch
    return (g.v in rules.stages_per_rank and g.placement in rules.placements and len(g.cuts) == S + 1
            and len(g.forward) == S and len(g.backward) == S and len(g.recompute) == S and len(g.split) == S
            and len(g.cap) == S and len(g.rank_cap) == R and len(g.w_cap) == R and len(g.policy) == R
            and strict_cuts(g.cuts, rules) and (rules.recompute or not any(g.recompute))
            and (rules.split or not any(g.split)) and min(g.cap) >= 1 and max(g.cap) <= B
            and min(g.rank_cap) >= 1 and max(g.rank_cap) <= B * g.v and min(g.w_cap) >= 1
            and min(g.policy) >= 0 and max(g.policy) < POLICY_COUNT)  # fmt: skip


def strict_cuts(cuts: Sequence[int], rules: Rules) -> bool:
    """Whether ``cuts`` run from 0 to ``L`` with every stage holding at least one layer."""
    return cuts[0] == 0 and cuts[-1] == rules.num_layers and all(a < b for a, b in zip(cuts, cuts[1:], strict=False))


def shaped_sequence(rules: Rules, body: int, head: int, up: int, tail: int, down: int) -> tuple[int, ...]:
    """A ramp: ``up`` microbatches rising from ``head`` towards ``body``, body-sized ones, then
    ``down`` falling towards ``tail``; repaired to sum to B.

    Small first microbatches shorten pipeline fill, small last ones shorten the
    drain, and the body runs at the stage's efficient size.
    """
    ramp_up = [head + (body - head) * i // (up + 1) for i in range(up + 1)][:up] if up else []
    ramp_down = [max(1, body - (body - tail) * (i + 1) // (down + 1)) for i in range(down)] if down else []
    middle = rules.batch - sum(ramp_up) - sum(ramp_down)
    body_part = list(greedy_split(middle, max(1, body))) if middle > 0 else []
    # An overshooting ramp is cut at B by the repair, which drops the fall.
    return repair_sequence([max(1, v) for v in ramp_up] + body_part + ramp_down, rules)


def default_rank_caps(rules: Rules, v: int, forward: Sequence[Sequence[int]]) -> tuple[int, ...]:
    """1F1B-like rank caps: as many microbatches in flight as torch's schedules warm up with on the
    rank (``R - r`` for one chunk per rank; ``(v-1) R + 2 (R-1-r) + 1`` for v interleaved chunks)."""
    R = rules.ranks
    size = max((max(f) for f in forward if f), default=1)
    count = [R - r if v == 1 else (v - 1) * R + 2 * (R - 1 - r) + 1 for r in range(R)]
    return tuple(min(rules.batch * v, c * size) for c in count)


def genome_of(rules: Rules, v: int, kind: str, cuts: Sequence[int], forward: Sequence[Sequence[int]], *,
              split: bool = False, recompute: Sequence[bool] | None = None,
              backward: Sequence[Sequence[int]] | None = None) -> Genome:  # fmt: skip
    """A repaired genome with default knobs: no stage cap, :func:`default_rank_caps`, one waiting W
    per rank, policy 0."""
    S = rules.ranks * v
    fwd = tuple(tuple(f) for f in forward)
    g = Genome(v=v, placement=kind, cuts=tuple(cuts), forward=fwd, backward=tuple(tuple(b) for b in (backward or fwd)),
               recompute=tuple(recompute or (False,) * S), split=(split,) * S, cap=(rules.batch,) * S,
               rank_cap=default_rank_caps(rules, v, fwd), w_cap=(1,) * rules.ranks,
               policy=(0,) * rules.ranks)  # fmt: skip
    return repair(g, rules)

