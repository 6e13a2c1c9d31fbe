"""Message bookkeeping between two neighbouring stages: when a message may be dropped, and the
slicing that builds a microbatch from messages.

A message is one microbatch of the sender (MODEL.md section 4); the receiver
partitions the same samples its own way. Which slices of which messages make up
a receiver microbatch is :func:`umsearch.core.samples.chunk_overlaps` (``(message,
offset, count)`` triples); everything here is a pure function of the two size
lists, so the sender and the receiver agree without talking.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from umsearch.core.samples import chunk_overlaps

Piece = tuple[int, int, int]
"""``(message, offset in the message, count)``: one slice of a receiver microbatch."""


def last_use(sender: Sequence[int], receiver: Sequence[int]) -> list[int]:
    """For each message, the last receiver microbatch that reads it.

    After that microbatch has been built, the receiver can let the message go.
    """
    last = [0] * len(sender)
    for index in range(len(receiver)):
        for message, _, _ in chunk_overlaps(sender, receiver, index):
            last[message] = index
    return last


def releases(sender: Sequence[int], receiver: Sequence[int]) -> list[list[int]]:
    """For each receiver microbatch, the messages no later microbatch reads."""
    out: list[list[int]] = [[] for _ in receiver]
    for message, index in enumerate(last_use(sender, receiver)):
        out[index].append(message)
    return out


def assemble(buffers: Mapping[int, torch.Tensor], parts: Sequence[Piece]) -> torch.Tensor:
    """Concatenate the slices ``parts`` of ``buffers`` (message index -> tensor, samples on dim 0).

    A microbatch that is exactly one whole message is that buffer itself (no
    copy); one slice of a message is a view; several slices are one copy.
    """
    views = [buffers[m].narrow(0, offset, count) for m, offset, count in parts]
    if len(views) == 1:
        return views[0]
    return torch.cat(views, dim=0)
