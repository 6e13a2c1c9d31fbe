"""The action IR: what a rank does, in torch.distributed.pipelining's own notation (docs/model.md section 3).

The action owns its rules, and every pass (the reference simulator, the
compiled kernels, the order generator, dependencies, memory, plan checks,
runtime, export) reads them here, never restates them:

- which stage its output feeds (:data:`FEEDS`; a forward or a gradient, :func:`sends_gradient`) and
  which it reads from (:data:`NEEDS`): :func:`consumer_stage`, :func:`source_stage`;
- which list of its stage its microbatch indexes (:data:`FORWARD_LIST`, :func:`indexed_list`);
- which layer boundary its message crosses, and the one it receives across
  (:func:`sent_boundary`, :func:`received_boundary`);
- whether it closes its stage's gradients of its microbatch (:data:`ENDS_BACKWARD`), is half of a
  split backward (:data:`SPLIT`), runs the forward again on a recomputing stage
  (:data:`RERUNS_FORWARD`, :func:`reruns_forward`);
- what it does to its stage's activation memory (:data:`MEMORY`, docs/model.md section 5);
- the order within a rank (:data:`FOLLOWS`, :data:`ALTERNATIVE`, :func:`rank_order_problem`);
- its integer code for compiled code (:func:`action_code`, named shifts).

The tables are tuples (numba freezes them as constants) or numpy constants,
indexed by kind code, and the code functions plain Python, so the compiled
kernels (:mod:`umsearch.sim.kernels`) compile these very definitions. A kind
letter is compared nowhere else (a test holds the package to it).

An action is written ``{stage}{kind}{microbatch}``: ``2F0`` is stage 2's
forward of its microbatch 0, ``1B3`` a full backward, ``0I1`` / ``0W1`` the
input-gradient and weight-gradient halves of a split backward. A plan holds
one ordered tuple of actions per rank; every consumer (simulators, runtime,
pictures, export) reads those tuples and nothing else.

:class:`Action` is a named tuple, so actions hash, compare and sort as plain
tuples and cost no more to build than one.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple, TypeVar

import numpy as np

Kind = Literal["F", "B", "I", "W"]
KINDS: tuple[Kind, ...] = ("F", "B", "I", "W")
"""Every action kind, in the order of their integer codes (see :data:`KIND_CODE`)."""
KIND_CODE: dict[str, int] = {k: i for i, k in enumerate(KINDS)}
"""``F`` 0, ``B`` 1, ``I`` 2, ``W`` 3: the codes the compiled evaluator uses."""
F, B, I, W = range(4)  # noqa: E741 - the contract's own letters
"""Kind codes by name, for compiled code."""

FEEDS = (1, -1, -1, 0)
"""By kind code: the stage offset its output goes to (docs/model.md 4): a forward feeds stage j+1, a
``B`` or ``I`` sends its input gradient to j-1, a ``W`` sends nothing."""
NEEDS = (-1, 1, 1, 0)
"""By kind code: the stage offset whose outputs it needs: a forward reads stage j-1's forwards, a
``B``/``I`` stage j+1's gradients; a ``W`` needs only its own ``I`` (list order, :data:`FOLLOWS`)."""
FORWARD_LIST = (1, 0, 0, 0)
"""By kind code: 1 where its microbatch indexes its stage's forward list (``F``), 0 where the
backward list (``B``, ``I``, ``W``)."""
ENDS_BACKWARD = (0, 1, 0, 1)
"""By kind code: 1 where it closes its stage's gradients of its microbatch (``B``, or the ``W`` of a
split backward): a stage's gradients are complete once its last such action has run."""
SPLIT = (0, 0, 1, 1)
"""By kind code: 1 for the two halves of a split backward (``I``, ``W``)."""
RERUNS_FORWARD = (0, 1, 1, 0)
"""By kind code: 1 where a recomputing stage runs its forward again first (``B``, ``I``: the ones
that need the activations docs/model.md 5 did not stash)."""
FOLLOWS = (-1, F, F, I)
"""By kind code: the kind code it comes after on its own rank (docs/model.md 3; -1: none): a ``B`` or
``I`` after the forwards holding its samples, a ``W`` after its ``I``."""
BACKWARD_START = (B, I)
"""By split flag (0 or 1): the kind code a stage's backward of a microbatch starts with, whole or split."""
ALTERNATIVE = (-1, I, B, B)
"""By kind code: the kind that may not run the same backward microbatch beside it (-1: none): a
backward runs whole (``B``) or split (``I`` then ``W``), never both."""
MEMORY = np.array([
    # adds (x stash, input, kept, freed)  releases (x stash, input, kept, freed)
    [[1, 0, 0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 1, 0, 0, 0],    # F B, no recompute
     [0, 0, 0, 0, 0, 0, 0, 1], [0, 0, 0, 0, 1, 0, 0, -1]],  # I W
    [[0, 1, 0, 0, 0, 0, 0, 0], [1, 0, -1, 0, 1, 1, -1, 0],  # F B, recompute
     [1, 0, -1, 0, 0, 1, -1, 1], [0, 0, 0, 0, 1, 0, 0, -1]],  # I W
], dtype=np.float64)  # fmt: skip
"""docs/model.md section 5's table: ``MEMORY[recompute, kind]`` are the coefficients of the bytes of its
microbatch an action adds before the peak is taken (first four), then of those it releases (last four),
each over its stage's (stash, input, kept input, freed by ``I``): the terms of
:func:`umsearch.core.cost.stage_memory`, in its order."""

