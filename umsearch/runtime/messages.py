"""Message bookkeeping between two stages: which slices build a microbatch, and when a message may go.

A message is one microbatch of the sending stage (docs/model.md section 4); the
receiving stage partitions the same samples its own way. Which slices of
which messages make up a receiver microbatch is
:func:`umsearch.core.samples.all_overlaps` (``(message, offset, count)``
triples, one linear merge for the whole lists); everything here is a pure
function of the size lists and the order in which the receiver reads its
microbatches, so the sender and the receiver agree without talking. Which
slices and releases each step has is worked out once, when the plan is
lowered (:mod:`umsearch.core.program`); this module assembles them on tensors.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from umsearch.core.program import Piece as Piece  # re-exported: the slices live in the program
from umsearch.core.program import releases as releases


def assemble(buffers: Mapping[int, torch.Tensor], parts: Sequence[Piece]) -> torch.Tensor:
    """Concatenate the slices ``parts`` of ``buffers`` (message index -> tensor, samples on dim 0).

    A microbatch that is exactly one whole message is that buffer itself (no
    copy); one slice of a message is a view; several slices are one copy.
    """
    views = [buffers[m].narrow(0, offset, count) for m, offset, count in parts]
    if len(views) == 1:
        return views[0]
    return torch.cat(views, dim=0)
