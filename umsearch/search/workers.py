"""How many cores a search uses: the ``[search] workers`` setting made effective.

The search's work is scoring batches of candidates (a population, a polish
step's neighbours, a baseline's partitions) and, in the polish, drawing and
repairing the neighbours it scores. Scoring runs in compiled loops that split
a batch into blocks of candidates over numba's worker threads, each candidate
computed alone; the polish's chains run side by side in worker processes
(:mod:`umsearch.search.chains`), each on its own random stream, since most of
a climb is Python, which threads cannot share. Either way, a candidate's
time and memory, hence every choice the search makes and the plan it
returns, do not depend on how many workers there are.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import numba


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def worker_count(setting: int) -> int:
    """Workers a search uses: ``setting`` (0: every available core), at most numba's thread pool."""
    return max(1, min(setting or available_cores(), numba.config.NUMBA_NUM_THREADS))  # type: ignore[attr-defined]


@contextmanager
def workers(setting: int) -> Iterator[int]:
    """Score with :func:`worker_count` ``(setting)`` threads inside the block; the previous count after it."""
    before = numba.get_num_threads()
    n = worker_count(setting)
    numba.set_num_threads(n)
    try:
        yield n
    finally:
        numba.set_num_threads(before)