KIND_BITS = 2
"""Bits of the kind in an action code."""
STAGE_BITS = 10
"""Bits of the stage in an action code."""
STAGE_SHIFT = KIND_BITS
MB_SHIFT = KIND_BITS + STAGE_BITS
KIND_MASK = (1 << KIND_BITS) - 1
STAGE_MASK = (1 << STAGE_BITS) - 1
MAX_STAGES = 1 << STAGE_BITS
"""Stages an action code can name."""


def action_code(stage: int, kind: int, mb: int) -> int:
    """The int64 code of one action: ``mb << MB_SHIFT | stage << STAGE_SHIFT | kind``."""
    return (mb << MB_SHIFT) | (stage << STAGE_SHIFT) | kind


def code_kind(code: int) -> int:
    """The kind code of an action code."""
    return code & KIND_MASK


def code_stage(code: int) -> int:
    """The stage of an action code."""
    return (code >> STAGE_SHIFT) & STAGE_MASK


def code_mb(code: int) -> int:
    """The microbatch of an action code."""
    return code >> MB_SHIFT


# The functions below take a kind code and are compiled as they are (umsearch.sim.kernels). Each
# reads its table at ``kind & KIND_MASK``: a kind is two bits, and saying so lets numba index the
# tuple without a range check and its error path (measured: ~9% of the evaluator's instructions).


def on_forward_list(kind: int) -> bool:
    """Whether an action of kind code ``kind`` indexes its stage's forward list (:data:`FORWARD_LIST`)."""
    return FORWARD_LIST[kind & KIND_MASK] != 0


def sends_gradient(kind: int) -> bool:
    """Whether kind code ``kind`` sends an input gradient (``B``, ``I``): it feeds a lower stage."""
    return FEEDS[kind & KIND_MASK] < 0


def ends_backward(kind: int) -> bool:
    """Whether kind code ``kind`` closes its stage's gradients of its microbatch (:data:`ENDS_BACKWARD`)."""
    return ENDS_BACKWARD[kind & KIND_MASK] != 0


def consumer_stage(kind: int, stage: int, num_stages: int) -> int:
    """The stage the output of ``stage``'s action of kind code ``kind`` goes to (:data:`FEEDS`), or -1:
    the last stage's forwards, stage 0's gradients and every ``W`` send nothing."""
    step = FEEDS[kind & KIND_MASK]
    to = stage + step
    return to if step != 0 and 0 <= to < num_stages else -1


def source_stage(kind: int, stage: int, num_stages: int) -> int:
    """The stage whose outputs ``stage``'s action of kind code ``kind`` needs (:data:`NEEDS`), or -1:
    stage 0's forwards read the batch, the last stage's backwards its own loss, a ``W`` its own ``I``."""
    step = NEEDS[kind & KIND_MASK]
    frm = stage + step
    return frm if step != 0 and 0 <= frm < num_stages else -1


