"""Sample bookkeeping between two partitions of the same batch (MODEL.md section 2).

Samples flow in order ``0..B-1`` and a microbatch is a contiguous sample
range, so two size lists over the same batch meet in a merge: which of one
list's microbatches hold the samples of the other's. Pure functions of the
size lists; the simulators, validation and the runtime all take their sample
arithmetic from here, so they cannot disagree. Everything over whole lists is
one linear merge (a plan may hold 100,000 microbatches).

(``op_order`` and friends below are the v1 warmup rule, kept until every
caller uses :func:`umsearch.core.schedules.warmup_rule`.)
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate
from typing import Literal

Op = tuple[Literal["F", "B"], int]
"""``("F", j)`` is forward microbatch j, ``("B", k)`` backward microbatch k."""


def cumulative(sizes: Sequence[int]) -> list[int]:
    """``C(n)`` for n = 0..len: samples in the first n microbatches."""
    return [0, *accumulate(sizes)]


def covering_index(cum: Sequence[int], samples: int) -> int:
    """Smallest n with ``cum[n] >= samples`` (``cum`` from :func:`cumulative`)."""
    lo, hi = 0, len(cum) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if cum[mid] >= samples:
            hi = mid
        else:
            lo = mid + 1
    return lo


def forwards_before_backward(
    forward: Sequence[int], backward: Sequence[int], warmup: int
) -> list[int]:
    """For each backward k, how many forwards the stage has run before it."""
    cf, cb = cumulative(forward), cumulative(backward)
    return [
        max(covering_index(cf, cb[k + 1]), min(k + warmup, len(forward)))
        for k in range(len(backward))
    ]


def op_order(forward: Sequence[int], backward: Sequence[int], warmup: int) -> list[Op]:
    """The stage's ops in execution order."""
    ops: list[Op] = []
    done = 0
    for k, count in enumerate(forwards_before_backward(forward, backward, warmup)):
        ops.extend(("F", j) for j in range(done, count))
        done = max(done, count)
        ops.append(("B", k))
    ops.extend(("F", j) for j in range(done, len(forward)))
    return ops


def peak_inflight(forward: Sequence[int], backward: Sequence[int], warmup: int) -> int:
    """``inflight_s``: most samples forwarded but not yet backwarded after any forward op."""
    cf, cb = cumulative(forward), cumulative(backward)
    fwd = bwd = peak = 0
    for kind, _ in op_order(forward, backward, warmup):
        if kind == "F":
            fwd += 1
            peak = max(peak, cf[fwd] - cb[bwd])
        else:
            bwd += 1
    return peak


def message_span(sender: Sequence[int], receiver: Sequence[int], index: int) -> range:
    """Indices of ``sender``'s microbatches holding any sample of ``receiver[index]``.

    Both lists partition the same samples in order; a message is one sender
    microbatch, so these are the messages the receiver's op waits for.
    """
    cs, cr = cumulative(sender), cumulative(receiver)
    first = covering_index(cs, cr[index] + 1) - 1
    last = covering_index(cs, cr[index + 1]) - 1
    return range(first, last + 1)


def chunk_overlaps(
    sender: Sequence[int], receiver: Sequence[int], index: int
) -> list[tuple[int, int, int]]:
    """How ``receiver[index]`` is assembled from ``sender``'s microbatches.

    Returns ``(message, offset_in_message, count)`` triples in sample order:
    the runtime slices each received message by these to build a microbatch.
    """
    cs, cr = cumulative(sender), cumulative(receiver)
    lo, hi = cr[index], cr[index + 1]
    out = []
    for m in message_span(sender, receiver, index):
        a, b = max(lo, cs[m]), min(hi, cs[m + 1])
        out.append((m, a - cs[m], b - a))
    return out


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
    """:func:`chunk_overlaps` for every microbatch of ``receiver``, in one linear merge."""
    cs = cumulative(sender)
    out = []
    lo = 0
    for size, span in zip(receiver, spans(sender, receiver), strict=True):
        hi = lo + size
        out.append([(m, max(lo, cs[m]) - cs[m], min(hi, cs[m + 1]) - max(lo, cs[m])) for m in span])
        lo = hi
    return out
