"""Random walks of :func:`neighbour` from fixed seeds match a digest taken from an earlier commit, so
speed-ups of moves, repair and hashing keep every search's random draws and plans unchanged."""

from __future__ import annotations

import hashlib
import random

import pytest

from umsearch.search.genome import Genome, Rules, genome_of
from umsearch.search.moves import neighbour

# Computed with the code of commit 2985409 (before #37's neighbour speed-ups).
GOLDEN = {
    "plain": "ef95f539ca92373dedfc8980687ac9f23013da9e1cc7905dd715a0c3de768bfe",
    "memory": "fa311ec41fdf0f88ce77910412b068911b2b80f9531d1c371aa8ebc9e727f1c9",
    "one_structure": "bf18de2408a28672db4e131af31b800e192e1d3c840ce406ef33d0440e2f9bb4",
}


def _rules(case: str) -> Rules:
    base: dict[str, object] = dict(num_layers=12, ranks=3, batch=24, sizes=(1, 2, 3, 4, 6, 8), max_count=10,
                                   stages_per_rank=(1, 2), placements=("loop", "vshape"), split=True,
                                   recompute=True)  # fmt: skip
    if case == "memory":
        base.update(memory_binds=True, stash=tuple(float(1 + i % 3) for i in range(12)), memory_limit=1e9)
    if case == "one_structure":
        base.update(stages_per_rank=(1,), placements=("loop",), split=False, recompute=False)
    return Rules(**base)  # type: ignore[arg-type]


def _walk(case: str, valid: bool, seeds: int = 20, steps: int = 150) -> str:
    rules = _rules(case)
    digest = hashlib.sha256()
    for seed in range(seeds):
        rng = random.Random(seed)
        g: Genome = genome_of(rules, 1, "loop", (0, 4, 8, 12), [(8, 8, 8)] * 3)
        for step in range(steps):
            n = neighbour(g, rules, rng, moves=1 + step % 3, valid=valid)
            digest.update(repr(n).encode())
            digest.update(str(hash(n) == hash(g) and n == g).encode())
            if rng.random() < 0.5:
                g = n
        digest.update(repr(rng.random()).encode())  # the walk drew the same numbers
    return digest.hexdigest()


@pytest.mark.parametrize("valid", [False, True])
@pytest.mark.parametrize("case", sorted(GOLDEN))
def test_neighbour_walks_match_the_golden_digest(case: str, valid: bool) -> None:
    """The walk only visits valid genomes, so telling ``neighbour`` so changes nothing."""
    assert _walk(case, valid) == GOLDEN[case]
