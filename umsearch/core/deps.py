"""Which actions feed which (docs/model.md section 4), and whether a plan deadlocks.

An action waits for two things: its rank's previous action, and its inputs.
A forward of stage ``j`` needs the forwards of stage ``j-1`` holding its
samples; a ``B``/``I`` of stage ``j`` needs the ``B``/``I`` of stage ``j+1``
holding its samples; a ``W`` needs its own ``I``, earlier on the same rank
(the rules are :mod:`umsearch.core.actions`' ``NEEDS`` and ``FOLLOWS``).
Whether a plan deadlocks depends on these edges and the rank orders alone,
never on durations: :func:`find_deadlock` answers it without a cost model,
on the plan's programs (:func:`umsearch.core.program.lower`): each step waits
for the messages its input is built from, and makes the message it sends or
hands on.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from umsearch.core.actions import Action, B, F, Kind, indexed_list, source_stage
from umsearch.core.plan import Plan
from umsearch.core.program import Handoff, RankProgram, Send, Step, lower, message_name, untag
from umsearch.core.samples import spans
from umsearch.errors import PlanError


@dataclass(frozen=True)
class Dependencies:
    """The producer ranges of every action of one (valid) plan."""

    plan: Plan

    def _sources(self, kind: int) -> tuple[tuple[range, ...], ...]:
        """``[j][k]``: the microbatches of the stage that stage j's actions of kind code ``kind`` read
        (:func:`source_stage`) holding the samples of its microbatch k, on the list they index."""
        st, n = self.plan.stages, self.plan.num_stages
        out: list[tuple[range, ...]] = []
        for j in range(n):
            src = source_stage(kind, j, n)
            if src < 0:
                out.append(())
                continue
            theirs = indexed_list(kind, st[src].forward, st[src].backward)
            out.append(tuple(spans(theirs, indexed_list(kind, st[j].forward, st[j].backward))))
        return tuple(out)

    @cached_property
    def forward_sources(self) -> tuple[tuple[range, ...], ...]:
        """``[j][k]``: stage ``j-1``'s forward microbatches holding the samples of ``jFk`` (empty for j=0)."""
        return self._sources(F)

    @cached_property
    def gradient_sources(self) -> tuple[tuple[range, ...], ...]:
        """``[j][k]``: stage ``j+1``'s backward microbatches holding the samples of ``jBk``/``jIk``
        (empty for the last stage, whose loss is part of its own forward)."""
        return self._sources(B)

    @cached_property
    def gradient_kind(self) -> tuple[dict[int, Kind], ...]:
        """``[j][k]``: ``"B"`` or ``"I"``, whichever action of stage j's backward k sends its gradient."""
        out: list[dict[int, Kind]] = [{} for _ in self.plan.stages]
        for acts in self.plan.actions:
            for a in acts:
                if a.sends_gradient:
                    out[a.stage][a.mb] = a.kind
        return tuple(out)

    def producers(self, a: Action) -> list[Action]:
        """The actions on earlier stages whose outputs ``a`` needs (its own rank's order aside): a
        forward its source's forwards, a ``B``/``I`` whichever of its source's actions sent the gradient."""
        src = a.source(self.plan.num_stages)
        if src is None:
            return []
        if a.is_forward:
            return [Action(src, a.kind, i) for i in self.forward_sources[a.stage][a.mb]]
        return [Action(src, self.gradient_kind[src][i], i) for i in self.gradient_sources[a.stage][a.mb]]


Message = tuple[int, bool, int]
"""``(sending stage, gradient?, its microbatch)``: one message of a plan (what :func:`~umsearch.core.program.tag`
encodes)."""


Made = tuple[Message, int | None]
"""A message a step makes and the rank it is sent to (None: handed on, on the same rank)."""


def messages(program: RankProgram) -> tuple[tuple[Step, ...], list[tuple[Message, ...]], list[tuple[Made, ...]]]:
    """``program``'s steps and, per step, the messages its input is built from (in sample order) and those it
    makes (handed on or sent: a message is named by its sender's microbatch, as
    :func:`~umsearch.core.program.tag` names it). What the deadlock check and the reference simulator read."""
    channels = program.channels
    reads: list[tuple[Message, ...]] = []
    makes: list[tuple[Made, ...]] = []
    for st in program.steps:
        if st.input is None:
            reads.append(())
        else:
            ch = channels[st.input.channel]
            reads.append(tuple((ch.sender, ch.gradient, m) for m, _, _ in st.input.pieces))
        made: list[Made] = []
        for out in st.outputs:
            if isinstance(out, Handoff):
                ch = channels[out.channel]
                made.append(((ch.sender, ch.gradient, out.message), None))
            elif isinstance(out, Send):
                made.append((untag(out.tag, program.num_stages), out.peer))
        makes.append(tuple(made))
    return program.steps, reads, makes


def find_deadlock(plan: Plan) -> tuple[str, ...]:
    """For a valid plan: one line per rank that can never finish, naming the action it is stuck at and
    the first input that never comes (the action that makes it); empty when the plan runs to the end.

    Every rank runs its program's steps in order and a step runs once the
    messages its input is built from have been made; the plan deadlocks
    exactly when this stops with steps left.
    """
    programs = lower(plan, run=False)
    flows = [messages(p)[1:] for p in programs]
    maker = {m: (st.action, p.rank) for p, (_, makes) in zip(programs, flows, strict=True)
             for st, out in zip(p.steps, makes, strict=True) for m, _ in out}  # fmt: skip
    made: set[Message] = set()
    pos = [0] * plan.ranks
    progress = True
    while progress:
        progress = False
        for r, (reads, makes) in enumerate(flows):
            while pos[r] < len(reads) and all(m in made for m in reads[pos[r]]):
                made.update(m for m, _ in makes[pos[r]])
                pos[r] += 1
                progress = True
    stuck = []
    for r, (reads, _) in enumerate(flows):
        if pos[r] < len(reads):
            message = next(m for m in reads[pos[r]] if m not in made)
            missing, at = maker[message]
            stuck.append(f"rank {r} is stuck at {programs[r].steps[pos[r]].action or 'a step'}, waiting for "
                         f"{missing or message_name(*message)} on rank {at}")  # fmt: skip
    return tuple(stuck)


def check_deadlock(plan: Plan) -> None:
    """For a valid plan: raise PlanError naming every stuck rank's action and what it waits for when
    ``plan`` deadlocks."""
    stuck = find_deadlock(plan)
    if stuck:
        raise PlanError(
            "the plan deadlocks (" + "; ".join(stuck) + "); reorder the stuck ranks' actions so that every "
            "input is produced before it is needed, or align the microbatches with the neighbour's"
        )
