"""Real torchrun processes over gloo: gradient and training equivalence, failures, timeouts.

Every launch here goes through ``python -m torch.distributed.run`` and the
entry point clusters use (:mod:`umsearch.runtime.torchrun`).
"""

from __future__ import annotations

import functools
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from tests.runtime.helpers import (
    failing_worker,
    multi_plan_worker,
    plan_of,
    reference_grads,
    sleeping_worker,
    tiny_model,
    zoo_two_stage_plan,
)
from umsearch.core.errors import RuntimeExecutionError
from umsearch.core.plan import Plan, StagePlan, save_plan
from umsearch.runtime.config import LaunchConfig, RunConfig
from umsearch.runtime.launch import launch
from umsearch.runtime.run import merge, run_plan

pytestmark = pytest.mark.slow

CFG = RunConfig(steps=1, seed=3, collect_grads=True, launch=LaunchConfig(timeout_s=60, run_timeout_s=120))
SGD_CFG = replace(CFG, steps=3, lr=0.1)

TWO_STAGE = [
    plan_of(12, ((0, 3), [4, 8], None, 2), ((3, 6), [3, 3, 6], None, 3)),  # GPipe, unequal partitions
    plan_of(12, ((0, 2), [2, 4, 6], None, 2), ((2, 6), [6, 6], None, 1)),  # 1F1B
    plan_of(12, ((0, 4), [4, 8], [6, 6], 2), ((4, 6), [3, 9], [12], 2)),  # recompute, backward != forward
    # GPipe over 12 one-sample messages: the sender runs far ahead of the receive window.
    plan_of(12, ((0, 3), [1] * 12, None, 12), ((3, 6), [1] * 12, None, 12)),
]
THREE_STAGE = [
    plan_of(12, ((0, 2), [4, 4, 4], None, 3), ((2, 4), [6, 6], None, 2), ((4, 6), [2, 4, 6], None, 1)),
    plan_of(12, ((0, 1), [12], [5, 7], 1), ((1, 3), [3, 3, 3, 3], None, 4), ((3, 6), [4, 8], [1, 11], 2)),
]
SGD_PLAN = plan_of(12, ((0, 2), [1, 3, 8], None, 2), ((2, 6), [4, 4, 4], None, 1))  # unequal 1F1B