def sent_boundary(kind: int, lo: int, hi: int) -> int:
    """The layer whose output (or whose output's gradient) the message of an action of kind code
    ``kind`` on layers ``[lo, hi)`` carries: a forward's last layer ``hi - 1``, a gradient's
    ``lo - 1`` (the layer before its stage; meaningless where it sends nothing)."""
    return hi - 1 if FEEDS[kind & KIND_MASK] > 0 else lo - 1


def received_boundary(kind: int, lo: int, hi: int) -> int:
    """The layer whose output (or its gradient) an action of kind code ``kind`` on layers
    ``[lo, hi)`` receives from its source stage: a forward ``lo - 1``, a ``B``/``I`` ``hi - 1``."""
    return hi - 1 if NEEDS[kind & KIND_MASK] > 0 else lo - 1


def reruns_forward(kind: int, recompute: bool) -> bool:
    """Whether an action of kind code ``kind`` on a stage with this recompute flag runs the stage's
    forward again first (:data:`RERUNS_FORWARD`): its time then adds a forward's (docs/model.md 4)."""
    return recompute and RERUNS_FORWARD[kind & KIND_MASK] != 0


Sizes = TypeVar("Sizes", bound=Sequence[int])
"""A stage's forward or backward list (a tuple in a plan)."""


def indexed_list(kind: int, forward: Sizes, backward: Sizes) -> Sizes:
    """Of a stage's ``forward`` and ``backward`` lists, the one an action of kind code ``kind`` indexes."""
    return forward if on_forward_list(kind) else backward


def hands_on(same_rank: bool, recompute: bool, next_recompute: bool, same_forward: bool) -> bool:
    """docs/model.md 5 (version 2.3): whether a stage's saved output and the next stage's saved input are
    one storage (the output handed on the same rank, no copy): both stages on one rank, neither
    recomputing (a rebuilt graph saves a new output; a kept input is counted as the input), and equal
    forward lists (each next microbatch is one whole output, not pieces put together)."""
    return same_rank and not recompute and not next_recompute and same_forward


def memory_effect(kind: int, recompute: bool, stash: float, inp: float, kept: float,
                  freed: float) -> tuple[float, float]:  # fmt: skip
    """(bytes added before the peak is taken, bytes released after) by one action of kind code
    ``kind``; ``stash``, ``inp``, ``kept`` and ``freed`` are its stage's
    :func:`~umsearch.core.cost.stage_memory` terms times the microbatch size (``kept = freed = 0``:
    version 2.2's table)."""
    row = MEMORY[int(recompute), kind]
    add = row[0] * stash + row[1] * inp + row[2] * kept + row[3] * freed
    return add, row[4] * stash + row[5] * inp + row[6] * kept + row[7] * freed

_PATTERN = re.compile(r"\s*([0-9]+)\s*([FBIW])\s*([0-9]+)\s*", re.ASCII)  # ASCII digits only: "0F١" is no action


Holders = Callable[[int, int], Iterable[int]]
"""``holders(stage, mb)``: the forward microbatches of ``stage`` holding the samples of its backward
microbatch ``mb`` (:func:`umsearch.core.samples.spans` of its lists; ``(mb,)`` where they are equal)."""


