"""Data-parallel plans (docs/model.md section 9) on the runtime: R x D processes, every replica on its own
samples, each stage's gradients all-reduced across its copies once its last ``B``/``W`` has ended;
after one iteration every parameter's gradient (on every replica) equals the single-process
full-batch gradient. Also: where the processes sit, the printed multi-node command."""

from __future__ import annotations

import functools
import shlex
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

from tests.contract import EXAMPLE4, EXAMPLE8_CLUSTER, example8
from tests.runtime.helpers import placed, rank_modules, tiny_model
from tests.runtime.test_command import MLP, two_rank_plan
from tests.runtime.test_distributed import CFG, PLANS, _on_layers, many_plans, reference
from tests.runtime.test_distributed import tiny_model as built_tiny_model
from umsearch.cli.run import run_command
from umsearch.core.plan import Plan
from umsearch.core.plan_io import save_plan
from umsearch.core.plan_rules import validate_plan
from umsearch.errors import RuntimeExecutionError
from umsearch.runtime.executor import StageExecutor
from umsearch.runtime.gradsync import GradSync
from umsearch.runtime.launch import launch
from umsearch.runtime.placement import (
    Seat,
    check_world,
    replica_worlds,
    stage_copies,
)
from umsearch.runtime.run_plan import merge


def replicated(plan: Plan, replicas: int, layout: str) -> Plan:
    """``plan`` (its lists summing to one replica's batch) as ``replicas`` replicas under ``layout``."""
    return validate_plan(replace(plan, global_batch=plan.global_batch * replicas, data_parallel=replicas,
                                 layout=layout))  # fmt: skip


# ---------------------------------------------------------------------------
# Where the processes sit
# ---------------------------------------------------------------------------


def test_world_ranks_follow_the_layout() -> None:
    inner = example8("dp_inner")  # R = 2, D = 2: rank r of replica d is device r * D + d
    assert replica_worlds(inner) == ((0, 2), (1, 3))
    assert stage_copies(inner) == ((0, 1), (2, 3))
    outer = example8("pp_inner")  # device d * R + r
    assert replica_worlds(outer) == ((0, 1), (2, 3))
    assert stage_copies(outer) == ((0, 2), (1, 3))
    assert Seat.of(inner, 2) == Seat(replica=0, rank=1)
    assert Seat.of(outer, 2) == Seat(replica=1, rank=0)
    assert Seat.of(outer, 3).samples(outer) == (4, 4)  # replica 1: samples [4, 8) of B = 8
    with pytest.raises(RuntimeExecutionError, match="process 4 is not one of the plan's 4"):
        Seat.of(inner, 4)


def test_the_world_must_be_ranks_times_replicas() -> None:
    check_world(example8(), 4)
    with pytest.raises(RuntimeExecutionError, match=r"2 rank\(s\) x 2 replicas = 4 processes but torchrun "
                                                    r"started 2 process\(es\).*nproc-per-node = 4\)"):  # fmt: skip
        check_world(example8(), 2)


# ---------------------------------------------------------------------------
# The executor starts a stage's all-reduce right after the stage's last B or W
# ---------------------------------------------------------------------------


class _Recorder(GradSync):
    """Records, at each ``start``, the stage and a copy of its gradients; reduces nothing."""

    def __init__(self) -> None:
        super().__init__(placement=Seat(replica=0, rank=0), group=None, replicas=1)
        self.started: list[tuple[int, list[torch.Tensor]]] = []
        self.finished = 0

    def start(self, stage: int, params: Any) -> None:
        assert self.finished == 0
        self.started.append((stage, [p.grad.clone() for p in params]))

    def finish(self) -> None:
        self.finished += 1


def test_each_stage_is_handed_over_complete_once_its_last_backward_has_run() -> None:
    # Stage 0's last gradient action is 0B1 (before 1W1), stage 1's is its W of microbatch 1.
    plan = placed(4, [0, 1, 2], [0, 0], [[2, 2], [2, 2]], ["0F0 1F0 0F1 1F1 1I0 0B0 1I1 1W0 0B1 1W1"])
    model = tiny_model(2)
    modules = rank_modules(plan, model, 0)
    sync = _Recorder()
    ex = StageExecutor(plan, 0, modules, model.loss, grad_sync=sync)
    x, y = model.make_batch(4, torch.Generator().manual_seed(0))
    ex.run_iteration(x, y)
    assert [j for j, _ in sync.started] == [0, 1] and sync.finished == 1
    for (j, grads), module in zip(sync.started, modules, strict=True):
        for g, p in zip(grads, module.parameters(), strict=True):
            assert p.grad is not None and torch.equal(g, p.grad), f"stage {j} changed after its all-reduce began"


def test_a_data_parallel_plan_needs_a_grad_sync() -> None:
    plan = example8()
    model = tiny_model(4)
    with pytest.raises(RuntimeExecutionError, match="2 data-parallel replicas; give the executor a grad_sync"):
        StageExecutor(plan, 0, rank_modules(plan, model, 0), model.loss)


# ---------------------------------------------------------------------------
# Four processes: D = 2 replicas x R = 2 ranks, gradients equal single-process training
# ---------------------------------------------------------------------------

