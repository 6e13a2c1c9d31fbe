"""Polish chains: a polish round's iterated climbs, one per start, side by side in worker processes.

A chain is one :func:`~umsearch.search.local.iterated_climb` from one start
genome with its own random stream, drawn from (search seed, round, chain
index) alone: what a chain finds does not depend on which process runs it,
so a search returns the same plan with any number of workers. Most of a
climb is Python (drawing and repairing neighbours), which threads cannot
share, so chains run in processes: ``forkserver`` ones (``spawn`` where there
is none), because numba's OpenMP threads make a plain ``fork`` of the search
process unsafe. A pool serves one scorer (one search, or one factorization
of a cluster); its workers get the scorer once, ignore Ctrl-C (the parent
stops them) and score on one numba thread each.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import random
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass
from types import ModuleType, TracebackType

import numba

from umsearch.search.genome import Rules
from umsearch.search.local import ClimbConfig, Memo, Step, iterated_climb
from umsearch.search.scoring import Scorer


@dataclass(frozen=True, kw_only=True)
class Chain:
    """One iterated climb to run."""

    start: Step
    """Where it starts (a feasible genome, scored)."""
    seed: int
    """Its random stream's seed (:func:`chain_seed`)."""


@dataclass(frozen=True, kw_only=True)
class ChainResult:
    """What one chain found."""

    steps: tuple[Step, ...]
    """Every step it accepted as its best, in order (the last is its best)."""
    scored: int
    """Plans it scored (each distinct genome once)."""


def chain_seed(seed: int, round_: int, index: int) -> int:
    """The random seed of chain ``index`` of polish round ``round_`` of a search with ``seed``: distinct
    for distinct triples of small numbers, and the same in every process."""
    return (seed * 1_000_003 + round_) * 1_009 + index


def run_chain(score: Scorer, rules: Rules, chain: Chain, config: ClimbConfig, deadline: float = math.inf) -> ChainResult:
    """Climb ``chain`` (see :func:`~umsearch.search.local.iterated_climb`) with a memo of its own."""
    before = score.count
    steps: list[Step] = []
    iterated_climb(chain.start, Memo(score), rules, random.Random(chain.seed), config, deadline, steps.append)
    return ChainResult(steps=tuple(steps), scored=score.count - before)


# What a worker process climbs with, set once by the pool's initializer.
_worker: tuple[Scorer, Rules, ClimbConfig] | None = None


def _start_worker(score: Scorer, rules: Rules, config: ClimbConfig) -> None:
    global _worker
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's: it terminates the pool
    numba.set_num_threads(1)
    _worker = (score, rules, config)


def _in_worker(job: tuple[int, Chain, float]) -> tuple[int, ChainResult]:
    assert _worker is not None, "a chain ran in a process its pool did not start"
    index, chain, deadline = job
    score, rules, config = _worker
    return index, run_chain(score, rules, chain, config, deadline)


@contextmanager
def _main_hidden() -> Iterator[None]:
    """While workers start, ``__main__`` is a blank module: a new worker would otherwise run the caller's
    script again (multiprocessing's spawn and forkserver re-import it), and a script calling the search
    without an ``if __name__ == "__main__":`` guard would start the search again in every worker. Workers
    need nothing from it: they run this module's functions."""
    main = sys.modules["__main__"]
    sys.modules["__main__"] = ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


def _context() -> mp.context.BaseContext:
    if "forkserver" in mp.get_all_start_methods():
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload([__name__])  # the server imports the search once; workers fork from it
        return ctx
    return mp.get_context("spawn")


class ChainPool:
    """Runs chains of one scorer: in this process with one worker, else in ``workers`` processes
    (started on first use, stopped on leaving the ``with`` block, whatever ended it). Where no process
    can start, or one dies, the chains left run here: the results are the same."""

    def __init__(self, score: Scorer, rules: Rules, config: ClimbConfig, workers: int) -> None:
        self.score, self.rules, self.config, self.workers = score, rules, config, max(1, workers)
        self._pool: ProcessPoolExecutor | None = None

    def __enter__(self) -> ChainPool:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close(now=kind is not None)

    def close(self, now: bool = True) -> None:
        """Stop the worker processes (none are left behind): ``now`` kills them mid-chain, else they
        end once idle."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        if now:  # the executor can only wait for its jobs (before Python 3.14): end its processes first
            for proc in list((getattr(pool, "_processes", None) or {}).values()):
                proc.terminate()
        pool.shutdown(wait=True, cancel_futures=True)

    def run(self, chains: Sequence[Chain], deadline: float = math.inf,
            on_done: Callable[[int], None] | None = None) -> list[ChainResult]:  # fmt: skip
        """Every chain's result, in chain order; ``on_done(n)`` after the n-th chain ends (in any order).
        Plans the workers scored are added to ``score.count``."""
        results: list[ChainResult | None] = [None] * len(chains)
        for done, (i, res, elsewhere) in enumerate(self._results(chains, deadline), start=1):
            results[i] = res
            if elsewhere:  # a worker process scored with its own copy of the scorer
                self.score.count += res.scored
            if on_done is not None:
                on_done(done)
        return [r for r in results if r is not None]

    def _results(self, chains: Sequence[Chain], deadline: float) -> Iterator[tuple[int, ChainResult, bool]]:
        left = dict(enumerate(chains))
        if self.workers > 1 and len(chains) > 1:
            try:
                for i, res in self._elsewhere(left, deadline):
                    del left[i]
                    yield i, res, True
            except (OSError, BrokenProcessPool):  # no /dev/shm for the locks, a process limit, a worker killed
                self.close()
                self.workers = 1
        for i, chain in left.items():
            yield i, run_chain(self.score, self.rules, chain, self.config, deadline), False

    def _elsewhere(self, chains: dict[int, Chain], deadline: float) -> Iterator[tuple[int, ChainResult]]:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(self.workers, mp_context=_context(), initializer=_start_worker,
                                             initargs=(self.score, self.rules, self.config))  # fmt: skip
        with _main_hidden():  # workers start as jobs are submitted
            jobs = [self._pool.submit(_in_worker, (i, c, deadline)) for i, c in chains.items()]
        try:
            for job in as_completed(jobs):
                yield job.result()
        except KeyboardInterrupt:
            self.close()
            raise