class Action(NamedTuple):
    """One action of a rank: stage ``stage`` runs ``kind`` on its microbatch ``mb``."""

    stage: int
    """The stage (model chunk) index."""
    kind: Kind
    """``F`` forward, ``B`` full backward, ``I`` input-gradient part, ``W`` weight-gradient part."""
    mb: int
    """Index into the stage's forward list (``F``) or backward list (``B``, ``I``, ``W``)."""

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.mb}"

    @property
    def kind_code(self) -> int:
        """Its kind's integer code (:data:`KIND_CODE`)."""
        return KIND_CODE[self.kind]

    @property
    def is_forward(self) -> bool:
        """Whether its microbatch indexes the stage's forward list (:data:`FORWARD_LIST`): an ``F``."""
        return on_forward_list(KIND_CODE[self.kind])

    @property
    def is_backward(self) -> bool:
        """``B``, ``I`` or ``W``: an action on the stage's backward list."""
        return not self.is_forward

    @property
    def sends_gradient(self) -> bool:
        """Whether it sends an input gradient (:func:`sends_gradient`): a ``B`` or ``I``."""
        return sends_gradient(KIND_CODE[self.kind])

    @property
    def ends_backward(self) -> bool:
        """Whether it closes its stage's gradients of its microbatch (:data:`ENDS_BACKWARD`): a ``B`` or ``W``."""
        return ends_backward(KIND_CODE[self.kind])

    @property
    def is_split(self) -> bool:
        """Whether it is half of a split backward (:data:`SPLIT`): an ``I`` or ``W``."""
        return SPLIT[KIND_CODE[self.kind]] != 0

    def reruns_forward(self, recompute: bool) -> bool:
        """:func:`reruns_forward` of this action on a stage with this recompute flag."""
        return reruns_forward(KIND_CODE[self.kind], recompute)

    def sizes(self, forward: Sizes, backward: Sizes) -> Sizes:
        """Of its stage's ``forward`` and ``backward`` lists, the one its microbatch indexes."""
        return indexed_list(KIND_CODE[self.kind], forward, backward)

    def size(self, forward: Sequence[int], backward: Sequence[int]) -> int:
        """Its microbatch's samples, given its stage's ``forward`` and ``backward`` lists."""
        return self.sizes(forward, backward)[self.mb]

    def sent_boundary(self, lo: int, hi: int) -> int:
        """:func:`sent_boundary` of this action on its stage's layers ``[lo, hi)``."""
        return sent_boundary(KIND_CODE[self.kind], lo, hi)

    def received_boundary(self, lo: int, hi: int) -> int:
        """:func:`received_boundary` of this action on its stage's layers ``[lo, hi)``."""
        return received_boundary(KIND_CODE[self.kind], lo, hi)

    @property
    def code(self) -> int:
        """:func:`action_code` of this action."""
        return action_code(self.stage, KIND_CODE[self.kind], self.mb)

    @classmethod
    def from_code(cls, code: int) -> Action:
        """The action of an :func:`action_code`."""
        return cls(code_stage(code), KINDS[code_kind(code)], code_mb(code))

    def consumer(self, num_stages: int) -> int | None:
        """The stage its output goes to (:func:`consumer_stage`), or None: the last stage's forwards,
        stage 0's gradients and every ``W`` send nothing."""
        to = consumer_stage(KIND_CODE[self.kind], self.stage, num_stages)
        return to if to >= 0 else None

    def source(self, num_stages: int) -> int | None:
        """The stage whose outputs it needs (:func:`source_stage`), or None: stage 0's forwards read the
        batch, the last stage's backwards its own loss, a ``W`` its own ``I``."""
        frm = source_stage(KIND_CODE[self.kind], self.stage, num_stages)
        return frm if frm >= 0 else None

    def must_follow(self, holders: Holders) -> tuple[Action, ...]:
        """The actions of its own rank that must run before it (:data:`FOLLOWS`, docs/model.md 3): a ``B``
        or ``I``'s forwards holding its samples (``holders(stage, mb)``: their forward indices), a
        ``W``'s ``I``; none for a forward."""
        rule = _FOLLOWS[self.kind]
        if rule is None:
            return ()
        before, via_holders = rule
        mbs = holders(self.stage, self.mb) if via_holders else (self.mb,)
        return tuple(Action(self.stage, before, m) for m in mbs)

    def alternative(self) -> Action | None:
        """The action that may not run beside it (:data:`ALTERNATIVE`): a ``B``'s ``I``, an ``I``'s or
        ``W``'s ``B``; None for a forward."""
        other = _ALTERNATIVE[self.kind]
        return Action(self.stage, other, self.mb) if other is not None else None

    def memory(self, recompute: bool, stash: float, inp: float, kept: float = 0.0,
               freed: float = 0.0) -> tuple[float, float]:  # fmt: skip
        """:func:`memory_effect` of this action."""
        return memory_effect(KIND_CODE[self.kind], recompute, stash, inp, kept, freed)


