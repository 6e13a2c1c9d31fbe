"""docs/model.md section 9 (version 2.3): gradient buckets. Section 8.10's worked values for both simulators,
a cap large enough (or none) gives version 2.2's whole-stage all-reduce, and the bucket rule itself."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.contract import EXAMPLE8_CLUSTER, example8, example8_profile, explicit_plan
from tests.sim.test_contract import SIMULATORS
from tests.strategies import dp_plans, profiles
from umsearch.core.cluster import MIB, bucket_cap_bytes, bucket_firsts
from umsearch.core.cost import CostModel
from umsearch.core.plan import Plan
from umsearch.errors import PlanError
from umsearch.sim.population import encode, evaluate, pack
from umsearch.sim.reference import bucket_spans, simulate

COST = CostModel(example8_profile())


def _pure_dp(actions: str = "0F0 0B0", bucket_mib: float | None = 1.0) -> Plan:
    """Section 8.10: one rank holding all four layers as one stage, list [2], B = 4 on D = 2 replicas of one
    node (intra, 0.5 ms and 1 GB/s): pure data parallelism."""
    plan = explicit_plan(2, [0], [[2]], [actions], layers_per_stage=4)
    return dataclasses.replace(plan, global_batch=4, data_parallel=2, cluster=EXAMPLE8_CLUSTER,
                               bucket_mib=bucket_mib)  # fmt: skip


def _spans(plan: Plan) -> list[tuple[int, tuple[int, int], float, float, float]]:
    return [(b.stage, b.layers, b.ready_ms, b.start_ms, b.end_ms) for b in bucket_spans(plan, COST)]


@pytest.mark.parametrize("sim", sorted(SIMULATORS))
@pytest.mark.parametrize(("mib", "iteration"), [(None, 17.0), (25.0, 17.0), (2.0, 15.0), (1.0, 14.0)])
def test_8_10_pure_data_parallelism(sim: str, mib: float | None, iteration: float) -> None:
    """``0B0`` runs 4-12 (two samples, four layers of 2 ms). Whole: 4 MB in 5 ms, 12-17. 2 MiB: buckets of
    layers 2-3 (ready at 12 - 8 * 4/8 = 8) and 0-1 (ready at 12), 3 ms each: 8-11, 12-15. 1 MiB: one layer
    each, ready at 6, 8, 10 and 12, 2 ms each, back to back: 14."""
    res = SIMULATORS[sim](_pure_dp(bucket_mib=mib), COST)
    assert res.compute_end_ms == 12.0
    assert res.iteration_ms == pytest.approx(iteration, abs=1e-9)


def test_8_10_bucket_times() -> None:
    assert _spans(_pure_dp(bucket_mib=2.0)) == [(0, (2, 4), 8.0, 8.0, 11.0), (0, (0, 2), 12.0, 12.0, 15.0)]
    assert _spans(_pure_dp(bucket_mib=1.0)) == [(0, (3, 4), 6.0, 6.0, 8.0), (0, (2, 3), 8.0, 8.0, 10.0),
                                                (0, (1, 2), 10.0, 10.0, 12.0), (0, (0, 1), 12.0, 12.0, 14.0)]  # fmt: skip


@pytest.mark.parametrize("sim", sorted(SIMULATORS))
def test_8_10_example_8_with_one_mib_buckets(sim: str) -> None:
    """dp_inner: stage 1's ``1B1`` runs 11.02-15.02, its buckets (layers 3, then 2; 2 ms each, intra) 13.02-15.02
    and 15.02-17.02; stage 0's ``0B1`` 16.04-20.04, buckets 18.04-20.04 and 20.04-22.04: 22.04 ms (23.04
    whole). pp_inner: inter, 12 ms a bucket: stage 1 12.502-24.502-36.502, stage 0 17.004-29.004-41.004, the
    same 41.004 ms as whole stages (one more latency term per stage eats the earlier start)."""
    inner = SIMULATORS[sim](dataclasses.replace(example8("dp_inner"), bucket_mib=1.0), COST)
    assert inner.iteration_ms == pytest.approx(22.04, abs=1e-9)
    got = [(s.stage, s.ready_ms, s.start_ms, s.end_ms) for s in inner.allreduces]
    assert got == [(0, pytest.approx(18.04), pytest.approx(18.04), pytest.approx(22.04)),
                   (1, pytest.approx(13.02), pytest.approx(13.02), pytest.approx(17.02))]  # fmt: skip
    outer = SIMULATORS[sim](dataclasses.replace(example8("pp_inner"), bucket_mib=1.0), COST)
    assert outer.iteration_ms == pytest.approx(41.004, abs=1e-9)
    got = [(s.stage, s.ready_ms, s.start_ms, s.end_ms) for s in outer.allreduces]
    assert got == [(0, pytest.approx(17.004), pytest.approx(17.004), pytest.approx(41.004)),
                   (1, pytest.approx(12.502), pytest.approx(12.502), pytest.approx(36.502))]  # fmt: skip


def test_8_10_bucket_times_of_example_8() -> None:
    spans = _spans(dataclasses.replace(example8("dp_inner"), bucket_mib=1.0))
    want = [(0, (1, 2), 18.04, 18.04, 20.04), (0, (0, 1), 20.04, 20.04, 22.04),
            (1, (3, 4), 13.02, 13.02, 15.02), (1, (2, 3), 15.02, 15.02, 17.02)]  # fmt: skip
    for (j, lay, *times), (wj, wlay, *wtimes) in zip(spans, want, strict=True):
        assert (j, lay) == (wj, wlay) and times == pytest.approx(wtimes, abs=1e-9)


@pytest.mark.parametrize("sim", sorted(SIMULATORS))
def test_latency_counts_per_bucket_and_buckets_of_one_rank_run_in_ready_order(sim: str) -> None:
    """Section 9's two-stage rank (``0F0 1F0 1B0 0B0``, inter, one device per node) with 1 MiB buckets of 12 ms
    (22 ms a stage whole): stage 1's buckets ready at 6 and 8, stage 0's at 10 and 12, back to back from 6:
    54 ms, later than whole stages' 52 (four latency terms of 2 ms instead of two)."""
    plan = explicit_plan(2, [0, 0], [[2], [2]], ["0F0 1F0 1B0 0B0"], layers_per_stage=2)
    cluster = dataclasses.replace(EXAMPLE8_CLUSTER, gpus_per_node=1)
    plan = dataclasses.replace(plan, global_batch=4, data_parallel=2, cluster=cluster, bucket_mib=1.0)
    assert SIMULATORS[sim](plan, COST).iteration_ms == 54.0
    assert _spans(plan) == [(0, (1, 2), 10.0, 30.0, 42.0), (0, (0, 1), 12.0, 42.0, 54.0),
                            (1, (3, 4), 6.0, 6.0, 18.0), (1, (2, 3), 8.0, 18.0, 30.0)]  # fmt: skip


