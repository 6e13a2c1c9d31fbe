"""A plan lowered once into one program per rank: its compute steps plus every receive, send and release.

A :class:`~umsearch.core.plan.Plan` says which actions each rank runs; what
moves between them follows from the rules of :mod:`umsearch.core.actions`
(an action's :func:`~umsearch.core.actions.source_stage` and
:func:`~umsearch.core.actions.consumer_stage`) and from the sample arithmetic
of :mod:`umsearch.core.samples` (which slices of which sender microbatches
build a receiver microbatch). :func:`lower` works all of that out once, the
way torch's ``_add_send_recv`` pass turns a compute schedule into one with
communication, so that an interpreter (the runtime's executor, replay) only
walks its :class:`RankProgram`:

- a :class:`Channel` is the messages from one neighbouring stage into one
  stage of the rank, in one direction, local (a hand-off between two stages
  of the same rank) or remote (a link from another rank);
- each :class:`Step` is one action: the slices of its input (:class:`Input`,
  with the messages to wait for and those no later step reads), the
  receives to post once its input is taken, and where its output goes
  (:class:`Handoff` or :class:`Send`);
- receives are posted, per link (sending rank -> this rank), in the order
  the sender sends (NCCL matches in issue order), far enough ahead to cover
  the next :data:`RECV_WINDOW` steps that read from the link: the window is
  computed here, so every step's input is posted before it is waited for;
- the :attr:`RankProgram.handshake` says how the rank learns each message's
  sample shape on its first iteration (a shape header received, a stage
  probed, a header sent).

The program is written in a small fixed instruction set, and an interpreter
runs it without knowing what a message means (an activation, a gradient or
anything else a new message kind carries). Buffers are named by a channel and
a message index, and every step, in order:

1. takes its input: the rows :attr:`Step.rows` of the batch, or the slices
   :attr:`Input.pieces` of named buffers (waiting for their receives), then
   releases the buffers :attr:`Input.release`; that is the value :data:`IN`;
2. posts the receives :attr:`Step.posts` (peer, tag, a buffer whose shape is
   its channel's :attr:`Channel.shape` times the message's samples);
3. runs its action (if any) on :data:`IN`: its result is :data:`OUT`, and a
   last stage's forward also yields its microbatch's loss, :data:`LOSS`;
4. hands each of its :attr:`Step.outputs` the value it names: into a named
   buffer (:class:`Handoff`), to a peer under a tag (:class:`Send`), or to the
   caller under a name (:class:`Publish`). A value that is missing (a stage
   whose input takes no gradient) goes as zeros of the output's shape and
   samples.

A new message kind is therefore written here alone: its channel (shape,
sizes), its receives in the link order, the step that reads it, and the
output that sends it.

Pure and deterministic, no torch; linear in the plan (one merge per pair of
neighbouring stages, one pass over every rank's list). Programs are frozen
dataclasses, picklable, and valid by construction for a valid plan.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from umsearch.core.actions import (
    FEEDS,
    KINDS,
    NEEDS,
    Action,
    consumer_stage,
    indexed_list,
    on_forward_list,
    sent_boundary,
    source_stage,
)
from umsearch.core.plan import Plan
from umsearch.core.plan_rules import RUNS
from umsearch.core.samples import all_overlaps, cumulative
from umsearch.errors import PlanError

RECV_WINDOW = 2
"""On each link, receives cover the messages of the next this-many steps that read from it."""

MAX_TAG = 0x7FFF_FFFE
"""Largest message tag (int32, below the connecting message's)."""

Piece = tuple[int, int, int]
"""``(message, offset in the message, count)``: one slice of a receiver microbatch."""

BATCH = -1
"""The shape slot of the batch's samples (stage 0's input); slot ``j >= 0`` is stage ``j``'s output's."""

IN, OUT, LOSS = "in", "out", "loss"
"""The values a step has (module docstring): its input, its action's result, a last stage forward's loss."""


@dataclass(frozen=True, slots=True)
class FixedShape:
    """A sample shape known without a handshake: ``dims`` of ``dtype`` (a torch dtype's name, ``"float32"``)."""

    dims: tuple[int, ...]
    dtype: str


Shape = int | FixedShape
"""A message's sample shape: a slot the handshake fills (:data:`BATCH`, or a stage's output) or a fixed one."""


def tag(stage: int, gradient: bool, mb: int, num_stages: int) -> int:
    """The tag of the message ``stage`` sends for microbatch ``mb`` (``mb = -1``: its shape header).

    Unique per message of a plan: it encodes the sending stage, the direction
    and the microbatch (of the sender's forward list for activations, of its
    backward list for gradients).
    """
    return ((mb + 1) * num_stages + stage) * 2 + int(gradient)


def untag(tag: int, num_stages: int) -> tuple[int, bool, int]:
    """Inverse of :func:`tag`: ``(sending stage, gradient?, microbatch)`` (microbatch -1: the shape header)."""
    gradient, rest = bool(tag & 1), tag >> 1
    return rest % num_stages, gradient, rest // num_stages - 1


def message_name(sender: int, gradient: bool, mb: int) -> str:
    """``activation message 0F3`` / ``gradient message 2B1``: the sender's microbatch, named by the kind
    that runs it whole (:data:`~umsearch.core.plan_rules.RUNS`: a forward, or a whole backward)."""
    return f"{'gradient' if gradient else 'activation'} message {Action(sender, RUNS[not gradient][0][0], mb)}"


_READER = {gradient: next(c for c in range(len(KINDS)) if NEEDS[c] != 0 and on_forward_list(c) != gradient)
           for gradient in (False, True)}  # fmt: skip
"""By direction (gradients or not), the code of a kind that reads that channel (:data:`~umsearch.core.actions.NEEDS`):
a forward reads activations, a ``B`` gradients (an ``I`` reads the same)."""
_SENDER = {gradient: next(c for c in range(len(KINDS)) if FEEDS[c] != 0 and on_forward_list(c) != gradient)
           for gradient in (False, True)}  # fmt: skip
"""By direction, the code of a kind that sends on it (:data:`~umsearch.core.actions.FEEDS`): a forward sends
activations, a ``B`` gradients (an ``I`` the same)."""


@dataclass(frozen=True, slots=True)
class Channel:
    """The messages from stage :attr:`sender` into stage :attr:`stage` of this rank, in one direction."""

    stage: int
    """The receiving stage (held by this rank)."""
    gradient: bool
    """Gradients (from the stage above) rather than activations (from the stage below)."""
    sender: int
    """The sending stage."""
    sender_rank: int
    """The rank holding the sending stage."""
    local: bool
    """Whether the sender is on this rank (a hand-off, no message on the wire)."""
    sizes: tuple[int, ...]
    """Samples of each message (the sender's forward list, or backward list for gradients)."""
    header_tag: int
    """The tag of the sender's shape header (remote channels of activations only read it)."""
    shape: Shape
    """The sample shape of its messages: the boundary tensor between the two stages (an activation, or its
    gradient), i.e. the lower stage's output."""

    def message(self, m: int) -> str:
        """The name of message ``m`` (:func:`message_name`)."""
        return message_name(self.sender, self.gradient, m)

    def awaited(self, m: int) -> str:
        """Message ``m`` as a wait for it names it: ``activation message 0F3 from rank 0``."""
        return f"{self.message(m)} from rank {self.sender_rank}"

    def missing(self, m: int) -> str:
        """Message ``m`` as a step that runs before it was made names it (a local hand-off, out of order)."""
        return f"{self.message(m).split()[-1]} on the same rank, whose {'gradient' if self.gradient else 'output'} it needs"


@dataclass(frozen=True, slots=True)
class Receive:
    """Post a receive of message :attr:`message` of channel :attr:`channel`."""

    channel: int
    """Index into :attr:`RankProgram.channels`."""
    message: int
    """The sender's microbatch."""
    peer: int
    """The sending rank."""
    tag: int
    """Its tag (:func:`tag`)."""


@dataclass(frozen=True, slots=True)
class Input:
    """Where a step's input comes from and what it frees."""

    channel: int
    """Index into :attr:`RankProgram.channels`."""
    pieces: tuple[Piece, ...]
    """The slices that build the step's microbatch, in sample order."""
    release: tuple[int, ...]
    """Messages of the channel no later step reads: drop them once the input is built."""


@dataclass(frozen=True, slots=True)
class Handoff:
    """The value stays on this rank: message :attr:`message` of channel :attr:`channel`."""

    channel: int
    message: int
    shape: Shape
    """Its sample shape and :attr:`count` samples: what zeros stand in for a missing value."""
    count: int
    value: str = OUT
    """Which of the step's values (:data:`OUT`, :data:`LOSS`, :data:`IN`)."""


@dataclass(frozen=True, slots=True)
class Send:
    """The value goes to rank :attr:`peer` under :attr:`tag`."""

    peer: int
    tag: int
    name: str
    """What it is, for errors: ``activation message 0F3``."""
    shape: Shape
    """Its sample shape and :attr:`count` samples: what zeros stand in for a missing value."""
    count: int
    value: str = OUT
    """Which of the step's values (:data:`OUT`, :data:`LOSS`, :data:`IN`)."""


@dataclass(frozen=True, slots=True)
class Publish:
    """The value goes to the interpreter's caller, appended to the list under :attr:`name` (per iteration)."""

    name: str
    value: str = IN


Output = Handoff | Send | Publish
"""Where one of a step's values goes."""


@dataclass(frozen=True, slots=True)
class Step:
    """One action of the rank (or none: a step that only moves messages), with its communication."""

    action: Action | None
    input: Input | None
    """None: it reads :attr:`rows` of the batch (stage 0's forwards), its own loss or its own ``I``."""
    posts: tuple[Receive, ...]
    """Receives to post once the input is taken (the window moves on)."""
    outputs: tuple[Output, ...]
    """Where its values go, in this order."""
    ends_backward_of: int | None
    """The stage whose gradients are complete once this step has run (its last ``B`` or ``W``)."""
    rows: tuple[int, int] | None = None
    """``(first, count)``: the rows of the batch it reads (without an :attr:`input`)."""

    @property
    def output(self) -> Output | None:
        """Its first output (an action's output or input gradient goes there); None: it sends nothing."""
        return self.outputs[0] if self.outputs else None


@dataclass(frozen=True, slots=True)
class LearnShape:
    """Handshake: receive the header of shape slot :attr:`slot` from rank :attr:`peer` under :attr:`tag`."""

    slot: int
    peer: int
    tag: int
    what: str
    """What it is, for errors: ``the shape header of stage 1 from rank 1``."""


@dataclass(frozen=True, slots=True)
class ProbeShape:
    """Handshake: learn stage :attr:`stage`'s output shape (its slot) by running it on one sample of slot
    :attr:`input` (:data:`BATCH`: the batch's first sample; otherwise zeros)."""

    stage: int
    input: int
    what: str
    """What it is, for errors: ``the output of stage 0 (layer 3)``."""


@dataclass(frozen=True, slots=True)
class HeaderSend:
    """Handshake: tell rank :attr:`peer` the sample shape of stage :attr:`stage`'s output, under :attr:`tag`."""

    stage: int
    peer: int
    tag: int


Handshake = LearnShape | ProbeShape | HeaderSend
"""One operation of the first iteration's shape handshake."""


@dataclass(frozen=True, slots=True)
class RankProgram:
    """Everything one rank does in an iteration, communication included."""

    rank: int
    num_stages: int
    stages: tuple[int, ...]
    """The stages it holds, in stage order."""
    channels: tuple[Channel, ...]
    """Its input channels: stage ``j``'s activations from ``j-1`` and gradients from ``j+1``."""
    activations: dict[int, int]
    """Stage -> the index of its activation channel (absent: stage 0)."""
    gradients: dict[int, int]
    """Stage -> the index of its gradient channel (absent: the last stage)."""
    prelude: tuple[Receive, ...]
    """Receives to post before the iteration's barrier."""
    steps: tuple[Step, ...]
    handshake: tuple[Handshake, ...]
    """How it learns its messages' shapes and tells its peers theirs (once, at its first iteration), in order."""
    forward_only: bool

    @property
    def headers(self) -> tuple[HeaderSend, ...]:
        """Shape headers it sends, in stage order."""
        return tuple(h for h in self.handshake if isinstance(h, HeaderSend))

    @property
    def actions(self) -> tuple[Action, ...]:
        """Its actions, in list order."""
        return tuple(s.action for s in self.steps if s.action is not None)

    @property
    def receives(self) -> tuple[Receive, ...]:
        """Every receive, in posting order."""
        return self.prelude + tuple(r for s in self.steps for r in s.posts)

    @property
    def sends(self) -> tuple[Send, ...]:
        """Every send, in sending order."""
        return tuple(o for s in self.steps for o in s.outputs if isinstance(o, Send))


def check_tags(plan: Plan) -> None:
    """Refuse a plan whose message tags would not fit int32."""
    S = plan.num_stages
    biggest = max(max(len(st.forward), len(st.backward)) for st in plan.stages)
    if tag(S - 1, True, biggest - 1, S) > MAX_TAG:
        raise PlanError(f"{S} stages x {biggest} microbatches need message tags beyond int32; use fewer microbatches")


def lower(plan: Plan, *, forward_only: bool = False, run: bool = True) -> tuple[RankProgram, ...]:
    """One program per rank of a validated ``plan`` (``forward_only``: only the forwards run). Linear in the plan.

    ``run`` False: the programs are read, never run (deadlock detection reads what each step reads and
    makes), so they post no receives (no windows are worked out) and tags beyond int32
    (:func:`check_tags`) are no error.
    """
    if run:
        check_tags(plan)
    lists = [tuple(a for a in acts if a.is_forward or not forward_only) for acts in plan.actions]
    # Every rank's incoming messages in their senders' order: one pass over all lists.
    arrivals: list[dict[int, list[tuple[int, bool, int]]]] = [{} for _ in lists]
    S, st = plan.num_stages, plan.stages
    for src, acts in enumerate(lists if run else ()):
        for a in acts:
            to = a.consumer(S)
            if to is not None and st[to].rank != src:
                arrivals[st[to].rank].setdefault(src, []).append((to, not a.is_forward, a.mb))
    return tuple(_lower_rank(plan, r, lists[r], arrivals[r], forward_only) for r in range(plan.ranks))


def lower_rank(plan: Plan, rank: int, *, forward_only: bool = False) -> RankProgram:
    """:func:`lower`'s program of ``rank`` alone (one pass over every list, no other rank's program built)."""
    check_tags(plan)
    S, st = plan.num_stages, plan.stages
    arrivals: dict[int, list[tuple[int, bool, int]]] = {}
    for src, acts in enumerate(plan.actions):
        if src == rank:
            continue
        for a in acts:
            if forward_only and not a.is_forward:
                continue
            to = a.consumer(S)
            if to is not None and st[to].rank == rank:
                arrivals.setdefault(src, []).append((to, not a.is_forward, a.mb))
    mine = tuple(a for a in plan.actions[rank] if a.is_forward or not forward_only)
    return _lower_rank(plan, rank, mine, arrivals, forward_only)


def _channels(plan: Plan, rank: int, actions: tuple[Action, ...]) -> tuple[list[Channel], list[list[list[Piece]]], list[list[list[int]]], dict[tuple[int, bool], int]]:  # fmt: skip
    """Each input channel of the rank's stages, its slices per receiver microbatch and its releases."""
    S, st = plan.num_stages, plan.stages
    order: dict[tuple[int, bool], list[int]] = {}
    for a in actions:
        if a.is_forward or a.sends_gradient:  # the actions that read a channel (a W reads its own I)
            order.setdefault((a.stage, not a.is_forward), []).append(a.mb)
    channels: list[Channel] = []
    parts: list[list[list[Piece]]] = []
    release: list[list[list[int]]] = []
    index: dict[tuple[int, bool], int] = {}
    for j in plan.stages_of(rank):
        for gradient, reader in _READER.items():
            src = source_stage(reader, j, S)
            if src < 0:
                continue
            theirs = indexed_list(reader, st[src].forward, st[src].backward)
            p = all_overlaps(theirs, indexed_list(reader, st[j].forward, st[j].backward))
            index[(j, gradient)] = len(channels)
            channels.append(Channel(stage=j, gradient=gradient, sender=src, sender_rank=st[src].rank,
                                    local=st[src].rank == rank, sizes=tuple(theirs),
                                    header_tag=tag(src, False, -1, S), shape=min(j, src)))  # fmt: skip
            parts.append(p)
            release.append(releases(p, order.get((j, gradient), []), len(theirs)))
    return channels, parts, release, index


def releases(parts: Sequence[Sequence[Piece]], order: Iterable[int], messages: int) -> list[list[int]]:
    """For each receiver microbatch, the messages that no microbatch read after it needs.

    ``parts[k]`` are the slices of receiver microbatch ``k``; ``order`` the
    receiver microbatches in the order they are built (each once, any order);
    ``messages`` how many messages there are. After building microbatch ``k``
    the receiver may drop the messages ``releases(...)[k]``. Linear in the
    number of slices.
    """
    last = [-1] * messages
    for k in order:
        for m, _, _ in parts[k]:
            last[m] = k
    out: list[list[int]] = [[] for _ in parts]
    for m, k in enumerate(last):
        if k >= 0:
            out[k].append(m)
    return out


class _Link:
    """Lowering state of the receives from one other rank: send order, readers and the posting window."""

    def __init__(self, receives: list[Receive]) -> None:
        self.receives = receives
        self.readers: list[int] = []
        self.through: list[int] = []
        self.posted = 0
        self.next_reader = 0

    def post_ahead(self, pos: int, out: list[Receive]) -> None:
        """Append to ``out`` the receives covering the next :data:`RECV_WINDOW` readers from step ``pos`` on."""
        while self.next_reader < len(self.readers) and self.readers[self.next_reader] < pos:
            self.next_reader += 1
        i = min(self.next_reader + RECV_WINDOW, len(self.readers)) - 1
        if i >= 0:
            through = self.through[i]
            out.extend(self.receives[self.posted : through + 1])
            self.posted = max(self.posted, through + 1)


def _lower_rank(plan: Plan, rank: int, actions: tuple[Action, ...],
                arrivals: dict[int, list[tuple[int, bool, int]]], forward_only: bool) -> RankProgram:  # fmt: skip
    S = plan.num_stages
    channels, parts, release, index = _channels(plan, rank, actions)
    links: dict[int, _Link] = {}
    seq: list[list[int]] = [[-1] * len(ch.sizes) for ch in channels]  # each message's place in its link's order
    for src, msgs in arrivals.items():
        receives: list[Receive] = []
        for to, gradient, m in msgs:
            c = index[(to, gradient)]
            seq[c][m] = len(receives)
            receives.append(Receive(channel=c, message=m, peer=src, tag=tag(channels[c].sender, gradient, m, S)))
        links[src] = _Link(receives)
    inputs: list[Input | None] = []
    for pos, a in enumerate(actions):
        if a.source(S) is None:
            inputs.append(None)  # the batch (a forward), its own loss or its own I
            continue
        c = index[(a.stage, not a.is_forward)]
        inputs.append(Input(channel=c, pieces=tuple(parts[c][a.mb]), release=tuple(release[c][a.mb])))
        link = links.get(channels[c].sender_rank) if not channels[c].local else None
        if link is not None:
            need = max(seq[c][m] for m, _, _ in parts[c][a.mb])
            link.readers.append(pos)
            link.through.append(max(need, link.through[-1]) if link.through else need)
    prelude: list[Receive] = []
    for link in links.values():
        link.post_ahead(0, prelude)
    last = {a.stage: pos for pos, a in enumerate(actions) if a.ends_backward}
    ends = {pos: j for j, pos in last.items()}
    firsts: dict[int, list[int]] = {}
    steps = []
    for pos, a in enumerate(actions):
        posts: list[Receive] = []
        for link in links.values():
            link.post_ahead(pos + 1, posts)
        out = _output(plan, rank, a, index)
        steps.append(Step(action=a, input=inputs[pos], posts=tuple(posts), outputs=() if out is None else (out,),
                          ends_backward_of=ends.get(pos), rows=_rows(plan, a, inputs[pos], firsts)))  # fmt: skip
    return RankProgram(rank=rank, num_stages=S, stages=plan.stages_of(rank), channels=tuple(channels),
                       activations={j: c for (j, g), c in index.items() if not g},
                       gradients={j: c for (j, g), c in index.items() if g}, prelude=tuple(prelude),
                       steps=tuple(steps), handshake=_handshake(plan, rank, channels, index),
                       forward_only=forward_only)  # fmt: skip


def _rows(plan: Plan, a: Action, inp: Input | None, firsts: dict[int, list[int]]) -> tuple[int, int] | None:
    """The rows of the batch ``a`` reads: a forward with no input channel (stage 0's) reads its microbatch's.
    ``firsts``: each stage's first sample per forward microbatch, filled on first need."""
    if inp is not None or not a.is_forward:
        return None
    sizes = plan.stages[a.stage].forward
    if a.stage not in firsts:
        firsts[a.stage] = cumulative(sizes)
    return firsts[a.stage][a.mb], sizes[a.mb]


def _handshake(plan: Plan, rank: int, channels: list[Channel], index: dict[tuple[int, bool], int]) -> tuple[Handshake, ...]:  # fmt: skip
    """Stage by stage: learn its input's shape (a header from another rank), probe its output's if that goes on
    (and its gradient comes back), and tell the next stage's rank when that is another rank."""
    S, st = plan.num_stages, plan.stages
    ops: list[Handshake] = []
    for j in plan.stages_of(rank):
        c = index.get((j, False))
        source = BATCH if c is None else channels[c].sender  # an activation has its sender's output's shape
        if c is not None and not channels[c].local:
            ch = channels[c]
            ops.append(LearnShape(slot=source, peer=ch.sender_rank, tag=ch.header_tag,
                                  what=f"the shape header of stage {ch.sender} from rank {ch.sender_rank}"))  # fmt: skip
        if (j, True) not in index:
            continue
        boundary = sent_boundary(_SENDER[False], st[j].lo, st[j].hi)
        ops.append(ProbeShape(stage=j, input=source,
                              what=f"the output of stage {j} (layer {boundary})"))  # fmt: skip
        dst = consumer_stage(_SENDER[False], j, S)
        if dst >= 0 and st[dst].rank != rank:
            ops.append(HeaderSend(stage=j, peer=st[dst].rank, tag=tag(j, False, -1, S)))
    return tuple(ops)


def _output(plan: Plan, rank: int, a: Action, index: dict[tuple[int, bool], int]) -> Handoff | Send | None:
    """Where action ``a``'s output goes (:meth:`Action.consumer`)."""
    S = plan.num_stages
    to = a.consumer(S)
    if to is None:
        return None
    gradient = not a.is_forward
    dst = plan.stages[to].rank
    shape, count = min(a.stage, to), a.size(plan.stages[a.stage].forward, plan.stages[a.stage].backward)
    if dst == rank:
        return Handoff(channel=index[(to, gradient)], message=a.mb, shape=shape, count=count)
    return Send(peer=dst, tag=tag(a.stage, gradient, a.mb, S), name=message_name(a.stage, gradient, a.mb),
                shape=shape, count=count)  # fmt: skip
