"""The genome is the plan itself; this module holds the rules it obeys in a space, and its repair.

A genome is a :class:`~umsearch.core.plan.Plan` without ``predicted``: cuts, and per
stage its forward and backward lists, warmup and recompute flag. Variation
operators may leave a plan breaking the space's rules (a list not summing to
``B``, too many microbatches, a warmup outside ``1..len(forward)``, crossed
cuts); :func:`repair` maps any such plan to the nearest valid one, so every
candidate the evaluator sees passes :func:`umsearch.core.plan.validate_plan`.
Deadlocks are not repaired: they are scored infeasible.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from umsearch.core.errors import SearchSpaceError
from umsearch.core.plan import Plan, StagePlan
from umsearch.search.space import SearchSpace


@dataclass(frozen=True, kw_only=True)
class Rules:
    """What every candidate plan of one search space satisfies."""

    num_layers: int
    """Layers L of the profile."""
    stages: int
    """Pipeline stages S."""
    batch: int
    """Global batch B."""
    sizes: tuple[int, ...]
    """Allowed microbatch sizes, ascending; one remainder per list may fall outside."""
    max_count: int
    """Most microbatches per list."""
    schedule: str
    """``gpipe`` (warmup = all), ``1f1b`` (warmup = S - s) or ``any`` (warmup free)."""
    recompute: bool
    """Whether a stage may recompute (and then split its backward differently)."""

    @classmethod
    def of(cls, space: SearchSpace, num_layers: int) -> Rules:
        """The rules of ``space`` for a profile of ``num_layers`` layers; refuses impossible spaces."""
        if space.stages > num_layers:
            raise SearchSpaceError(
                f"stages = {space.stages} but the profile has only {num_layers} layers; use at most {num_layers}"
            )
        sizes = tuple(space.microbatch_sizes)
        if sizes[-1] * space.max_microbatches < space.global_batch:
            raise SearchSpaceError(
                f"microbatch.max_count = {space.max_microbatches} microbatches of at most {sizes[-1]} samples "
                f"cannot hold global_batch = {space.global_batch}; raise microbatch.max_count or microbatch.max"
            )
        return cls(num_layers=num_layers, stages=space.stages, batch=space.global_batch, sizes=sizes,
                   max_count=space.max_microbatches, schedule=space.schedule, recompute=space.recompute)  # fmt: skip

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

    def warmup(self, stage: int, count: int, wanted: int) -> int:
        """The warmup a stage of ``count`` forwards gets under the schedule family."""
        if self.schedule == "gpipe":
            return count
        if self.schedule == "1f1b":
            return self.stages - stage
        return max(1, min(wanted, count))


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
        if v == left and v <= top:
            take = v  # the closing remainder stays as it is, so valid lists are fixed points
        else:
            take = min(snapped[min(max(v, 0), top)], left)
        out.append(take)
        left -= take
    while left > 0:
        take = min(rules.largest, left)
        out.append(take)
        left -= take
    while len(out) > rules.max_count:
        j = min(range(len(out) - 1), key=lambda i: out[i] + out[i + 1])
        merged = out[j] + out[j + 1]
        if merged > rules.largest or (j + 1 < len(out) - 1 and merged not in rules.sizes):
            return greedy_split(rules.batch, rules.largest)
        out[j : j + 2] = [merged]
    return tuple(out)


def greedy_split(batch: int, size: int) -> tuple[int, ...]:
    """``[size, ..., size, remainder]`` covering ``batch``."""
    q, r = divmod(batch, size)
    return (size,) * q + ((r,) if r else ())


def repair_cuts(cuts: Sequence[int], rules: Rules) -> tuple[int, ...]:
    """Inner cuts made strictly increasing inside ``1..L-1``, as close to ``cuts`` as possible."""
    L, S = rules.num_layers, rules.stages
    inner = sorted(int(c) for c in cuts[1:-1])
    for i in range(len(inner)):  # lift crossed or too-low cuts
        inner[i] = max(inner[i], i + 1, inner[i - 1] + 1 if i else 1)
    for i in range(len(inner) - 1, -1, -1):  # then push down the ones that ran past the end
        inner[i] = min(inner[i], L - (S - 1 - i), inner[i + 1] - 1 if i + 1 < len(inner) else L - 1)
    return (0, *inner, L)


def make_plan(
    rules: Rules,
    cuts: Sequence[int],
    forward: Sequence[Sequence[int]],
    backward: Sequence[Sequence[int] | None],
    warmup: Sequence[int],
    recompute: Sequence[bool],
) -> Plan:
    """A valid plan from raw genes: every piece repaired under ``rules``.

    ``backward[s]`` is used only when the stage recomputes (None: same as forward).
    """
    c = repair_cuts(cuts, rules)
    stages = []
    for s in range(rules.stages):
        fwd = repair_sequence(forward[s], rules)
        rec = bool(recompute[s]) and rules.recompute
        raw_b = backward[s]
        bwd = repair_sequence(raw_b, rules) if rec and raw_b is not None else fwd
        stages.append(StagePlan(layers=(c[s], c[s + 1]), forward=fwd, backward=bwd,
                                warmup=rules.warmup(s, len(fwd), warmup[s]), recompute=rec))  # fmt: skip
    return Plan(global_batch=rules.batch, stages=tuple(stages))


def repair(plan: Plan, rules: Rules) -> Plan:
    """``plan`` made valid under ``rules`` (unchanged when it already is)."""
    st = plan.stages
    return make_plan(rules, [x.lo for x in st] + [st[-1].hi], [x.forward for x in st],
                     [x.backward for x in st], [x.warmup for x in st], [x.recompute for x in st])  # fmt: skip


def cuts_of(plan: Plan) -> list[int]:
    """Stage boundaries ``[0, c1, ..., L]``."""
    return [st.lo for st in plan.stages] + [plan.stages[-1].hi]


def shaped_sequence(rules: Rules, body: int, head: int, up: int, tail: int, down: int) -> tuple[int, ...]:
    """A ramp: ``up`` microbatches rising from ``head`` towards ``body``, body-sized ones, then
    ``down`` falling towards ``tail``; repaired to sum to B.

    Small first microbatches shorten pipeline fill, small last ones shorten the
    drain, and the body runs at the stage's efficient size.
    """
    ramp_up = [head + (body - head) * i // (up + 1) for i in range(up + 1)][:up] if up else []
    ramp_down = [body - (body - tail) * (i + 1) // (down + 1) for i in range(down)] if down else []
    ramp_down = [max(1, v) for v in ramp_down]
    middle = rules.batch - sum(ramp_up) - sum(ramp_down)
    body_part = list(greedy_split(middle, max(1, body))) if middle > 0 else []
    # An overshooting ramp is cut at B by the repair, which drops the fall.
    return repair_sequence([max(1, v) for v in ramp_up] + body_part + ramp_down, rules)
