"""The search: optimal on tiny instances, never behind a baseline, deterministic, valid outputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from umsearch.cli.report import write_outputs
from umsearch.core.cost import CostModel
from umsearch.core.errors import NoFeasiblePlanError, SearchSpaceError
from umsearch.core.plan import load_plan
from umsearch.core.profile import load_profile, save_profile
from umsearch.measure.synthetic import simnet_profile
from umsearch.search.bound import lower_bound
from umsearch.search.driver import Progress, run_search
from umsearch.search.exhaustive import exhaustive_optimum
from umsearch.search.space import build_space, load_space, parse_bytes
from umsearch.sim.reference import simulate


def _tiny(tmp_path: Path, seed: int = 3, **kw: object):  # type: ignore[no-untyped-def]
    profile = simnet_profile(layers=4, seed=seed)
    path = tmp_path / "tiny.json"
    save_profile(profile, path)
    values = {"profile": str(path), "stages": 2, "global_batch": 6, "max_microbatch": 6, "population": 40,
              "generations": 40, "recompute": False, "seed": 1, **kw}  # fmt: skip
    return profile, build_space(values)


# Seed 4: the optimum is the unequal (1, 3, 2) on both stages; seed 9: (6,) on one stage, (2, 2, 2) on the other.
@pytest.mark.parametrize("profile_seed", [4, 9])
def test_tiny_search_matches_exhaustive_optimum(tmp_path: Path, profile_seed: int) -> None:
    profile, space = _tiny(tmp_path, seed=profile_seed)
    cost = CostModel(profile, state_factor=space.state_factor)
    exact = exhaustive_optimum(cost, space)
    assert exact is not None
    found = run_search(space, profile)
    assert found.best.iteration_ms <= exact.iteration_ms * 1.01
    assert found.lower_bound_ms <= found.best.iteration_ms
    equal = min(b.iteration_ms for k, b in found.baselines.items() if b is not None and k != "greedy")
    assert found.best.iteration_ms < equal  # unequal microbatches pay off here


def test_never_slower_than_baselines_and_deterministic(tmp_path: Path) -> None:
    profile, space = _tiny(tmp_path, global_batch=16, max_microbatch=16, generations=15)
    a = run_search(space, profile)
    b = run_search(space, profile)
    for base in a.baselines.values():
        if base is not None:
            assert a.best.iteration_ms <= base.iteration_ms
    assert a.best.plan == b.best.plan
    assert a.best.iteration_ms == b.best.iteration_ms


def test_written_plan_validates_and_resimulates(tmp_path: Path) -> None:
    profile, space = _tiny(tmp_path, global_batch=12, generations=5)
    result = run_search(space, profile)
    paths = write_outputs(result, space, profile, tmp_path / "out")
    plan = load_plan(paths["plan"], profile.num_layers)
    res = simulate(plan, CostModel(load_profile(space.profile), state_factor=space.state_factor))
    assert plan.predicted is not None
    assert res.iteration_ms == pytest.approx(plan.predicted["iteration_ms"], rel=1e-9)
    assert list(res.peak_memory_bytes) == pytest.approx(plan.predicted["peak_memory_bytes"], rel=1e-9)
    pareto = json.loads(paths["pareto"].read_text())
    times = [p["iteration_ms"] for p in pareto["plans"]]
    assert times == sorted(times) and times[0] == plan.predicted["iteration_ms"]
    for name in ("report", "pareto_png", "timeline", "trace"):
        assert paths[name].stat().st_size > 0


def test_no_feasible_plan_names_smallest_memory(tmp_path: Path) -> None:
    profile, space = _tiny(tmp_path, memory_limit=10, generations=2)
    with pytest.raises(NoFeasiblePlanError, match="smallest peak memory found is .* on stage"):
        run_search(space, profile)


def test_lower_bound_below_exhaustive(tmp_path: Path) -> None:
    profile, space = _tiny(tmp_path)
    cost = CostModel(profile)
    exact = exhaustive_optimum(cost, space)
    assert exact is not None and lower_bound(cost, space) <= exact.iteration_ms


def test_ctrl_c_keeps_the_best_so_far(tmp_path: Path) -> None:
    profile, space = _tiny(tmp_path, global_batch=16, max_microbatch=16, generations=30)
    seen: list[Progress] = []

    def stop_at_gen_3(p: Progress) -> None:
        seen.append(p)
        if p.generation == 3:
            raise KeyboardInterrupt

    res = run_search(space, profile, stop_at_gen_3)
    assert res.interrupted and res.generations == 3  # the third finished; its report was interrupted
    assert [p.phase for p in seen][:2] == ["baselines", "nsga2"]
    for base in res.baselines.values():
        if base is not None:
            assert res.best.iteration_ms <= base.iteration_ms


def test_time_budget_stops_and_says_so(tmp_path: Path) -> None:
    profile, space = _tiny(tmp_path, global_batch=16, max_microbatch=16, generations=10_000, time_budget_s=0.5)
    res = run_search(space, profile)
    assert res.budget_hit and res.generations < 10_000
    assert res.best.iteration_ms <= min(b.iteration_ms for b in res.baselines.values() if b is not None)


@pytest.mark.parametrize(
    "toml,match",
    [
        ("stages = 2\nglobal_batch = 4\nbogus = 1\n", "unknown key 'bogus'"),
        ("stages = 2\nglobal_batch = 4\n[microbatch]\nsize = 3\n", "unknown key microbatch.size"),
        ("stages = 0\nglobal_batch = 4\n", "stages = 0"),
        ("stages = 2\nglobal_batch = 4\nmemory_limit = '12 parsecs'\n", "memory_limit"),
        ("stages = 2\nglobal_batch = 4\n[schedule]\nfamily = 'zb'\n", "schedule.family"),
        ("stages = 2\nglobal_batch = 4\n[nope]\nx = 1\n", r"unknown table \[nope\]"),
        ("stages = 2\n", "global_batch"),
    ],
)
def test_bad_spaces_name_the_key(tmp_path: Path, toml: str, match: str) -> None:
    f = tmp_path / "s.toml"
    f.write_text('profile = "p.json"\n' + toml)
    with pytest.raises(SearchSpaceError, match=match):
        load_space(f)


def test_parse_bytes() -> None:
    assert parse_bytes("80GiB") == 80 * 2**30
    assert parse_bytes("16GB") == 16e9
    assert parse_bytes(1024) == 1024.0
