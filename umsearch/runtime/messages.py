"""Message bookkeeping between two neighbouring stages: which pieces build a microbatch, when a
message may be dropped, and the slicing itself.

A message is one microbatch of the sender (MODEL.md section 4); the receiver
partitions the same samples its own way. Everything here is a pure function of
the two size lists, so the sender and the receiver agree without talking.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from umsearch.schedule import chunk_overlaps


@dataclass(frozen=True, kw_only=True)
class Piece:
    """A slice of one received message that belongs to a receiver microbatch."""

    message: int
    """Index of the sender microbatch (the message)."""
    offset: int
    """First sample of the slice, counted inside the message."""
    count: int
    """Samples in the slice."""


def pieces(sender: Sequence[int], receiver: Sequence[int], index: int) -> tuple[Piece, ...]:
    """The slices, in sample order, that make up ``receiver[index]``."""
    return tuple(
        Piece(message=m, offset=off, count=n) for m, off, n in chunk_overlaps(sender, receiver, index)
    )


def last_use(sender: Sequence[int], receiver: Sequence[int]) -> list[int]:
    """For each message, the last receiver microbatch that reads it.

    After that microbatch has been built, the receiver can let the message go.
    """
    last = [0] * len(sender)
    for index in range(len(receiver)):
        for piece in pieces(sender, receiver, index):
            last[piece.message] = index
    return last


def releases(sender: Sequence[int], receiver: Sequence[int]) -> list[list[int]]:
    """For each receiver microbatch, the messages no later microbatch reads."""
    out: list[list[int]] = [[] for _ in receiver]
    for message, index in enumerate(last_use(sender, receiver)):
        out[index].append(message)
    return out


def assemble(buffers: Mapping[int, torch.Tensor], parts: Sequence[Piece]) -> torch.Tensor:
    """Concatenate the slices of ``buffers`` (message index -> tensor, samples on dim 0).

    A microbatch that is exactly one whole message is that buffer itself (no
    copy); one slice of a message is a view; several slices are one copy.
    """
    views = [buffers[p.message].narrow(0, p.offset, p.count) for p in parts]
    if len(views) == 1:
        return views[0]
    return torch.cat(views, dim=0)
