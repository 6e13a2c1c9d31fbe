"""Generators of the action-list families of docs/model.md section 6.

Two kinds of family live here, both pure functions of small integers and
size lists (no torch import: the simulators and the search import this
module on machines without torch's distributed package):

- :func:`warmup_rule` (section 6.1): one stage on its own rank, possibly with
  unequal microbatches; ``warmup = len(forward)`` is GPipe and
  ``warmup = ranks - stage`` is 1F1B. This is how a ``umsearch.plan/1`` file is
  read.
- The peer schedules (section 6.2): every microbatch of equal size, the order
  of every compute action exactly as torch.distributed.pipelining 2.13 runs it.
  :data:`PEER_SCHEDULES` names them by torch's names and says which shapes
  torch accepts; the module-level functions (:func:`gpipe`,
  :func:`one_f_one_b`, ...) generate them.

A generated schedule is one tuple of :class:`~umsearch.core.actions.Action`
per rank, compute actions only (``F``, ``B``, ``I``, ``W``): torch's idle
steps, sends, receives and gradient reductions are not part of the model.
Where torch's own recorded ``pipeline_order`` and what its runtime executes
disagree (``Schedule1F1B``'s last rank in 2.13 records ``F1`` .. ``FM``
instead of ``F0`` .. ``F(M-1)``), the functions here follow what torch
executes; ``tests/core/test_schedules_torch.py`` checks both.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from umsearch.core.actions import Action, Kind

RankActions = tuple[tuple[Action, ...], ...]
"""One ordered tuple of actions per rank, rank 0 first."""

PlacementKind = Literal["loop", "vshape"]
"""``loop``: stage j on rank ``j mod R``; ``vshape``: down the ranks and back up (docs/model.md section 2)."""

PLACEMENTS: tuple[PlacementKind, ...] = ("loop", "vshape")


# ---------------------------------------------------------------------------
# docs/model.md 6.1: the warmup rule
# ---------------------------------------------------------------------------


def _check_sizes(name: str, sizes: Sequence[int]) -> None:
    if len(sizes) == 0:
        raise ValueError(f"{name} is empty; a stage needs at least one microbatch")
    for k, size in enumerate(sizes):
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"{name}[{k}] = {size!r}; microbatch sizes must be integers >= 1")


def warmup_rule(
    stage: int, forward: Sequence[int], backward: Sequence[int], warmup: int
) -> tuple[Action, ...]:
    """Stage ``stage``'s actions on its own rank under the warmup rule (docs/model.md 6.1).

    For each backward microbatch k in order, the stage first runs forwards
    until ``max(need(k), min(k + warmup, len(forward)))`` of them have run,
    ``need(k)`` being the fewest forwards that hold every sample of backward
    microbatches ``0..k``, and then runs ``{stage}B{k}``. The result holds
    every forward and every backward of the stage exactly once, each
    backward after all the forwards holding its samples.

    ``forward`` and ``backward`` are the stage's microbatch sizes in sample
    order; they must be positive and sum to the same batch. ``warmup`` must be
    at least 1 (the rule treats smaller values as 1, but a plan refuses them,
    so they are refused here too rather than passing silently).

    Linear in ``len(forward) + len(backward)``: need(k) only grows with k, so
    one pointer walks the forward list once.
    """
    _check_sizes("forward", forward)
    _check_sizes("backward", backward)
    if sum(forward) != sum(backward):
        raise ValueError(
            f"forward sums to {sum(forward)} samples but backward to {sum(backward)}; "
            "both lists must partition the same batch"
        )
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 1:
        raise ValueError(f"warmup = {warmup!r}; it must be an integer >= 1")
    n = len(forward)
    out: list[Action] = []
    ran = 0  # forwards emitted so far
    forwarded = 0  # samples those forwards hold
    needed = 0  # samples of backward microbatches 0..k
    for k, size in enumerate(backward):
        needed += size
        target = min(k + warmup, n)
        # Both conditions of the max(): the warmup target and the covering of
        # backward k's samples; `ran` never decreases, so neither re-runs a forward.
        while ran < target or forwarded < needed:
            out.append(Action(stage, "F", ran))
            forwarded += forward[ran]
            ran += 1
        out.append(Action(stage, "B", k))
    # The last backward needs every sample, so every forward has run by now.
    assert ran == n
    return tuple(out)


# ---------------------------------------------------------------------------
# Placement (docs/model.md section 2)
# ---------------------------------------------------------------------------


def _check_positive(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} = {value!r}; it must be an integer >= 1")


def placement(kind: PlacementKind, ranks: int, stages_per_rank: int) -> tuple[int, ...]:
    """The rank of each stage ``0..ranks*stages_per_rank-1`` under placement ``kind``.

    ``loop`` (looped and interleaved schedules): stage j on rank ``j mod ranks``.
    ``vshape``: stages zigzag down the ranks and back up, so with two stages
    per rank stage j is on rank j for ``j < ranks`` and on ``2*ranks-1-j``
    after (docs/model.md section 2); more stages per rank keep zigzagging, as
    torch.distributed.pipelining's ``style="v"`` mapping does. Raises
    ValueError on an unknown kind or a count below 1.
    """
    _check_positive("ranks", ranks)
    _check_positive("stages_per_rank", stages_per_rank)
    stages = range(ranks * stages_per_rank)
    if kind == "loop":
        return tuple(j % ranks for j in stages)
    if kind == "vshape":
        # Even sweeps go down (rank = position in the sweep), odd sweeps come back up.
        return tuple(j % ranks if (j // ranks) % 2 == 0 else ranks - 1 - j % ranks for j in stages)
    raise ValueError(f"placement kind {kind!r} is unknown; use one of {', '.join(PLACEMENTS)}")


# ---------------------------------------------------------------------------
# Peer schedules (docs/model.md 6.2): builders. Each takes an already accepted
# shape (see PeerSchedule.accepts) and returns one action tuple per rank.
# ---------------------------------------------------------------------------


def _ones(n: int) -> list[int]:
    return [1] * n


def _build_gpipe(ranks: int, stages_per_rank: int, microbatches: int) -> RankActions:
    # Every forward before the first backward: the warmup rule with the largest warmup.
    m = microbatches
    return tuple(warmup_rule(r, _ones(m), _ones(m), m) for r in range(ranks))


def _build_1f1b(ranks: int, stages_per_rank: int, microbatches: int) -> RankActions:
    # torch's Schedule1F1B runs min(M, ranks - r) forwards before the first
    # backward on rank r and then alternates, which is the warmup rule with
    # warmup = ranks - r (the rule caps it at M itself).
    m = microbatches
    return tuple(warmup_rule(r, _ones(m), _ones(m), ranks - r) for r in range(ranks))


def _build_looped_bfs(ranks: int, stages_per_rank: int, microbatches: int) -> RankActions:
    out = []
    for r in range(ranks):
        mine = [r + i * ranks for i in range(stages_per_rank)]
        # Breadth first: a stage forwards every microbatch before the next
        # stage of the rank starts; backwards come back up the rank's stages
        # from the last one, each taking its microbatches last to first.
        fwd = [Action(s, "F", k) for s in mine for k in range(microbatches)]
        bwd = [Action(s, "B", k) for s in reversed(mine) for k in reversed(range(microbatches))]
        out.append(tuple(fwd + bwd))
    return tuple(out)


def _per_round(ranks: int, microbatches: int) -> int:
    """Microbatches per round of torch's interleaved schedules.

    torch cuts the microbatches into ``max(1, M // ranks)`` rounds of equal
    size (hence its divisibility rule, see :func:`_rounds_rule`); a rank's
    chunks take turns one round's worth of microbatches at a time.
    """
    return microbatches // max(1, microbatches // ranks)


def _build_interleaved(
    ranks: int, stages_per_rank: int, microbatches: int, *, zero_bubble: bool
) -> RankActions:
    v, m = stages_per_rank, microbatches
    p = _per_round(ranks, m)
    total = v * m  # forwards (and backwards) of one rank

    def slot(t: int) -> tuple[int, int]:
        # The t-th forward (or backward) of a rank falls in block t // p; the
        # blocks cycle through the rank's v chunks, so a chunk's earlier
        # microbatches are p per earlier cycle plus the offset in the block.
        block = t // p
        return block % v, (block // v) * p + t % p

    out = []
    for r in range(ranks):
        # Forwards run ahead of the first backward: enough to fill every chunk
        # but the last for one round, plus a margin per hop to the last rank
        # (two for 1F1B, one for zero bubble, whose W fills the rest).
        hop = 1 if zero_bubble else 2
        warm = min((v - 1) * p + hop * (ranks - 1 - r), total)

        def fwd(t: int, r: int = r) -> Action:
            chunk, mb = slot(t)
            return Action(chunk * ranks + r, "F", mb)

        def bwd(t: int, kind: Kind, r: int = r) -> Action:
            # Backwards visit the chunks in reverse: the last chunk's gradients come first.
            chunk, mb = slot(t)
            return Action((v - 1 - chunk) * ranks + r, kind, mb)

        acts = [fwd(t) for t in range(warm)]
        for q in range(total):
            # Steady state pairs forward warm+q with backward q; the last
            # `warm` backwards have no forward left to pair with.
            if warm + q < total:
                acts.append(fwd(warm + q))
            if not zero_bubble:
                acts.append(bwd(q, "B"))
                continue
            acts.append(bwd(q, "I"))
            # Rank r delays each weight gradient by r backwards (ZB1P): W of
            # backward q - r follows I of backward q.
            if q >= r:
                acts.append(bwd(q - r, "W"))
        if zero_bubble:
            acts.extend(bwd(q, "W") for q in range(max(0, total - r), total))
        out.append(tuple(acts))
    return tuple(out)


def _build_interleaved_1f1b(ranks: int, stages_per_rank: int, microbatches: int) -> RankActions:
    return _build_interleaved(ranks, stages_per_rank, microbatches, zero_bubble=False)


def _build_interleaved_zb(ranks: int, stages_per_rank: int, microbatches: int) -> RankActions:
    return _build_interleaved(ranks, stages_per_rank, microbatches, zero_bubble=True)


class _Emitter:
    """Appends actions, numbering each (stage, kind) stream's microbatches 0, 1, 2, ..."""

    def __init__(self) -> None:
        self.actions: list[Action] = []
        self.count: dict[tuple[int, Kind], int] = {}

    def __call__(self, stage: int, *kinds: Kind) -> None:
        for kind in kinds:
            k = self.count.get((stage, kind), 0)
            self.actions.append(Action(stage, kind, k))
            self.count[(stage, kind)] = k + 1

    def done(self, stage: int, kind: Kind) -> int:
        return self.count.get((stage, kind), 0)


def _build_zbv(ranks: int, stages_per_rank: int, microbatches: int) -> RankActions:
    # torch plans ZB-V for at least 2*ranks - 1 microbatches (enough to fill
    # the V) and then drops the actions of microbatches that do not exist.
    n = max(2 * ranks - 1, microbatches)
    out = []
    for r in range(ranks):
        down, up = r, 2 * ranks - 1 - r  # the rank's stage on the way down and on the way up
        emit = _Emitter()
        # Warmup: fill the way down, then interleave the way up's first
        # forwards, then start the way up's backwards (each I right before its W).
        for _ in range(2 * (ranks - r) - 1):
            emit(down, "F")
        for _ in range(r):
            emit(up, "F")
            emit(down, "F")
        for _ in range(ranks - r):
            emit(up, "F", "I", "W")
        # Steady state: one of everything per chunk until both chunks have
        # forwarded all n (the way down stops forwarding at n first).
        while emit.done(up, "F") < emit.done(down, "F") or emit.done(down, "F") < n:
            if emit.done(down, "F") < n:
                emit(down, "F")
            emit(down, "I", "W")
            emit(up, "F", "I", "W")
        # Cooldown: the remaining input gradients, weight gradients deferred
        # to the end where they fill the drain.
        for _ in range(r):
            emit(down, "I")
            emit(up, "I")
        for _ in range(ranks - r):
            emit(down, "I", "W")
        for stage in (up, down):
            while emit.done(stage, "W") < emit.done(stage, "I"):
                emit(stage, "W")
        out.append(tuple(a for a in emit.actions if a.mb < microbatches))
    return tuple(out)


# ---------------------------------------------------------------------------
# Microbatch rules torch 2.13 enforces
# ---------------------------------------------------------------------------


def _any_count(ranks: int, microbatches: int) -> str | None:
    return None


def _at_least_ranks(ranks: int, microbatches: int) -> str | None:
    if microbatches < ranks:
        return (
            f"microbatches = {microbatches} is fewer than ranks = {ranks}; "
            "torch's Schedule1F1B needs microbatches >= ranks (its number of stages)"
        )
    return None


def _rounds_rule(ranks: int, microbatches: int) -> str | None:
    rounds = max(1, microbatches // ranks)
    if microbatches % rounds != 0:
        ok = [m for m in range(max(1, microbatches - ranks), microbatches + ranks + 1)
              if m % max(1, m // ranks) == 0]  # fmt: skip
        below = max((m for m in ok if m < microbatches), default=None)
        above = min(m for m in ok if m > microbatches)
        near = f"{below} or {above}" if below is not None else str(above)
        return (
            f"microbatches = {microbatches} is not divisible by its number of rounds, "
            f"max(1, microbatches // ranks) = max(1, {microbatches} // {ranks}) = {rounds}; "
            f"torch's interleaved schedules split the microbatches into equal rounds "
            f"(nearest accepted counts: {near})"
        )
    return None


# ---------------------------------------------------------------------------
# The registry
# ---------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class PeerSchedule:
    """One of torch.distributed.pipelining's schedules, as umsearch generates it (docs/model.md 6.2)."""

    name: str
    """torch's name for it, as ``get_schedule_class`` takes it (``"Interleaved1F1B"``)."""
    torch_class: str
    """The class in ``torch.distributed.pipelining.schedules`` that runs it."""
    placement: PlacementKind
    """How stages are placed on ranks (see :func:`placement`)."""
    min_stages_per_rank: int
    """Fewest stages a rank may hold under this schedule."""
    max_stages_per_rank: int | None
    """Most stages a rank may hold, or None for no limit."""
    split_backward: bool
    """Whether backwards are split into ``I`` and ``W`` (True) or run whole as ``B``."""
    microbatch_rule: str
    """torch's constraint on the microbatch count, in words."""
    check_microbatches: Callable[[int, int], str | None]
    """``(ranks, microbatches) -> reason or None``: :attr:`microbatch_rule` as code."""
    build: Callable[[int, int, int], RankActions]
    """``(ranks, stages_per_rank, microbatches) -> actions``, for shapes :meth:`accepts` passes."""

    def accepts(self, ranks: int, stages_per_rank: int, microbatches: int) -> str | None:
        """None if torch 2.13 builds this schedule for the shape, else the reason it refuses.

        Besides torch's own rules every count must be an integer >= 1.
        """
        for field_name, value in (("ranks", ranks), ("stages_per_rank", stages_per_rank),
                                  ("microbatches", microbatches)):  # fmt: skip
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                return f"{field_name} = {value!r}; it must be an integer >= 1"
        lo, hi = self.min_stages_per_rank, self.max_stages_per_rank
        if stages_per_rank < lo or (hi is not None and stages_per_rank > hi):
            allowed = (f"exactly {lo}" if hi == lo else f"at least {lo}" if hi is None
                       else f"{lo} to {hi}")  # fmt: skip
            return (
                f"stages_per_rank = {stages_per_rank}; {self.name} ({self.torch_class}) "
                f"needs {allowed} stage{'' if hi == lo == 1 else 's'} per rank"
            )
        return self.check_microbatches(ranks, microbatches)

    def generate(self, ranks: int, stages_per_rank: int, microbatches: int) -> RankActions:
        """Every rank's compute actions in torch's order; ValueError naming the rule if refused."""
        reason = self.accepts(ranks, stages_per_rank, microbatches)
        if reason is not None:
            raise ValueError(f"{self.name}: {reason}")
        return self.build(ranks, stages_per_rank, microbatches)

    def stage_ranks(self, ranks: int, stages_per_rank: int) -> tuple[int, ...]:
        """The rank of each stage under this schedule's placement."""
        return placement(self.placement, ranks, stages_per_rank)


PEER_SCHEDULES: dict[str, PeerSchedule] = {
    s.name: s
    for s in (
        PeerSchedule(
            name="GPipe", torch_class="ScheduleGPipe", placement="loop",
            min_stages_per_rank=1, max_stages_per_rank=1, split_backward=False,
            microbatch_rule="any count", check_microbatches=_any_count, build=_build_gpipe,
        ),
        PeerSchedule(
            name="1F1B", torch_class="Schedule1F1B", placement="loop",
            min_stages_per_rank=1, max_stages_per_rank=1, split_backward=False,
            microbatch_rule="microbatches >= ranks", check_microbatches=_at_least_ranks,
            build=_build_1f1b,
        ),
        PeerSchedule(
            name="Interleaved1F1B", torch_class="ScheduleInterleaved1F1B", placement="loop",
            min_stages_per_rank=1, max_stages_per_rank=None, split_backward=False,
            microbatch_rule="microbatches divisible by max(1, microbatches // ranks)",
            check_microbatches=_rounds_rule, build=_build_interleaved_1f1b,
        ),
        PeerSchedule(
            name="LoopedBFS", torch_class="ScheduleLoopedBFS", placement="loop",
            min_stages_per_rank=1, max_stages_per_rank=None, split_backward=False,
            microbatch_rule="any count", check_microbatches=_any_count, build=_build_looped_bfs,
        ),
        PeerSchedule(
            name="InterleavedZeroBubble", torch_class="ScheduleInterleavedZeroBubble",
            placement="loop", min_stages_per_rank=1, max_stages_per_rank=None,
            split_backward=True,
            microbatch_rule="microbatches divisible by max(1, microbatches // ranks)",
            check_microbatches=_rounds_rule, build=_build_interleaved_zb,
        ),
        PeerSchedule(
            name="ZBVZeroBubble", torch_class="ScheduleZBVZeroBubble", placement="vshape",
            min_stages_per_rank=2, max_stages_per_rank=2, split_backward=True,
            microbatch_rule="any count", check_microbatches=_any_count, build=_build_zbv,
        ),
    )
}  # fmt: skip
"""The peer schedules by torch's names, in the order docs/model.md 6.2 lists them."""


# ---------------------------------------------------------------------------
# The public generators
# ---------------------------------------------------------------------------


def gpipe(ranks: int, microbatches: int) -> RankActions:
    """GPipe on ``ranks`` ranks, one stage each: all forwards, then all backwards in order."""
    return PEER_SCHEDULES["GPipe"].generate(ranks, 1, microbatches)


def one_f_one_b(ranks: int, microbatches: int) -> RankActions:
    """1F1B, one stage per rank: rank r warms up with ``ranks - r`` forwards, then alternates.

    torch requires ``microbatches >= ranks``; fewer raise ValueError.
    """
    return PEER_SCHEDULES["1F1B"].generate(ranks, 1, microbatches)


def interleaved_1f1b(ranks: int, stages_per_rank: int, microbatches: int) -> RankActions:
    """Interleaved 1F1B, looped placement, torch's order (depth first across a rank's chunks).

    torch requires ``microbatches`` divisible by ``max(1, microbatches // ranks)``.
    """
    return PEER_SCHEDULES["Interleaved1F1B"].generate(ranks, stages_per_rank, microbatches)


def looped_bfs(ranks: int, stages_per_rank: int, microbatches: int) -> RankActions:
    """Looped BFS, looped placement: each stage of a rank forwards every microbatch in turn.

    Backwards visit the rank's stages last to first, microbatches last to first.
    """
    return PEER_SCHEDULES["LoopedBFS"].generate(ranks, stages_per_rank, microbatches)


def interleaved_zero_bubble(ranks: int, stages_per_rank: int, microbatches: int) -> RankActions:
    """Interleaved zero bubble (ZB1P), looped placement, backwards split into I and W.

    torch requires ``microbatches`` divisible by ``max(1, microbatches // ranks)``.
    """
    return PEER_SCHEDULES["InterleavedZeroBubble"].generate(ranks, stages_per_rank, microbatches)


def zbv_zero_bubble(ranks: int, microbatches: int) -> RankActions:
    """ZB-V, two stages per rank in V-shape placement, backwards split into I and W."""
    return PEER_SCHEDULES["ZBVZeroBubble"].generate(ranks, 2, microbatches)