def test_a_split_stage_shares_its_last_w_by_the_weight_times() -> None:
    """``0F0 0I0 0W0``: ``0W0`` runs 8-12 (four layers of 1 ms): 1 MiB buckets ready at 9, 10, 11 and 12,
    2 ms each: 9-11, 11-13, 13-15, 15-17."""
    plan = _pure_dp("0F0 0I0 0W0")
    assert [(b.ready_ms, b.start_ms, b.end_ms) for b in bucket_spans(plan, COST)] == [
        (9.0, 9.0, 11.0), (10.0, 11.0, 13.0), (11.0, 13.0, 15.0), (12.0, 15.0, 17.0)]  # fmt: skip
    for sim in SIMULATORS.values():
        assert sim(plan, COST).iteration_ms == 17.0


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_a_cap_above_every_stage_is_version_2_2(data: st.DataObject) -> None:
    """No cap (2.2) and a cap no stage reaches time every plan alike, in both simulators."""
    profile = data.draw(profiles(split=True))
    plan = data.draw(dp_plans(profile.num_layers))
    cost = CostModel(profile)
    whole, capped = dataclasses.replace(plan, bucket_mib=None), dataclasses.replace(plan, bucket_mib=1e9)
    a, b = simulate(whole, cost), simulate(capped, cost)
    assert a.iteration_ms == b.iteration_ms and a.allreduces == b.allreduces
    fast = evaluate(pack([encode(whole), encode(capped)]), cost.tables(plan.global_batch))
    assert fast.iteration_ms[0] == fast.iteration_ms[1]


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.floats(0, 1e7), min_size=1, max_size=12), lo_hi=st.data(),
       mib=st.none() | st.floats(1 / 64, 16))  # fmt: skip
def test_buckets_cover_the_stage_top_down_within_the_cap(sizes: list[float], lo_hi: st.DataObject,
                                                         mib: float | None) -> None:  # fmt: skip
    """Buckets tile ``[lo, hi)`` from the top; each holds at most the cap, or one layer; two neighbours
    together exceed it (the greedy fill)."""
    lo = lo_hi.draw(st.integers(0, len(sizes) - 1))
    hi = lo_hi.draw(st.integers(lo + 1, len(sizes)))
    prefix = np.concatenate([[0.0], np.cumsum(sizes)])
    out = np.empty(hi - lo, dtype=np.int64)
    m = bucket_firsts(prefix, lo, hi, bucket_cap_bytes(mib), out)
    firsts = out[:m].tolist()
    assert firsts[-1] == lo and all(a > b for a, b in zip(firsts, firsts[1:], strict=False))
    cap = np.inf if mib is None else mib * MIB
    tops = [hi, *firsts[:-1]]
    for a, top in zip(firsts, tops, strict=True):
        assert prefix[top] - prefix[a] <= cap or top - a == 1
    for k in range(1, m):  # the bucket below could not take the next layer down
        assert prefix[tops[k - 1]] - prefix[tops[k] - 1] > cap


def test_a_deadlocking_plan_has_no_buckets_to_time() -> None:
    from tests.contract import EXAMPLE2, unit_profile

    plan = dataclasses.replace(EXAMPLE2, global_batch=2 * EXAMPLE2.global_batch, data_parallel=2)
    cost = CostModel(unit_profile(2))
    assert simulate(plan, cost).deadlock
    with pytest.raises(PlanError, match="deadlocks"):
        bucket_spans(plan, cost)
