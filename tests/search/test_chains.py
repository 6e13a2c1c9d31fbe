"""Polish chains in worker processes: the same results as in this process, and no process left behind."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import replace
from pathlib import Path

import pytest

from tests.search.helpers import small_bimodal_space
from umsearch.core.cost import CostModel
from umsearch.search.chains import Chain, ChainPool, chain_seed
from umsearch.search.driver import run_search
from umsearch.search.genome import Rules
from umsearch.search.local import ClimbConfig, Step
from umsearch.search.operators import random_genome
from umsearch.search.partition import stage_cuts
from umsearch.search.pipeline_search import Progress
from umsearch.search.scoring import Scorer

CONFIG = ClimbConfig(neighbours=12, patience=2, kicks=3, stall=2)


def _chains(tmp_path: Path, n: int) -> tuple[Scorer, Rules, list[Chain]]:
    import random

    profile, space = small_bimodal_space(tmp_path)
    rules = Rules.of(space, profile)
    tables = CostModel(profile, state_factor=space.state_factor).tables(rules.largest)
    score = Scorer(rules, tables, space.memory_limit)
    anchors = {v: [stage_cuts(tables, b, space.ranks * v) for b in (1, rules.largest)] for v in rules.stages_per_rank}
    rng = random.Random(5)
    genomes = [random_genome(rules, anchors, rng) for _ in range(n)]
    t, mem = score.genome_times(genomes)
    steps = [Step(genome=g, iteration_ms=float(a), max_memory_bytes=float(b)) for g, a, b in zip(genomes, t, mem, strict=True)]
    return score, rules, [Chain(start=s, seed=chain_seed(7, 0, i)) for i, s in enumerate(steps)]


def _gone(pid: int, within_s: float = 30.0) -> bool:
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_chain_seeds_differ_across_searches_rounds_and_chains() -> None:
    seeds = {chain_seed(s, r, i) for s in range(20) for r in range(5) for i in range(8)}
    assert len(seeds) == 20 * 5 * 8
    assert chain_seed(3, 1, 2) == chain_seed(3, 1, 2)


def test_chains_find_the_same_in_workers_as_in_this_process(tmp_path: Path) -> None:
    score, rules, chains = _chains(tmp_path, 3)
    here = ChainPool(score, rules, CONFIG, workers=1).run(chains)
    counted = score.count
    done: list[int] = []
    with ChainPool(score, rules, CONFIG, workers=2) as pool:
        there = pool.run(chains, on_done=done.append)
    assert there == here and all(r.steps for r in here)
    assert done == [1, 2, 3]
    # The workers' plans scored are added to the parent's count: the same as scoring them here.
    assert counted == 3 + sum(r.scored for r in here) and score.count - counted == counted - 3


def test_no_worker_outlives_its_pool_even_on_an_error(tmp_path: Path) -> None:
    score, rules, chains = _chains(tmp_path, 2)
    with pytest.raises(RuntimeError, match="boom"), ChainPool(score, rules, CONFIG, workers=2) as pool:
        pool.run(chains)
        pids = _pids(pool)
        raise RuntimeError("boom")
    assert pids and all(_gone(pid) for pid in pids)


def test_a_script_without_a_main_guard_is_not_run_again_by_the_workers(tmp_path: Path) -> None:
    """Workers start from a blank ``__main__``: the caller's script is not imported in them."""
    import subprocess
    import sys

    marker = tmp_path / "runs.txt"
    script = tmp_path / "plain_script.py"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})\n"
        f"open({str(marker)!r}, 'a').write('x')\n"
        "from tests.search.test_chains import _chains, CONFIG\n"
        "from umsearch.search.chains import ChainPool\n"
        "from pathlib import Path\n"
        f"score, rules, chains = _chains(Path({str(tmp_path)!r}), 2)\n"
        "with ChainPool(score, rules, CONFIG, workers=2) as pool:\n"
        "    print(len(pool.run(chains)))\n"
    )  # fmt: skip
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.strip() == "2" and marker.read_text() == "x"


def test_ctrl_c_in_the_polish_keeps_what_was_found_and_stops_the_workers(tmp_path: Path) -> None:
    profile, space = small_bimodal_space(tmp_path, polish_stall=40, workers=2)
    sent: list[bool] = []
    workers: list[int] = []
    before = _worker_pids()

    def interrupt(p: Progress) -> None:
        if p.phase == "polish" and not sent:  # the first chain has ended: stop the others
            sent.append(True)
            workers.extend(_worker_pids() - before)
            os.kill(os.getpid(), signal.SIGINT)

    # Ctrl-C as in a process started from a terminal (KeyboardInterrupt): pytest runs with SIGINT ignored when a
    # non-interactive shell started it in the background.
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        res = run_search(space, profile, on_progress=interrupt)
    finally:
        signal.signal(signal.SIGINT, old)
    assert sent and res.interrupted and workers
    assert res.best.iteration_ms <= min(b.iteration_ms for b in res.baselines.values() if b is not None)
    assert all(_gone(pid) for pid in workers)


def _worker_pids() -> set[int]:
    """Processes running multiprocessing's code but the fork server and the resource tracker (which live as
    long as this process; the first pool a test process starts starts them too)."""
    from multiprocessing import forkserver

    server = getattr(forkserver._forkserver, "_forkserver_pid", None)  # type: ignore[attr-defined]
    out = set()
    for p in os.listdir("/proc"):
        try:
            cmdline = Path(f"/proc/{p}/cmdline").read_bytes()
            if p.isdigit() and int(p) != server and b"multiprocessing" in cmdline and b"resource_tracker" not in cmdline:
                out.add(int(p))
        except OSError:
            pass
    return out


def test_chains_run_here_when_no_worker_process_can_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import umsearch.search.chains as chains_module

    score, rules, chains = _chains(tmp_path, 2)
    here = ChainPool(score, rules, CONFIG, workers=1).run(chains)
    counted = score.count

    def refuse() -> None:
        raise OSError(28, "No space left on device")  # what a full /dev/shm says

    monkeypatch.setattr(chains_module, "_context", refuse)
    with ChainPool(score, rules, CONFIG, workers=2) as pool:
        assert pool.run(chains) == here and pool.workers == 1
    assert score.count - counted == counted - 2


def _pids(pool: ChainPool) -> list[int]:
    assert pool._pool is not None
    return list(pool._pool._processes)  # type: ignore[attr-defined]


def test_chains_a_killed_worker_left_run_here(tmp_path: Path) -> None:
    score, rules, chains = _chains(tmp_path, 3)
    config = replace(CONFIG, kicks=12, stall=12)
    here = ChainPool(score, rules, config, workers=1).run(chains)
    killed: list[int] = []
    with ChainPool(score, rules, config, workers=2) as pool:

        def kill(done: int) -> None:
            if not killed:  # one chain has ended; the others run in the workers: kill them all
                killed.extend(_pids(pool))
                for pid in killed:
                    os.kill(pid, signal.SIGKILL)

        assert pool.run(chains, on_done=kill) == here
        assert pool.workers == 1  # the rest ran here
    assert killed and all(_gone(pid) for pid in killed)
