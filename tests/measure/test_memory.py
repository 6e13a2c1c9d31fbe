"""Memory-bounded profiling: the planner as a pure function, and a small model under an injected cap."""

from __future__ import annotations

import pytest
import torch

from umsearch.core.profile import Link
from umsearch.measure.host_memory import keep_freed_memory
from umsearch.measure.memory import HEADROOM, Need, chain_bytes, plan_memory
from umsearch.measure.profiler import ProfileConfig, profile_model
from umsearch.nn.models import ModelSpec, build_model

SIZES = (1, 2, 4, 8, 16)
SMALL = Need(name="small", kept_per_sample=10.0, transient_per_sample=2.0, fixed=100.0)
BIG = Need(name="big", kept_per_sample=100.0, transient_per_sample=20.0, fixed=1000.0)


def test_a_burst_needs_its_graphs_the_backward_and_the_gradients() -> None:
    assert BIG.bytes(4, 8) == 8 * 4 * 100 + 4 * 20 + 1000


def test_everything_fits_with_the_usual_eight_graphs() -> None:
    plan = plan_memory([SMALL, BIG], free_bytes=1e9, sizes=SIZES)
    assert plan.in_flight == (8, 8) and plan.largest == (16, 16)
    assert plan.common_sizes(SIZES) == SIZES and plan.budget_bytes == pytest.approx(1e9 * HEADROOM)


def test_fewer_graphs_before_fewer_sizes() -> None:
    budget = BIG.bytes(16, 5)  # the big group fits its largest size with five graphs, not six
    plan = plan_memory([SMALL, BIG], free_bytes=budget, sizes=SIZES, headroom=1.0)
    assert plan.in_flight == (8, 5) and plan.largest == (16, 16)


def test_the_largest_size_that_fits_per_group_when_even_two_graphs_are_too_many() -> None:
    budget = BIG.bytes(4, 2)  # with two graphs the big group fits 4, not 8
    plan = plan_memory([SMALL, BIG], free_bytes=budget, sizes=SIZES, headroom=1.0)
    assert plan.in_flight[1] == 2 and plan.largest == (16, 4)
    assert plan.common_sizes(SIZES) == (1, 2, 4)
    assert plan.common_sizes(SIZES, [0]) == SIZES  # the small group alone would fit them all


def test_nothing_fits() -> None:
    plan = plan_memory([BIG], free_bytes=10.0, sizes=SIZES, headroom=1.0)
    assert plan.largest == (None,) and plan.common_sizes(SIZES) == ()


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError, match="min_in_flight"):
        plan_memory([SMALL], free_bytes=1e9, sizes=SIZES, min_in_flight=9)


def test_chain_estimate_extrapolates_the_widest_graph() -> None:
    # One size run: through the origin; two: the line through them (a fixed part stays fixed).
    assert chain_bytes(10, 3.0, [(1, 50.0)]) == 10 * 3.0 + 500.0
    assert chain_bytes(10, 3.0, [(1, 150.0), (2, 200.0)]) == 30.0 + 200.0 + 50.0 * 8


def _tiny_gpt() -> tuple[ModelSpec, object]:
    spec = ModelSpec(source="gpt", args={"layers": 2, "width": 32, "heads": 2, "seq": 32, "vocab": 256})
    return spec, build_model(spec)


def test_a_small_model_under_a_memory_cap_reports_the_largest_size_that_fits() -> None:
    torch.set_num_threads(1)
    spec, built = _tiny_gpt()
    config = ProfileConfig(sizes=(1, 2, 4, 8, 16, 32), repeats=1, calibration_rounds=1, memory_cap_bytes=2e6,
                           context_layers=1)  # fmt: skip
    prof = profile_model(built, spec, config, link=Link(latency_ms=0.0, bandwidth_gb_per_s=1.0))  # type: ignore[arg-type]
    memory = prof.extra["measurement"]["memory"]
    # Under 2 MB the blocks and the head stop at 4 (with the fewest graphs in flight), the embedding goes further.
    assert prof.microbatch_sizes == (1, 2, 4)
    fits = memory["largest_that_fits"]
    assert fits["block0..block1 (2 pooled)"] == 4 and fits["head"] == 4 and fits["embedding"] > 4
    assert memory["in_flight"]["block0..block1 (2 pooled)"] == 2 and memory["in_flight"]["embedding"] == 8
    assert memory["note"].startswith("sizes above 4 did not fit in memory: largest that fits: 4 for ")
    # Every burst's estimate stays within the budget.
    assert memory["budget_bytes"] < 2e6
    # The record says how the layers were timed: alone here.
    assert prof.extra["measurement"]["context_layers"] == 1
    assert "neighbours" not in prof.extra["measurement"]["method"]


def test_without_a_cap_every_size_is_measured_with_eight_graphs() -> None:
    spec, built = _tiny_gpt()
    config = ProfileConfig(sizes=(1, 2, 4), repeats=1, calibration_rounds=1)
    prof = profile_model(built, spec, config, link=Link(latency_ms=0.0, bandwidth_gb_per_s=1.0))  # type: ignore[arg-type]
    memory = prof.extra["measurement"]["memory"]
    assert prof.microbatch_sizes == (1, 2, 4) and memory["note"] is None
    assert set(memory["in_flight"].values()) == {8} and prof.extra["measurement"]["in_flight"] == 8
    assert prof.extra["measurement"]["context_layers"] == 4
    assert "each timed among its neighbours" in prof.extra["measurement"]["method"]
    # On CPU the record says how the allocator was set for the bursts (nothing outside glibc).
    assert prof.extra["measurement"]["host_allocator"] == keep_freed_memory()


def test_a_layer_timed_among_its_neighbours_needs_the_memory_of_its_whole_window() -> None:
    from umsearch.measure.profiler import burst_needs, context_window, run_chain
    from umsearch.measure.rounds import windows_holding

    spec, built = _tiny_gpt()
    chain = run_chain(built, (1, 2), torch.device("cpu"))  # type: ignore[arg-type]
    groups = [[0], [1, 2], [3]]
    alone = burst_needs(built, chain, groups, [], 1)  # type: ignore[arg-type]
    among = burst_needs(built, chain, groups, [], 3)  # type: ignore[arg-type]
    # Each window layer is its own graph: its stash and its output stay alive; the fullest window that
    # holds a member counts (the rounds may time a member in any of them).
    for g, need in zip(groups, among, strict=True):
        windows = [w for i in g for w in windows_holding(i, 4, 3)]
        assert set(windows) >= {context_window(i, 4, 3) for i in g}
        assert need.kept_per_sample == max(sum(chain.stash_bytes[lo:hi]) + sum(chain.out_bytes[lo:hi])
                                           for lo, hi in windows)  # fmt: skip
    assert all(a.kept_per_sample < b.kept_per_sample for a, b in zip(alone, among, strict=True))