DP_PLANS = {
    f"{name}-{layout}": replicated(base, 2, layout)
    for name, base in (("unequal-1f1b", PLANS["1f1b-unequal"]), ("zbv-iw", _on_layers(EXAMPLE4, 8)))
    for layout in ("dp_inner", "pp_inner")
}
"""A plain (unequal 1F1B) and a split I/W (ZBV, two stages per rank) plan, each in both layouts (one bucket
per stage at the default cap, sent during the last backward)."""
DP_PLANS |= {
    f"{name}-layer-buckets": replace(DP_PLANS[name], bucket_mib=1e-6) for name in ("unequal-1f1b-dp_inner", "zbv-iw-pp_inner")
} | {"unequal-1f1b-whole-stages": replace(DP_PLANS["unequal-1f1b-pp_inner"], bucket_mib=None)}
"""And bucketed sync (a cap below any layer: one bucket per layer) and version 2.2's whole stages after the
last backward."""


def test_data_parallel_gradients_equal_single_process_on_four_processes() -> None:
    jobs = [(plan, functools.partial(built_tiny_model, plan.num_layers), CFG) for plan in DP_PLANS.values()]
    per_process = launch(many_plans, 4, (jobs,), CFG.launch)
    for i, (name, plan) in enumerate(DP_PLANS.items()):
        losses, want = reference(plan.num_layers, plan.global_batch, CFG)
        reports = [done[i] for done in per_process]
        worlds = replica_worlds(plan)
        for d, world in enumerate(worlds):  # every replica holds the full-batch gradient
            mine = [reports[w] for w in world]
            assert all(r.replica == d for r in mine), name
            got = {k: v for r in mine for k, v in (r.grads or {}).items()}
            assert sorted(got) == sorted(want), name
            for k in want:
                torch.testing.assert_close(got[k], want[k], rtol=1e-10, atol=1e-12, msg=f"{name} replica {d} {k}")
        result = merge(reports)
        assert result.steps[0].loss == pytest.approx(losses[0], rel=1e-12), name
        records = result.steps[0].records  # replica 0's actions, each once
        assert sorted(str(a.label) for a in records) == sorted(str(a) for acts in plan.actions for a in acts)
        ends = [st.allreduce_end_ms for r in reports for st in r.stats]
        assert all(e is not None for e in ends) and result.steps[0].iteration_ms >= max(e for e in ends if e)


# ---------------------------------------------------------------------------
# The command line
# ---------------------------------------------------------------------------


def _dp_plan_file(tmp: Path, **fields: Any) -> Path:
    plan = replace(two_rank_plan(8), global_batch=16, data_parallel=2, **fields)
    return save_plan(validate_plan(plan), tmp / "plan.json", model=MLP)


def _error(res: Any) -> str:
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.exit_code == 1 and len(lines) == 1, res.output
    return str(lines[0])


def test_print_launch_starts_ranks_times_replicas_processes(tmp_path: Path) -> None:
    path = str(_dp_plan_file(tmp_path, cluster=EXAMPLE8_CLUSTER, layout="pp_inner"))
    res = CliRunner().invoke(run_command, [path, "--print-launch", "--nnodes", "2", "--rdzv-endpoint", "node0:29400"])
    assert res.exit_code == 0, res.output
    lines = res.stdout.strip().splitlines()
    assert lines[0].startswith("# 2 rank(s) x 2 replicas = 4 processes: 2 node(s) x 2 process(es)")
    assert "layout pp_inner" in lines[0]
    words = shlex.split(lines[-1])
    assert "--nnodes=2" in words and "--nproc-per-node=2" in words and path in words
    # One node cannot hold 4 processes at 2 GPUs a node; nor can a node take 4 of them.
    res = CliRunner().invoke(run_command, [path, "--print-launch"])
    assert "do not fit 1 node(s) of its cluster's gpus_per_node = 2" in _error(res)
    assert "--nnodes 2 --nproc-per-node 2" in _error(res)
    res = CliRunner().invoke(run_command, [path, "--print-launch", "--nnodes", "1", "--nproc-per-node", "4"])
    assert "do not fit 1 node(s)" in _error(res)


def test_print_launch_without_a_cluster_counts_every_replica(tmp_path: Path) -> None:
    path = str(_dp_plan_file(tmp_path))
    res = CliRunner().invoke(run_command, [path, "--print-launch", "--nnodes", "3", "--rdzv-endpoint", "h:1"])
    assert "2 rank(s) x 2 replicas = 4 processes, which do not fill 3 node(s)" in _error(res)
    res = CliRunner().invoke(run_command, [path, "--print-launch"])
    assert res.exit_code == 0 and "--nproc-per-node=4" in shlex.split(res.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_umsearch_run_of_a_data_parallel_plan_reports_the_full_batch_gradient(tmp_path: Path) -> None:
    """The command's own path (torchrun, the entry point, the merged report) on R x D = 4 processes."""
    import json

    plan = DP_PLANS["unequal-1f1b-pp_inner"]
    save_plan(plan, tmp_path / "plan.json")
    res = CliRunner().invoke(run_command, [str(tmp_path / "plan.json"), "--model",
                                           "tests.runtime.test_distributed:tiny_layers", "--arg", "layers=6",
                                           "--steps", "1", "--warmup-steps", "0", "--seed", "3", "--grads",
                                           "--json", "--timeout", "120"])  # fmt: skip
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout.strip().splitlines()[-1])
    losses, want = reference(6, plan.global_batch, CFG, seed=3)
    assert doc["steps"][0]["loss"] == pytest.approx(losses[0], rel=1e-12)
    got = {k: torch.tensor(v["values"], dtype=torch.float64).reshape(v["shape"]) for k, v in doc["grads"].items()}
    assert sorted(got) == sorted(want)
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-10, atol=1e-12, msg=k)
