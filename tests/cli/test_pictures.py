"""Pictures: a Gantt chart stays readable at 16 ranks x 64 microbatches; traces are per rank."""

from __future__ import annotations

import struct
from pathlib import Path

from tests.contract import example8, example8_profile
from tests.strategies import uniform_profile
from umsearch.cli.pictures import (
    ALLREDUCE_TID,
    chrome_trace_events,
    write_gantt,
    write_gantts,
    write_pareto,
)
from umsearch.core.cost import CostModel
from umsearch.core.plan import equal_split, placed_plan
from umsearch.core.schedules import PEER_SCHEDULES
from umsearch.sim.reference import simulate


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def _records(name: str, ranks: int, v: int, m: int):  # type: ignore[no-untyped-def]
    peer = PEER_SCHEDULES[name]
    S = ranks * v
    plan = placed_plan(list(range(S + 1)), peer.stage_ranks(ranks, v), m, [equal_split(m, m)] * S,
                       peer.generate(ranks, v, m))  # fmt: skip
    return plan, simulate(plan, CostModel(uniform_profile(layers=S))).records


def test_a_gantt_of_16_ranks_and_64_microbatches_stays_a_readable_size(tmp_path: Path) -> None:
    plan, records = _records("InterleavedZeroBubble", 16, 2, 64)
    assert len(records) == 16 * 2 * 64 * 3  # F, I and W of every microbatch of every stage
    w, h = _png_size(write_gantt(records, plan.ranks, tmp_path / "g.png", title="16 x 64"))
    # At most 22 inches wide at 120 dpi (plus the legend), and about 0.6 inch per rank.
    assert 1500 < w < 3200 and 900 < h < 1600, (w, h)


def test_timelines_on_one_axis_and_traces_per_rank(tmp_path: Path) -> None:
    a, ra = _records("1F1B", 2, 1, 4)
    b, rb = _records("ZBVZeroBubble", 2, 2, 4)
    w, h = _png_size(write_gantts([("1F1B", ra, a.ranks), ("ZBV", rb, b.ranks)], tmp_path / "two.png"))
    assert h > w / 4
    events = chrome_trace_events(rb)
    threads = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert threads == {0: "rank 0", 1: "rank 1"}
    assert {e["name"].split()[0] for e in events if e["ph"] == "X"} >= {"0F0", "3I0", "3W0"}


def test_pareto_scales_to_the_plans_not_a_far_limit(tmp_path: Path) -> None:
    gib = 2**30
    path = write_pareto([(10.0, 1.0 * gib), (12.0, 0.5 * gib)], {"1F1B": (13.0, 0.6 * gib)}, tmp_path / "p.png",
                        memory_limit=80.0 * gib, chosen=(10.0, 1.0 * gib))  # fmt: skip
    assert _png_size(path)[0] > 0


def test_a_data_parallel_trace_has_each_ranks_allreduces_in_a_lane_under_it() -> None:
    res = simulate(example8(), CostModel(example8_profile()))
    assert res.allreduces
    events = chrome_trace_events(res.records, allreduces=res.allreduces)
    lanes = [e for e in events if e["ph"] == "X" and e["cat"] == "all-reduce"]
    assert sorted((e["tid"] - ALLREDUCE_TID, e["args"]["stage"]) for e in lanes) == \
        sorted((s.rank, s.stage) for s in res.allreduces)  # fmt: skip
    for e, s in zip(sorted(lanes, key=lambda e: e["args"]["stage"]), sorted(res.allreduces, key=lambda s: s.stage),
                    strict=True):  # fmt: skip
        assert e["ts"] == s.start_ms * 1e3 and e["dur"] == (s.end_ms - s.start_ms) * 1e3
    order = [e["tid"] for e in sorted((e for e in events if e["name"] == "thread_sort_index"),
                                      key=lambda e: e["args"]["sort_index"])]  # fmt: skip
    ranks = sorted({s.rank for s in res.allreduces})
    assert order == [t for r in ranks for t in (r, ALLREDUCE_TID + r)]