def _reference_training(steps: int, lr: float, seed: int) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Single-process SGD: the loss of every step and the gradients of the last one."""
    ref = tiny_model(6)
    net = torch.nn.Sequential(*ref.layers)
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    cfg = RunConfig(seed=seed)
    losses = []
    for step in range(steps):
        x, y = ref.make_batch(12, torch.Generator().manual_seed(cfg.batch_seed(step)))
        opt.zero_grad()
        loss = ref.loss(net(x), y)
        loss.backward()
        losses.append(loss.item())
        if step < steps - 1:  # the runtime also steps after the last iteration; grads are from before it
            opt.step()
    return losses, {n: p.grad.detach().clone() for n, p in net.named_parameters() if p.grad is not None}


def _assert_grads(got: dict[str, torch.Tensor] | None, want: dict[str, torch.Tensor]) -> None:
    assert got is not None and sorted(got) == sorted(want)
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-10, atol=1e-12, msg=name)


@pytest.mark.parametrize("plans", [TWO_STAGE, THREE_STAGE], ids=["2-stage", "3-stage"])
def test_gloo_gradients_and_sgd_equal_single_process(plans: list[Plan]) -> None:
    jobs = [(p.to_json(), CFG) for p in plans]
    if plans is TWO_STAGE:
        jobs.append((SGD_PLAN.to_json(), SGD_CFG))
    per_rank = launch(multi_plan_worker, plans[0].num_stages, (jobs, functools.partial(tiny_model, 6)), CFG.launch)
    want = reference_grads(tiny_model(6), 12, CFG.batch_seed(0))
    model = tiny_model(6)
    x, y = model.make_batch(12, torch.Generator().manual_seed(CFG.batch_seed(0)))
    want_loss = model.loss(torch.nn.Sequential(*model.layers)(x), y).item()
    for i, plan in enumerate(plans):
        result = merge([reports[i] for reports in per_rank])
        _assert_grads(result.grads, want)
        assert result.steps[0].loss == pytest.approx(want_loss, rel=1e-12)
        ops = result.steps[0].ops
        assert len(ops) == sum(len(st.forward) + len(st.backward) for st in plan.stages)
        assert result.steps[0].iteration_ms == max(op.end_ms for op in ops)
        # One thread per rank and enough cores: every rank runs on a core of its own.
        cpus = [c for c in result.cpus if c is not None]
        if len(os.sched_getaffinity(0)) >= plan.num_stages and cpus:
            assert all(len(c) == 1 for c in cpus) and len({c[0] for c in cpus}) == len(cpus)
    if plans is TWO_STAGE:
        # Three SGD steps of an unequal 2-stage plan = three steps of single-process training.
        sgd = merge([reports[-1] for reports in per_rank])
        losses, grads = _reference_training(SGD_CFG.steps, SGD_CFG.lr, SGD_CFG.seed)
        assert [s.loss for s in sgd.steps] == pytest.approx(losses, rel=1e-12)
        _assert_grads(sgd.grads, grads)


def test_failing_rank_stops_the_run_with_its_error() -> None:
    t0 = time.monotonic()
    with pytest.raises(RuntimeExecutionError, match="^stage 1 failed: ValueError: boom on rank 1") as info:
        launch(failing_worker, 2, (1,), LaunchConfig(timeout_s=60, run_timeout_s=60))
    # The sibling blocked in recv was stopped, not waited for until the 60 s timeouts.
    assert time.monotonic() - t0 < 30
    # One line; a sibling that saw the connection drop may be counted after it.
    assert str(info.value) in ("stage 1 failed: ValueError: boom on rank 1",
                               "stage 1 failed: ValueError: boom on rank 1 (1 other stage(s) failed after it)")  # fmt: skip
    assert any("boom on rank 1" in note for note in getattr(info.value, "__notes__", []))  # the rank's traceback


def test_run_time_limit_kills_a_stuck_run(tmp_path: Path) -> None:
    t0 = time.monotonic()
    with pytest.raises(RuntimeExecutionError, match=r"longer than 4 s; stage\(s\) 0, 1 still running"):
        launch(sleeping_worker, 2, (600, str(tmp_path)), LaunchConfig(run_timeout_s=4))
    assert time.monotonic() - t0 < 40
    pids = [int(p.read_text()) for p in tmp_path.glob("*.pid")]
    assert len(pids) == 2
    for pid in pids:  # no rank outlives the launch
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


MODEL_MD_DEADLOCK = Plan(
    global_batch=8,
    stages=(
        StagePlan(layers=(0, 2), forward=(1, 3, 4), backward=(2, 6), warmup=1, recompute=True),
        StagePlan(layers=(2, 4), forward=(4, 4), backward=(8,), warmup=2, recompute=True),
    ),
)


def test_link_timeout_stops_a_deadlocked_run() -> None:
    """Forced past the checks, MODEL.md's deadlocking plan fails after --timeout, not after 30 minutes."""
    cfg = RunConfig(steps=1, check=False, launch=LaunchConfig(timeout_s=3, run_timeout_s=90))
    t0 = time.monotonic()
    with pytest.raises(RuntimeExecutionError) as info:
        run_plan(MODEL_MD_DEADLOCK, functools.partial(tiny_model, 4), cfg)
    # Stage 0 waits for the gradients of its first backward, stage 1 for activations of its second forward.
    assert str(info.value).startswith(("stage 0 gave up waiting for gradient message 0 from stage 1, "
                                       "needed by backward microbatch 0: Timed out",
                                       "stage 1 gave up waiting for activation message 2 from stage 0, "
                                       "needed by forward microbatch 1: Timed out"))  # fmt: skip
    assert time.monotonic() - t0 < 60


def _torchrun(tmp_path: Path, plan: Plan) -> subprocess.CompletedProcess[str]:
    save_plan(plan, tmp_path / "plan.json")
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m",
         "umsearch.runtime.torchrun", str(tmp_path / "plan.json"), "--steps=2", "--backend=gloo", "--threads=1"],
        capture_output=True, text=True, timeout=120, check=False, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip


def test_torchrun_entry_point_on_a_cluster_command(tmp_path: Path) -> None:
    """The command ``umsearch run --print-launch`` prints, run here with torchrun --standalone."""
    done = _torchrun(tmp_path, zoo_two_stage_plan())
    assert done.returncode == 0, done.stderr[-3000:]
    assert "found in sys.modules" not in done.stderr
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [r["step"] for r in rows] == [0, 1]
    assert all(math.isfinite(r["loss"]) and r["iteration_ms"] > 0 for r in rows)


def test_torchrun_entry_point_refuses_a_deadlocking_plan(tmp_path: Path) -> None:
    plan = zoo_two_stage_plan()
    L = plan.stages[-1].hi
    s0, s1 = MODEL_MD_DEADLOCK.stages
    bad = replace(plan, stages=(replace(s0, layers=(0, 2)), replace(s1, layers=(2, L))))
    done = _torchrun(tmp_path, bad)
    assert done.returncode != 0
    assert "umsearch: stage 0: the plan deadlocks" in done.stderr
