"""Search over a cluster: the [cluster] table, factorizations and pruning, and the search's promises."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from umsearch.core.cluster import Cluster
from umsearch.core.loader import load_plan_file
from umsearch.core.plan_io import PlanDocument, save_document
from umsearch.core.profile import Link, load_profile
from umsearch.errors import SearchSpaceError
from umsearch.search.driver import run_search
from umsearch.search.factorize import (
    Factorization,
    Memory,
    divisors,
    factorizations,
    representative_link,
    smallest_stage_bytes,
)
from umsearch.search.space import build_space, cluster_values, load_space

PROFILE = Path(__file__).resolve().parents[2] / "search_spaces" / "profiles" / "gpt_cpu.json"
CLUSTER = "[cluster]\nnodes = 2\ngpus_per_node = 2\nintra = 'nvlink4'\ninter = {latency_ms = 0.02, bandwidth_gb_per_s = 25}\n"
NV, IB = Link(latency_ms=0.005, bandwidth_gb_per_s=300.0), Link(latency_ms=0.02, bandwidth_gb_per_s=25.0)


def _space(tmp_path: Path, body: str, **flags: object):  # type: ignore[no-untyped-def]
    f = tmp_path / "s.toml"
    f.write_text(f'profile = "{PROFILE}"\nglobal_batch = 8\n' + body)
    return load_space(f, dict(flags))


def test_the_cluster_table_parses_links_and_presets(tmp_path: Path) -> None:
    space = _space(tmp_path, CLUSTER)
    assert space.cluster is not None and space.ranks == 0  # no ranks: the search chooses
    assert (space.cluster.nodes, space.cluster.gpus_per_node, space.cluster.devices) == (2, 2, 4)
    assert space.cluster.intra == Link(latency_ms=0.005, bandwidth_gb_per_s=450.0)  # nvlink4
    assert space.cluster.inter == IB
    assert space.to_json()["cluster"]["inter"] == {"latency_ms": 0.02, "bandwidth_gb_per_s": 25.0}
    assert _space(tmp_path, "ranks = 2\n").cluster is None
    assert _space(tmp_path, CLUSTER, intra="0.001,100").cluster.intra == Link(latency_ms=0.001, bandwidth_gb_per_s=100)


def test_a_cluster_file_is_the_same_table(tmp_path: Path) -> None:
    c = tmp_path / "c.toml"
    c.write_text(CLUSTER)
    space = _space(tmp_path, "", **cluster_values(c))
    assert space.cluster == _space(tmp_path, CLUSTER).cluster
    c.write_text("ranks = 2\n" + CLUSTER)
    with pytest.raises(SearchSpaceError, match="one \\[cluster\\] table"):
        cluster_values(c)


@pytest.mark.parametrize(
    "body,match",
    [
        ("[cluster]\nnodes = 2\ngpus_per_node = 2\nintra = 'nvlink4'\n", "\\[cluster\\] needs 'inter'"),
        (CLUSTER.replace("'nvlink4'", "'nvlink9'"), "cluster.intra = 'nvlink9' is no link"),
        (CLUSTER.replace("latency_ms = 0.02", "latency_ms = -1"), "cluster.inter.latency_ms = -1"),
        (CLUSTER.replace("bandwidth_gb_per_s = 25", "bandwidth_gb_per_s = 0"), "cluster.inter.bandwidth_gb_per_s"),
        (CLUSTER.replace("latency_ms = 0.02,", "latency_ms = 0.02, jitter = 1,"), "exactly latency_ms and bandwidth"),
        (CLUSTER.replace("nodes = 2", "nodes = 0"), "cluster.nodes = 0"),
        (CLUSTER.replace("nodes = 2", "nodes = 2\nzero = 1"), "unknown key cluster.zero"),
        ("ranks = 3\n" + CLUSTER, "ranks = 3 does not divide the cluster's 4 devices"),
    ],
)
def test_bad_cluster_tables_name_the_key_in_one_line(tmp_path: Path, body: str, match: str) -> None:
    with pytest.raises(SearchSpaceError, match=match) as exc:
        _space(tmp_path, body)
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize("bad,match", [
    ("bandwidth_gb_per_s = 1e-300", "inter.bandwidth_gb_per_s = 1e-300 GB/s is out of range"),
    ("bandwidth_gb_per_s = 1e300", "inter.bandwidth_gb_per_s = 1e300 GB/s is out of range"),
    ("bandwidth_gb_per_s = 0", "inter.bandwidth_gb_per_s must be positive, got 0"),
])  # fmt: skip
def test_link_bandwidths_have_physical_bounds(tmp_path: Path, bad: str, match: str) -> None:
    """A space's [cluster] link, a --cluster file's and an --inter flag all give the bad value, the
    bounds and the fix, and name where the value came from."""
    bounds = "a link's bandwidth is from 0.001 to 1e9 GB/s; state bandwidth in GB/s"
    body = CLUSTER.replace("bandwidth_gb_per_s = 25", bad)
    with pytest.raises(SearchSpaceError, match=match) as exc:
        _space(tmp_path, body)
    assert str(exc.value).startswith(f"{tmp_path / 's.toml'}: ") and bounds in str(exc.value)
    c = tmp_path / "c.toml"
    c.write_text(body)
    with pytest.raises(SearchSpaceError, match=match) as exc:
        _space(tmp_path, "", **cluster_values(c))
    assert str(exc.value).startswith(f"{c}: ") and bounds in str(exc.value)
    flag = "0.02," + bad.split(" = ")[1]
    with pytest.raises(SearchSpaceError, match=match) as exc:
        _space(tmp_path, CLUSTER, inter=flag)
    assert str(exc.value).startswith("flag --inter: ") and bounds in str(exc.value)


def test_link_latencies_have_physical_bounds(tmp_path: Path) -> None:
    with pytest.raises(SearchSpaceError, match="inter.latency_ms = 100000 ms is out of range: a link's latency is "
                                               "from 0 to 10000 ms"):  # fmt: skip
        _space(tmp_path, CLUSTER.replace("latency_ms = 0.02", "latency_ms = 1e5"))
    assert _space(tmp_path, CLUSTER, inter="10000,0.001").cluster.inter == Link(latency_ms=1e4,
                                                                                bandwidth_gb_per_s=1e-3)  # fmt: skip


@pytest.mark.parametrize("change,match", [
    (("nodes = 2", "nodes = 0"), "cluster.nodes = 0: must be an integer"),
    (("'nvlink4'", "'nvlink9'"), "cluster.intra = 'nvlink9' is no link"),
    (("latency_ms = 0.02", "latency_ms = -1"), "cluster.inter.latency_ms = -1 must be non-negative"),
    (("inter = {latency_ms = 0.02, bandwidth_gb_per_s = 25}\n", ""), r"\[cluster\] needs 'inter'"),
    (("nodes = 2", "nodes = 1048576"), "1048576 x 2 = 2097152 devices; plan for at most"),
])  # fmt: skip
def test_an_error_in_a_cluster_file_names_the_cluster_file(tmp_path: Path, change: tuple[str, str],
                                                           match: str) -> None:  # fmt: skip
    c = tmp_path / "c.toml"
    c.write_text(CLUSTER.replace(*change))
    with pytest.raises(SearchSpaceError, match=match) as exc:
        _space(tmp_path, "", **cluster_values(c))  # the space TOML s.toml, the cluster file c.toml
    assert str(exc.value).startswith(f"{c}: ") and "s.toml" not in str(exc.value)
    with pytest.raises(SearchSpaceError, match=match) as exc:  # no space TOML: flags only
        build_space({"profile": str(PROFILE), "global_batch": 8, **cluster_values(c)})
    assert str(exc.value).startswith(f"{c}: ")


def test_flags_override_a_cluster_file_and_errors_say_which(tmp_path: Path) -> None:
    c = tmp_path / "c.toml"
    c.write_text(CLUSTER.replace("'nvlink4'", "'nvlink9'"))
    space = _space(tmp_path, "", **{**cluster_values(c), "intra": "nvlink4"})  # the flag wins over the file
    assert space.cluster is not None and space.cluster.intra.bandwidth_gb_per_s == 450.0
    with pytest.raises(SearchSpaceError, match="^flag --nodes: cluster.nodes = 0") as exc:
        _space(tmp_path, "", **{**cluster_values(c), "nodes": 0})
    assert "s.toml" not in str(exc.value) and "c.toml" not in str(exc.value)
    c.write_text(CLUSTER)
    with pytest.raises(SearchSpaceError, match=r"ranks = 3 does not divide the cluster's 4 devices \(nodes x "
                                               f"gpus_per_node from {c}\\)"):  # fmt: skip
        _space(tmp_path, "ranks = 3\n", **cluster_values(c))


MEM = Memory(param_bytes=(10.0, 100.0, 100.0, 10.0), stash_bytes=(1.0, 5.0, 5.0, 1.0), state_factor=4.0, limit=1e9)
TWO_BY_FOUR = Cluster(gpus_per_node=4, intra=NV, inter=IB)


def test_divisors() -> None:
    assert divisors(16) == [1, 2, 4, 8, 16] and divisors(1) == [1] and divisors(12) == [1, 2, 3, 4, 6, 12]


def test_factorizations_keep_both_layouts_where_they_differ_and_prune_with_reasons() -> None:
    keep, pruned = factorizations(8, 4, 4, TWO_BY_FOUR, MEM, max_ranks=256)
    assert [f.label for f in keep] == ["R=2 x D=4 dp_inner", "R=2 x D=4 pp_inner", "R=4 x D=2 dp_inner",
                                       "R=4 x D=2 pp_inner"]  # fmt: skip
    why = {p.factorization.label: p.reason for p in pruned}
    assert why == {"R=1 x D=8 dp_inner": "D = 8 replicas do not divide B = 4",
                   "R=8 x D=1 dp_inner": "R = 8 ranks but the profile has 4 layers"}  # fmt: skip
    assert [f.ranks for f in factorizations(8, 8, 4, TWO_BY_FOUR, MEM, max_ranks=256, ranks=2)[0]] == [2, 2]


def test_memory_pruning_uses_the_smallest_possible_stage_and_zero1() -> None:
    # R = 2: the fullest rank holds at least half the parameters (110); the rank holding layer 1 holds its
    # 100 and one sample of its stash (5), which may be another rank: the larger of the two.
    assert smallest_stage_bytes(MEM, 2, 4, zero1=False) == 4 * 110
    assert smallest_stage_bytes(MEM, 2, 4, zero1=True) == (2 + 2 / 4) * 110
    assert smallest_stage_bytes(MEM, 4, 2, zero1=False) == 4 * 100 + 5
    tight = replace(MEM, limit=310.0)  # R = 2 fits only with ZeRO-1 (440 / 275), R = 4 likewise (405 / 305)
    keep, pruned = factorizations(8, 8, 4, TWO_BY_FOUR, tight, max_ranks=256)
    assert {f.label for f in keep} == {"R=2 x D=4 dp_inner +zero1", "R=2 x D=4 pp_inner +zero1",
                                       "R=4 x D=2 dp_inner +zero1", "R=4 x D=2 pp_inner +zero1"}  # fmt: skip
    assert {p.factorization.ranks: p.reason.split(" > ")[0] for p in pruned} == {
        1: "the smallest possible stage needs 4.95e-07 GB", 8: "R = 8 ranks but the profile has 4 layers"}
    roomy = replace(MEM, limit=1e12)
    assert not any(f.zero1 for f in factorizations(8, 8, 4, TWO_BY_FOUR, roomy, max_ranks=256)[0])


def test_the_generator_times_a_replica_on_the_link_most_of_its_neighbours_use() -> None:
    # dp_inner on 4 GPUs per node: replica 0 is devices 0, 2, 4, 6 (nodes 0, 0, 1, 1): mostly intra.
    assert representative_link(TWO_BY_FOUR, Factorization(ranks=4, replicas=2, layout="dp_inner")) == NV
    two = replace(TWO_BY_FOUR, gpus_per_node=2)  # nodes 0, 1, 2, 3: inter only
    assert representative_link(two, Factorization(ranks=4, replicas=2, layout="dp_inner")) == IB
    assert representative_link(TWO_BY_FOUR, Factorization(ranks=4, replicas=2, layout="pp_inner")) == NV
    assert representative_link(TWO_BY_FOUR, Factorization(ranks=2, replicas=4, layout="dp_inner")) == IB


SMALL = "[search]\npopulation = 8\ngenerations = 2\ntime_budget_s = 600\n[schedule]\npeers = ['1F1B', 'Interleaved1F1B']\n"


def test_the_search_takes_the_fastest_screened_and_every_one_close_to_them() -> None:
    from umsearch.search.over_cluster import SEARCH_MARGIN, SEARCHED, promising

    assert (SEARCHED, SEARCH_MARGIN) == (3, 0.15)
    # The 24-block H200 GPT at 16 GiB per GPU, as screened: R = 1 (474.1 ms) is fourth, 11.5% behind.
    screened = [474.1, 437.2, 425.2, 478.2, 468.7, 564.6, 566.0, 683.3]
    binds = [True] * 7 + [False]
    assert promising(screened, binds) == [2, 1, 4, 0, 3]
    assert promising(screened, [False] * 8) == [2, 1, 4]  # memory free: the screen is a fair guide
    assert promising(screened, [i != 0 for i in range(8)]) == [2, 1, 4, 3]
    assert promising([10.0, 30.0, 20.0, 40.0], [True] * 4) == [0, 2, 1]  # three at least, fastest first
    assert promising([float("inf")] * 5, [True] * 5) == [0, 1, 2]  # nothing fitted the screen: no margin
    assert promising([], []) == []


def test_the_cluster_search_beats_its_peers_is_deterministic_and_round_trips(tmp_path: Path) -> None:
    space = _space(tmp_path, SMALL + CLUSTER)
    profile = load_profile(space.profile)
    a, b = run_search(space, profile), run_search(space, profile)
    assert not a.budget_hit
    assert a.best.plan == b.best.plan and a.best.iteration_ms == b.best.iteration_ms  # same seed, same plan
    peers = [p for n, p in a.baselines.items() if p is not None and n != "local greedy"]
    assert peers and a.best.iteration_ms <= min(p.iteration_ms for p in peers)
    plan = a.best.plan
    assert plan.ranks * plan.data_parallel == 4 and plan.cluster == space.cluster.cluster
    assert {o.factorization.ranks for o in a.factorizations} | {p.factorization.ranks for p in a.pruned} == {1, 2, 4}
    save_document(PlanDocument(plan=plan, predicted={"iteration_ms": a.best.iteration_ms,
                                                     "peak_memory_bytes": list(a.best.peak_memory_bytes)}),
                  tmp_path / "plan.json")  # fmt: skip
    back = load_plan_file(tmp_path / "plan.json").plan
    assert (back.data_parallel, back.cluster, back.layout, back.zero1) == (plan.data_parallel, plan.cluster,
                                                                           plan.layout, plan.zero1)  # fmt: skip
    assert back == plan


@pytest.mark.parametrize("limit,zero1", [("26MB", True), ("1GB", False)])
def test_zero1_only_where_memory_needs_it(tmp_path: Path, limit: str, zero1: bool) -> None:
    """gpt_cpu on R = 2 x D = 2: a rank holds at least 5.8 MB of parameters, 23.3 MB of state without
    ZeRO-1 (17.5 MB with), plus one sample's stash of its layers."""
    from umsearch.core.cost import CostModel
    from umsearch.sim.reference import simulate

    space = _space(tmp_path, f"ranks = 2\nmemory_limit = '{limit}'\n" + SMALL + CLUSTER)
    res = run_search(space, load_profile(space.profile))
    assert res.best.plan.zero1 is zero1 and res.best.max_memory <= space.memory_limit
    cost = CostModel(load_profile(space.profile), state_factor=space.state_factor)
    for s in [*res.pareto, *(b for b in res.baselines.values() if b is not None)]:
        if s.plan.zero1:  # kept only where the plan does not fit without it
            peaks = simulate(replace(s.plan, zero1=False), cost).peak_memory_bytes
            assert peaks is not None and max(peaks) > space.memory_limit


@pytest.mark.slow
def test_where_memory_binds_the_search_beats_every_torch_schedule_that_fits() -> None:
    """The 24-block H200 GPT on 2 x 8 GPUs at 16 GiB each (docs/clusters.md's memory-bound table): the best
    torch schedule that fits is Interleaved1F1B on R = 2 (425.16 ms); the plan is a searched R = 1 one, which
    the screen alone ranks fourth."""
    from umsearch.core.bundled import data_dir

    space = load_space(data_dir() / "gpt24_h200_2x8.toml", {"time_budget_s": 1800})
    space = replace(space, memory_limit=16 * 2**30)
    res = run_search(space, load_profile(space.profile))
    assert not res.budget_hit and res.best.max_memory <= space.memory_limit
    peers = [p for n, p in res.baselines.items() if p is not None and n != "local greedy"]
    assert any(o.factorization.ranks == 1 and o.searched for o in res.factorizations)
    assert res.best.name == "umsearch" and min(p.iteration_ms for p in peers) / res.best.iteration_ms > 1.02