_FOLLOWS: dict[str, tuple[Kind, bool] | None] = {
    k: None if FOLLOWS[c] < 0 else (KINDS[FOLLOWS[c]], FORWARD_LIST[FOLLOWS[c]] != FORWARD_LIST[c])
    for c, k in enumerate(KINDS)
}
"""By kind: :data:`FOLLOWS` as (the kind it comes after, whether on the other list, so through
``holders``), or None."""
_ALTERNATIVE: dict[str, Kind | None] = {k: KINDS[ALTERNATIVE[c]] if ALTERNATIVE[c] >= 0 else None
                                         for c, k in enumerate(KINDS)}  # fmt: skip
"""By kind: :data:`ALTERNATIVE`'s kind, or None."""


def _a(kind: str) -> str:
    return f"an {kind}" if kind in ("F", "I") else f"a {kind}"


def rank_order_problem(actions: Sequence[Action], holders: Holders) -> tuple[int, str] | None:
    """docs/model.md section 3's order within one rank's list: the first action that breaks it, as ``(its
    position, why)``, or None. A backward microbatch runs whole or split, never both
    (:meth:`Action.alternative`), and every action comes after what it must follow
    (:meth:`Action.must_follow`; ``holders`` says which forwards hold a backward's samples). Whether
    every action is listed, once and on the right rank, is the caller's question.

    Linear in the list (plans hold up to 100,000 actions): actions are looked up as the plain tuples
    they are."""
    listed = set(actions)
    done: set[tuple[int, str, int]] = set()
    for pos, a in enumerate(actions):
        stage, kind, mb = a
        other = _ALTERNATIVE[kind]
        if other is not None and (stage, other, mb) in listed:
            x, y = sorted((a, Action(stage, other, mb)), key=lambda b: KIND_CODE[b.kind])
            return pos, (f"microbatch {mb} of stage {stage} has both {_a(x.kind)} and {_a(y.kind)} ({x} and "
                         f"{y}): a backward runs whole (B) or split (I then W)")  # fmt: skip
        rule = _FOLLOWS[kind]
        if rule is not None:
            before, via_holders = rule
            for m in holders(stage, mb) if via_holders else (mb,):
                if (stage, before, m) not in done:
                    why = ", which holds its samples" if via_holders else ""
                    return pos, f"{a} comes before {Action(stage, before, m)}{why}"
        done.add(a)
    return None


def parse_action(text: str) -> Action:
    """``"2F0"`` -> ``Action(2, "F", 0)``; raises ValueError on anything else."""
    m = _PATTERN.fullmatch(text)
    if m is None:
        raise ValueError(
            f"{text!r} is not an action; write stage, kind and microbatch like '2F0', '1B3', '0I1' or '0W1'"
        )
    kind = m.group(2)
    assert kind in KINDS
    return Action(int(m.group(1)), kind, int(m.group(3)))


def format_actions(actions: Iterable[Action]) -> str:
    """Space-separated notation, as docs/model.md section 8 writes rank lists."""
    return " ".join(str(a) for a in actions)


def parse_actions(text: str | Sequence[str]) -> tuple[Action, ...]:
    """A rank's list from ``"0F0 0F1 0B0"`` or ``["0F0", "0F1", "0B0"]``."""
    items = text.split() if isinstance(text, str) else list(text)
    return tuple(parse_action(item) for item in items)


@dataclass(frozen=True, kw_only=True)
class ActionRecord:
    """One action that ran, predicted (the simulator) or measured (the runtime)."""

    rank: int
    """The rank that ran it."""
    stage: int
    """Its stage."""
    kind: Kind
    """``F``, ``B``, ``I`` or ``W``."""
    mb: int
    """Microbatch index in the stage's forward (``F``) or backward list."""
    size: int
    """Samples in the microbatch."""
    start_ms: float
    """Start time since the iteration began."""
    end_ms: float
    """End time."""

    @property
    def action(self) -> Action:
        """The action that ran."""
        return Action(self.stage, self.kind, self.mb)

    @property
    def label(self) -> str:
        """``2F0``: the action's own notation."""
        return str(self.action)
