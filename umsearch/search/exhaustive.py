"""The exact optimum of tiny instances, by enumeration: the ground truth the search is tested against.

Enumerates every cut vector, every composition of B per stage that the
space's rules allow (forward = backward, no recompute) and every warmup the
schedule family allows, and scores them all with the batch evaluator.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from umsearch.core.cost import CostModel
from umsearch.core.errors import SearchSpaceError
from umsearch.core.plan import Plan, StagePlan
from umsearch.search.baselines import all_cuts
from umsearch.search.genome import Rules, repair_sequence
from umsearch.search.scoring import Scored, Scorer
from umsearch.search.space import SearchSpace

MAX_PLANS = 500_000


def compositions(batch: int) -> Iterator[tuple[int, ...]]:
    """Every ordered way to write ``batch`` as a sum of positive sizes (2 ** (batch - 1) of them)."""
    for mask in range(2 ** (batch - 1)):
        out, run = [], 1
        for i in range(batch - 1):
            if mask >> i & 1:
                out.append(run)
                run = 1
            else:
                run += 1
        out.append(run)
        yield tuple(out)


def _stage_choices(rules: Rules, s: int) -> list[tuple[tuple[int, ...], int]]:
    seqs = [c for c in compositions(rules.batch) if repair_sequence(c, rules) == c]
    return [(c, w) for c in seqs for w in sorted({rules.warmup(s, len(c), w) for w in range(1, len(c) + 1)})]


def exhaustive_optimum(cost: CostModel, space: SearchSpace) -> Scored | None:
    """The fastest feasible plan without recompute; refuses instances over ``MAX_PLANS`` plans."""
    rules = Rules.of(space, cost.num_layers)
    choices = [_stage_choices(rules, s) for s in range(rules.stages)]
    cuts_list = all_cuts(cost.num_layers, rules.stages)
    total = len(cuts_list)
    for c in choices:
        total *= len(c)
    if total > MAX_PLANS:
        raise SearchSpaceError(f"exhaustive search over {total} plans exceeds {MAX_PLANS}; shrink global_batch or stages")
    plans = [
        Plan(global_batch=rules.batch, stages=tuple(
            StagePlan(layers=(cuts[s], cuts[s + 1]), forward=seq, backward=seq, warmup=w)
            for s, (seq, w) in enumerate(combo)))
        for cuts in cuts_list for combo in itertools.product(*choices)
    ]  # fmt: skip
    return Scorer(cost).fastest(plans, space.memory_limit, "exhaustive", f"{total} plans")
