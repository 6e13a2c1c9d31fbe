"""The action IR: what a rank does, in torch.distributed.pipelining's own notation (MODEL.md section 3).

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

Kind = Literal["F", "B", "I", "W"]
KINDS: tuple[Kind, ...] = ("F", "B", "I", "W")
"""Every action kind, in the order of their integer codes (see :data:`KIND_CODE`)."""
KIND_CODE: dict[str, int] = {k: i for i, k in enumerate(KINDS)}
"""``F`` 0, ``B`` 1, ``I`` 2, ``W`` 3: the codes the compiled evaluator uses."""

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
    def sends_gradient(self) -> bool:
        """``B`` and ``I`` produce the input gradient that the previous stage needs."""
        return self.kind in ("B", "I")


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
