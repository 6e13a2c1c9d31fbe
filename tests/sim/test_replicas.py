"""docs/model.md section 9 beyond example 8: replicas whose links differ, worked by hand, for both simulators."""

from __future__ import annotations

import dataclasses

import pytest

from tests.contract import EXAMPLE8_CLUSTER, example8, example8_profile
from tests.sim.test_contract import SIMULATORS
from umsearch.core.cost import CostModel
from umsearch.core.plan import Plan
from umsearch.sim.reference import simulate


def _mixed() -> Plan:
    """Example 8 with nodes of three devices, pp_inner: replica 0 sits on devices 0-1 (one node, 0.502 ms
    messages), replica 1 on devices 2-3 (two nodes, 1.02 ms); rank 0's copies (devices 0, 2) share
    node 0, rank 1's (devices 1, 3) do not."""
    return dataclasses.replace(example8("pp_inner"), cluster=dataclasses.replace(EXAMPLE8_CLUSTER, gpus_per_node=3))


@pytest.mark.parametrize("sim", sorted(SIMULATORS))
def test_the_slowest_replica_sets_each_ready_time(sim: str) -> None:
    res = SIMULATORS[sim](_mixed(), CostModel(example8_profile()))
    # Replica 1 ends at 20.04 (example 8's dp_inner timeline), replica 0 at 19.004.
    assert res.compute_end_ms == pytest.approx(20.04, abs=1e-9)
    spans = [(s.stage, s.ready_ms, s.start_ms, s.end_ms) for s in res.allreduces]
    # Stage 0 on rank 0: ready at replica 1's 20.04, intra (3 ms); stage 1 on rank 1: ready at replica
    # 1's 15.02 (replica 0's last 1B1 ends at 14.502), inter (22 ms).
    assert spans == [(0, pytest.approx(20.04), pytest.approx(20.04), pytest.approx(23.04)),
                     (1, pytest.approx(15.02), pytest.approx(15.02), pytest.approx(37.02))]  # fmt: skip
    assert res.iteration_ms == pytest.approx(37.02, abs=1e-9)


def test_records_are_the_slowest_replica() -> None:
    res = simulate(_mixed(), CostModel(example8_profile()))
    assert res.replica == 1
    assert max(a.end_ms for a in res.records) == pytest.approx(20.04, abs=1e-9)


def test_one_rank_runs_its_all_reduces_one_at_a_time() -> None:
    """Two stages on one rank, D = 2, one device per node (inter, 22 ms): the second all-reduce to become
    ready waits for the first."""
    from tests.contract import explicit_plan

    plan = explicit_plan(2, [0, 0], [[2], [2]], ["0F0 1F0 1B0 0B0"], layers_per_stage=2)
    cluster = dataclasses.replace(EXAMPLE8_CLUSTER, gpus_per_node=1)
    plan = dataclasses.replace(plan, global_batch=4, data_parallel=2, cluster=cluster)
    for name, run in SIMULATORS.items():
        res = run(plan, CostModel(example8_profile()))
        # F = 2 each, B = 4 each: 1B0 ends at 8, 0B0 at 12. Stage 1's all-reduce 8-30, stage 0's 30-52.
        spans = [(s.stage, s.ready_ms, s.start_ms, s.end_ms) for s in res.allreduces]
        assert spans == [(0, 12.0, 30.0, 52.0), (1, 8.0, 8.0, 30.0)], name
        assert res.iteration_ms == 52.0 and res.compute_end_ms == 12.0, name


def test_a_split_stage_is_ready_for_its_all_reduce_when_its_last_w_ends() -> None:
    """The weight gradients are complete after a stage's last W, not its last I (ENDS_BACKWARD)."""
    from tests.contract import explicit_plan

    plan = explicit_plan(2, [0, 0], [[2], [2]], ["0F0 1F0 1I0 0I0 1W0 0W0"], layers_per_stage=2)
    cluster = dataclasses.replace(EXAMPLE8_CLUSTER, gpus_per_node=1)
    plan = dataclasses.replace(plan, global_batch=4, data_parallel=2, cluster=cluster)
    for name, run in SIMULATORS.items():
        res = run(plan, CostModel(example8_profile()))
        # F, I and W take 2 each: 1I0 ends at 6, 0I0 at 8, 1W0 at 10, 0W0 at 12; 22 ms all-reduces.
        spans = [(s.stage, s.ready_ms, s.start_ms, s.end_ms) for s in res.allreduces]
        assert spans == [(0, 12.0, 32.0, 54.0), (1, 10.0, 10.0, 32.0)], name
