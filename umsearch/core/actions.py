"""The action IR: what a rank does, in torch.distributed.pipelining's own notation (MODEL.md section 3).

The action owns its rules, and every pass (simulators, the order generator,
dependencies, memory, runtime, export) reads them here: which stage its output
feeds (:data:`FEEDS`), which stage it reads from (:data:`NEEDS`), what it does
to its stage's activation memory (:data:`MEMORY`, MODEL.md section 5) and its
integer code for compiled code (:func:`action_code`, named shifts). The tables
are numpy constants and the code functions plain Python, so the compiled
kernels (:mod:`umsearch.sim.kernels`) compile these very definitions.

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
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

import numpy as np

Kind = Literal["F", "B", "I", "W"]
KINDS: tuple[Kind, ...] = ("F", "B", "I", "W")
"""Every action kind, in the order of their integer codes (see :data:`KIND_CODE`)."""
KIND_CODE: dict[str, int] = {k: i for i, k in enumerate(KINDS)}
"""``F`` 0, ``B`` 1, ``I`` 2, ``W`` 3: the codes the compiled evaluator uses."""
F, B, I, W = range(4)  # noqa: E741 - the contract's own letters
"""Kind codes by name, for compiled code."""

FEEDS = (1, -1, -1, 0)
"""By kind code: the stage offset its output goes to (MODEL.md 4): a forward feeds stage j+1, a
``B`` or ``I`` sends its input gradient to j-1, a ``W`` sends nothing."""
NEEDS = (-1, 1, 1, 0)
"""By kind code: the stage offset whose outputs it needs: a forward reads stage j-1's forwards, a
``B``/``I`` stage j+1's gradients; a ``W`` needs only its own ``I`` (list order)."""
MEMORY = np.array([
    # adds (x stash, x input)  releases (x stash, x input)
    [[1, 0, 0, 0], [0, 0, 1, 0], [0, 0, 0, 0], [0, 0, 1, 0]],  # F B I W, no recompute
    [[0, 1, 0, 0], [1, 0, 1, 1], [1, 0, 0, 1], [0, 0, 1, 0]],  # F B I W, recompute
], dtype=np.float64)  # fmt: skip
"""MODEL.md section 5's table: ``MEMORY[recompute, kind]`` are the coefficients of (stash, input)
bytes of its microbatch that an action adds before the peak is taken, then of those it releases."""

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


def memory_effect(kind: int, recompute: bool, stash: float, inp: float) -> tuple[float, float]:
    """(bytes added before the peak is taken, bytes released after) by one action of kind code
    ``kind``; ``stash`` and ``inp`` are its stage's per-sample bytes times the microbatch size."""
    row = MEMORY[int(recompute), kind]
    return row[0] * stash + row[1] * inp, row[2] * stash + row[3] * inp

_PATTERN = re.compile(r"\s*([0-9]+)\s*([FBIW])\s*([0-9]+)\s*", re.ASCII)  # ASCII digits only: "0F١" is no action


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
    def is_backward(self) -> bool:
        """``B``, ``I`` or ``W``: an action on the stage's backward list."""
        return self.kind != "F"

    @property
    def code(self) -> int:
        """:func:`action_code` of this action."""
        return action_code(self.stage, KIND_CODE[self.kind], self.mb)

    @classmethod
    def from_code(cls, code: int) -> Action:
        """The action of an :func:`action_code`."""
        return cls(code_stage(code), KINDS[code_kind(code)], code_mb(code))

    def consumer(self, num_stages: int) -> int | None:
        """The stage its output goes to (:data:`FEEDS`), or None: the last stage's forwards, stage
        0's gradients and every ``W`` send nothing."""
        step = int(FEEDS[KIND_CODE[self.kind]])
        to = self.stage + step
        return to if step and 0 <= to < num_stages else None

    def source(self, num_stages: int) -> int | None:
        """The stage whose outputs it needs (:data:`NEEDS`), or None: stage 0's forwards read the
        batch, the last stage's backwards its own loss, a ``W`` its own ``I``."""
        step = int(NEEDS[KIND_CODE[self.kind]])
        frm = self.stage + step
        return frm if step and 0 <= frm < num_stages else None

    def memory(self, recompute: bool, stash: float, inp: float) -> tuple[float, float]:
        """:func:`memory_effect` of this action."""
        return memory_effect(KIND_CODE[self.kind], recompute, stash, inp)


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
    """Space-separated notation, as MODEL.md section 8 writes rank lists."""
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
    def label(self) -> str:
        """``2F0``: the action's own notation."""
        return f"{self.stage}{self.kind}{self.mb}"
