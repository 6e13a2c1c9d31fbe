"""Sample bookkeeping between two partitions of the same batch (docs/model.md section 2).

Samples flow in order ``0..B-1`` and a microbatch is a contiguous sample
range, so two size lists over the same batch meet in a merge: which of one
list's microbatches hold the samples of the other's. Pure functions of the
size lists; the simulators, validation and the runtime all take their sample
arithmetic from here, so they cannot disagree. Everything over whole lists is
one linear merge (a plan may hold 100,000 microbatches).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate


def cumulative(sizes: Sequence[int]) -> list[int]:
    """``C(n)`` for n = 0..len: samples in the first n microbatches."""
    return [0, *accumulate(sizes)]


def spans(sender: Sequence[int], receiver: Sequence[int]) -> list[range]:
    """For each microbatch of ``receiver``, the indices of ``sender``'s microbatches holding its samples.

    Both lists partition the same samples in order; one merge, linear in both lengths.
    """
    out: list[range] = []
    m, end = 0, sender[0] if sender else 0  # end: samples through sender microbatch m
    lo = 0
    for size in receiver:
        hi = lo + size
        first = m
        while end < hi:
            m += 1
            end += sender[m]
        out.append(range(first, m + 1))
        lo = hi
        if end == hi and m + 1 < len(sender):  # the next receiver microbatch starts in the next sender one
            m += 1
            end += sender[m]
    return out


def all_overlaps(sender: Sequence[int], receiver: Sequence[int]) -> list[list[tuple[int, int, int]]]:
    """How each microbatch of ``receiver`` is assembled from ``sender``'s microbatches, in one linear
    merge: per receiver microbatch, ``(message, offset_in_message, count)`` triples in sample order
    (the runtime slices each received message by these)."""
    cs = cumulative(sender)
    out = []
    lo = 0
    for size, span in zip(receiver, spans(sender, receiver), strict=True):
        hi = lo + size
        out.append([(m, max(lo, cs[m]) - cs[m], min(hi, cs[m + 1]) - max(lo, cs[m])) for m in span])
        lo = hi
    return out
