"""Message bookkeeping between two stages: which slices build a microbatch, and when a message may go.

A message is one microbatch of the sending stage (docs/model.md section 4); the
receiving stage partitions the same samples its own way. Which slices of
which messages make up a receiver microbatch is
:func:`umsearch.core.samples.all_overlaps` (``(message, offset, count)``
triples, one linear merge for the whole lists); everything here is a pure
function of the size lists and the order in which the receiver reads its
microbatches, so the sender and the receiver agree without talking.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import torch

Piece = tuple[int, int, int]
"""``(message, offset in the message, count)``: one slice of a receiver microbatch."""


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


def assemble(buffers: Mapping[int, torch.Tensor], parts: Sequence[Piece]) -> torch.Tensor:
    """Concatenate the slices ``parts`` of ``buffers`` (message index -> tensor, samples on dim 0).

    A microbatch that is exactly one whole message is that buffer itself (no
    copy); one slice of a message is a view; several slices are one copy.
    """
    views = [buffers[m].narrow(0, offset, count) for m, offset, count in parts]
    if len(views) == 1:
        return views[0]
    return torch.cat(views, dim=0)
