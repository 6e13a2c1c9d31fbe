"""Message bookkeeping: which slices build a microbatch and when a message may go."""

from __future__ import annotations

from random import Random

import torch
from hypothesis import given
from hypothesis import strategies as st

from umsearch.core.samples import all_overlaps
from umsearch.runtime.messages import assemble, releases


def pieces(sender: list[int], receiver: list[int], index: int) -> list[tuple[int, int, int]]:
    """:func:`all_overlaps` of one receiver microbatch, sample by sample: the naive oracle."""
    owner = [m for m, n in enumerate(sender) for _ in range(n)]
    lo = sum(receiver[:index])
    out: list[tuple[int, int, int]] = []
    for s in range(lo, lo + receiver[index]):
        m = owner[s]
        if out and out[-1][0] == m:
            out[-1] = (m, out[-1][1], out[-1][2] + 1)
        else:
            out.append((m, s - sum(sender[:m]), 1))
    return out


def test_all_overlaps_equals_the_naive_oracle() -> None:
    for sender, receiver in [([4, 8], [3, 3, 6]), ([1, 1, 10], [12]), ([12], [2, 4, 6]), ([5, 7], [5, 7])]:
        assert all_overlaps(sender, receiver) == [pieces(sender, receiver, i) for i in range(len(receiver))]


def test_pieces_split_and_join() -> None:
    # sender [4, 8], receiver [3, 3, 6]: microbatch 1 spans both messages; (message, offset, count).
    assert pieces([4, 8], [3, 3, 6], 0) == [(0, 0, 3)]
    assert pieces([4, 8], [3, 3, 6], 1) == [(0, 3, 1), (1, 0, 2)]
    assert pieces([4, 8], [3, 3, 6], 2) == [(1, 2, 6)]


def test_releases_follow_the_reading_order() -> None:
    parts = all_overlaps([4, 8], [3, 3, 6])
    assert releases(parts, [0, 1, 2], 2) == [[], [0], [1]]
    # Read last-first, message 1 is dropped after microbatch 1 (its last reader), message 0 after 0.
    assert releases(parts, [2, 1, 0], 2) == [[0], [1], []]
    # One big message feeds every receiver microbatch: released after the last.
    assert releases(all_overlaps([12], [2, 4, 6]), [0, 1, 2], 1) == [[], [], [0]]


def test_assemble_whole_message_is_the_buffer_itself() -> None:
    bufs = {0: torch.arange(4.0).reshape(4, 1), 1: torch.arange(4.0, 12.0).reshape(8, 1)}
    whole = assemble(bufs, pieces([4, 8], [4, 8], 1))
    assert whole.data_ptr() == bufs[1].data_ptr() and whole.shape == (8, 1)
    part = assemble(bufs, pieces([4, 8], [3, 3, 6], 0))
    assert part.data_ptr() == bufs[0].data_ptr()  # a view, no copy
    joined = assemble(bufs, pieces([4, 8], [3, 3, 6], 1))
    assert joined.flatten().tolist() == [3.0, 4.0, 5.0]


def _partition(total: int) -> st.SearchStrategy[list[int]]:
    return st.lists(st.integers(1, total), min_size=1, max_size=total).map(
        lambda cuts: _sizes(sorted(set(c for c in cuts if c < total)), total)
    )


def _sizes(cuts: list[int], total: int) -> list[int]:
    edges = [0, *cuts, total]
    return [b - a for a, b in zip(edges, edges[1:], strict=False)]


@given(st.integers(1, 20).flatmap(lambda n: st.tuples(_partition(n), _partition(n))), st.randoms())
def test_assembly_reproduces_every_sample_in_order(parts: tuple[list[int], list[int]], rnd: Random) -> None:
    sender, receiver = parts
    data = torch.arange(float(sum(sender)))
    bufs = dict(enumerate(torch.split(data, sender)))
    rebuilt = torch.cat([assemble(bufs, pieces(sender, receiver, i)) for i in range(len(receiver))])
    assert torch.equal(rebuilt, data)
    # Every message is released exactly once, at its last reader.
    order = list(range(len(receiver)))
    rnd.shuffle(order)
    rel = releases(all_overlaps(sender, receiver), order, len(sender))
    assert sorted(m for r in rel for m in r) == list(range(len(sender)))
    # ... and never before a later reader has used it.
    for pos, k in enumerate(order):
        later = {m for j in order[pos + 1:] for m, _, _ in all_overlaps(sender, receiver)[j]}
        assert not later & set(rel[k])
