"""The search: never behind a baseline, deterministic, honest about budgets and interruptions."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.search.helpers import small_bimodal_space
from umsearch.core.plan_rules import validate_plan
from umsearch.core.profile import save_profile
from umsearch.errors import NoFeasiblePlanError
from umsearch.search.driver import Progress, run_search
from umsearch.search.space import build_space


def _space(tmp_path: Path, **kw: object):  # type: ignore[no-untyped-def]
    return small_bimodal_space(tmp_path, **{"population": 24, "generations": 6, "seed": 1, "polish_stall": 12, **kw})


def _peers(res):  # type: ignore[no-untyped-def]
    return [b for b in res.baselines.values() if b is not None]


def test_never_slower_than_baselines_and_deterministic(tmp_path: Path) -> None:
    profile, space = _space(tmp_path)
    a, b = run_search(space, profile), run_search(space, profile)
    assert all(a.best.iteration_ms <= base.iteration_ms for base in _peers(a))
    assert a.best.plan == b.best.plan and a.best.iteration_ms == b.best.iteration_ms
    assert not a.budget_hit and not a.interrupted
    validate_plan(a.best.plan, profile.num_layers)
    assert a.lower_bound_ms <= a.best.iteration_ms
    times = [s.iteration_ms for s in a.pareto]
    mems = [s.max_memory for s in a.pareto]
    assert times == sorted(times) and mems == sorted(mems, reverse=True) and a.pareto[0] is a.best


def test_unequal_microbatches_pay_off_on_two_kinds_of_layer(tmp_path: Path) -> None:
    profile, space = _space(tmp_path, global_batch=32, max_microbatch=32)
    res = run_search(space, profile)
    best_peer = min(b.iteration_ms for k, b in res.baselines.items() if b is not None and k != "local greedy")
    assert res.best.iteration_ms < best_peer * 0.97


def test_no_feasible_plan_says_what_to_do(tmp_path: Path) -> None:
    profile, space = _space(tmp_path, memory_limit=10, generations=2)
    with pytest.raises(NoFeasiblePlanError, match="raise the limit"):
        run_search(space, profile)


def test_ctrl_c_keeps_the_best_so_far(tmp_path: Path) -> None:
    profile, space = _space(tmp_path, generations=30)
    seen: list[Progress] = []

    def stop_in_generation_3(p: Progress) -> None:
        seen.append(p)
        if p.phase == "nsga2" and p.done == 3:
            raise KeyboardInterrupt

    res = run_search(space, profile, stop_in_generation_3)
    assert res.interrupted and res.generations == 3
    from itertools import groupby

    assert [k for k, _ in groupby(p.phase for p in seen)][:3] == ["baselines", "first pass", "nsga2"]
    assert [p.done for p in seen if p.phase == "baselines"] == list(range(len(space.schedule.peers) + 2))
    assert all(res.best.iteration_ms <= base.iteration_ms for base in _peers(res))


def test_progress_counts_something_in_every_phase(tmp_path: Path) -> None:
    profile, space = _space(tmp_path)
    seen: list[Progress] = []
    run_search(space, profile, seen.append)
    phases = {p.phase for p in seen}
    assert phases == {"baselines", "first pass", "nsga2", "polish", "refine"}
    nsga = [p for p in seen if p.phase == "nsga2"]
    assert [p.done for p in nsga] == list(range(1, space.search.generations + 1)) and nsga[0].total == space.search.generations
    assert all(p.evaluations > 0 for p in seen if p.phase != "baselines" or p.done == 1)


def test_time_budget_stops_and_says_so(tmp_path: Path) -> None:
    profile, space = _space(tmp_path, generations=10_000, time_budget_s=0.5)
    res = run_search(space, profile)
    assert res.budget_hit and res.generations < 10_000
    assert all(res.best.iteration_ms <= base.iteration_ms for base in _peers(res))


@pytest.mark.slow
def test_a_model_of_thousands_of_layers_honours_the_budget(tmp_path: Path) -> None:
    """2000 layers used to spend 95 s in the baselines alone with a 10 s budget, reporting nothing."""
    import time

    from umsearch.measure.synthetic import simnet_profile

    profile = simnet_profile(layers=2000)
    path = tmp_path / "big.json"
    save_profile(profile, path)
    space = build_space({"profile": str(path), "ranks": 4, "global_batch": 32, "memory_limit": "800GiB",
                         "time_budget_s": 4, "seed": 0})  # fmt: skip
    seen: list[Progress] = []
    t0 = time.perf_counter()
    res = run_search(space, profile, seen.append)
    wall = time.perf_counter() - t0
    assert res.budget_hit
    assert len([p for p in seen if p.phase == "baselines"]) >= len(space.schedule.peers)
    assert wall < 60, wall  # budget 4 s; generous slack for a loaded machine, far below the old 100 s
    validate_plan(res.best.plan, 2000)


def test_every_baseline_plan_seeds_the_search(tmp_path: Path) -> None:
    """Each feasible peer's plan the space's rules can express (its chunks per rank allowed, its lists valid)
    becomes a genome of its structure with its cuts and lists."""
    from umsearch.search.pipeline_search import Run, baseline_genomes, structure

    profile, space = _space(tmp_path)
    run = Run(space, profile, None)
    base = run.baselines(float("inf"))
    genomes = baseline_genomes(run.rules, base)
    expressible = [b for b in base.values() if b is not None and b.plan.num_stages // space.ranks in run.rules.stages_per_rank
                   and all(run.rules.valid_sequence(st.forward) for st in b.plan.stages)]  # fmt: skip
    assert expressible
    for b in expressible:
        v = b.plan.num_stages // space.ranks
        mine = [g for g in genomes if g.v == v and g.cuts == (*(st.lo for st in b.plan.stages), profile.num_layers)
                and g.forward == tuple(st.forward for st in b.plan.stages)]  # fmt: skip
        assert mine, b.name
        assert {structure(g) for g in mine} == {structure(mine[0])}


def test_nsga2_stops_when_it_converges_before_the_ceiling(tmp_path: Path) -> None:
    profile, space = _space(tmp_path, generations=100_000, stall_generations=3, tolerance=0.5)
    res = run_search(space, profile)
    assert not res.budget_hit and 4 <= res.generations < 100_000


def _spread(times: list[float]) -> float:
    return max(times) / min(times) - 1


def _at_defaults(name: str, seed: int, tmp_path: Path):  # type: ignore[no-untyped-def]
    """``benchmarks/search.py``'s setup: a bundled space's profile (or the two-regime one) at R = 4, B = 64,
    every [search] key at its default but the seed."""
    from benchmarks.search import space_for

    return space_for(name, seed, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt_cpu", "vgg16_cpu", "default", "simnet1", "bimodal"])
def test_seeds_0_to_9_land_within_half_a_percent_of_the_best(name: str, tmp_path: Path) -> None:
    """Issue #37: at default settings every seed finds the plan (within 0.5% of the best of seeds 0-9).
    Where it is not met yet (gpt24_h200 1.71%, the two-regime profile) the spread is measured by
    benchmarks/search.py (results/bench/search.json), not asserted here."""
    times = [run_search(*_at_defaults(name, s, tmp_path)).best.iteration_ms for s in range(10)]
    assert _spread(times) <= 0.005, times
