"""Message bookkeeping: which slices build a microbatch and when a message may go."""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

from umsearch.core.samples import chunk_overlaps as pieces
from umsearch.runtime.messages import assemble, last_use, releases


def test_pieces_split_and_join() -> None:
    # sender [4, 8], receiver [3, 3, 6]: microbatch 1 spans both messages; (message, offset, count).
    assert pieces([4, 8], [3, 3, 6], 0) == [(0, 0, 3)]
    assert pieces([4, 8], [3, 3, 6], 1) == [(0, 3, 1), (1, 0, 2)]
    assert pieces([4, 8], [3, 3, 6], 2) == [(1, 2, 6)]


def test_last_use_and_releases() -> None:
    assert last_use([4, 8], [3, 3, 6]) == [1, 2]
    assert releases([4, 8], [3, 3, 6]) == [[], [0], [1]]
    # One big message feeds every receiver microbatch: released after the last.
    assert releases([12], [2, 4, 6]) == [[], [], [0]]


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


@given(st.integers(1, 20).flatmap(lambda n: st.tuples(_partition(n), _partition(n))))
def test_assembly_reproduces_every_sample_in_order(parts: tuple[list[int], list[int]]) -> None:
    sender, receiver = parts
    data = torch.arange(float(sum(sender)))
    bufs = dict(enumerate(torch.split(data, sender)))
    rebuilt = torch.cat([assemble(bufs, pieces(sender, receiver, i)) for i in range(len(receiver))])
    assert torch.equal(rebuilt, data)
    # Every message is released exactly once, at its last reader.
    released = [m for rel in releases(sender, receiver) for m in rel]
    assert sorted(released) == list(range(len(sender)))
