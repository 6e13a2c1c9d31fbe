"""Real processes over gloo: gradient equivalence and failure handling of the launcher."""

from __future__ import annotations

import functools
import json
import math
import subprocess
import sys
import time
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
from umsearch.errors import RuntimeExecutionError
from umsearch.plan import save_plan
from umsearch.runtime.config import RunConfig
from umsearch.runtime.launch import LaunchConfig, launch
from umsearch.runtime.run import merge

CFG = RunConfig(steps=1, seed=3, collect_grads=True, launch=LaunchConfig(timeout_s=60, run_timeout_s=120))

TWO_STAGE = [
    plan_of(12, ((0, 3), [4, 8], None, 2), ((3, 6), [3, 3, 6], None, 3)),  # GPipe, unequal partitions
    plan_of(12, ((0, 2), [2, 4, 6], None, 2), ((2, 6), [6, 6], None, 1)),  # 1F1B
    plan_of(12, ((0, 4), [4, 8], [6, 6], 2), ((4, 6), [3, 9], [12], 2)),  # recompute, backward != forward
]
THREE_STAGE = [
    plan_of(12, ((0, 2), [4, 4, 4], None, 3), ((2, 4), [6, 6], None, 2), ((4, 6), [2, 4, 6], None, 1)),
    plan_of(12, ((0, 1), [12], [5, 7], 1), ((1, 3), [3, 3, 3, 3], None, 4), ((3, 6), [4, 8], [1, 11], 2)),
]


@pytest.mark.parametrize("plans", [TWO_STAGE, THREE_STAGE], ids=["2-stage", "3-stage"])
def test_gloo_gradients_equal_full_batch(plans: list) -> None:  # type: ignore[type-arg]
    factory = functools.partial(tiny_model, 6)
    per_rank = launch(multi_plan_worker, plans[0].num_stages, ([p.to_json() for p in plans], factory, CFG), CFG.launch)
    want = reference_grads(tiny_model(6), 12, CFG.batch_seed(0))
    model = tiny_model(6)
    x, y = model.make_batch(12, torch.Generator().manual_seed(CFG.batch_seed(0)))
    want_loss = model.loss(torch.nn.Sequential(*model.layers)(x), y).item()
    for i, plan in enumerate(plans):
        result = merge([reports[i] for reports in per_rank])
        assert result.grads is not None and sorted(result.grads) == sorted(want)
        for name in want:
            torch.testing.assert_close(result.grads[name], want[name], rtol=1e-10, atol=1e-12, msg=name)
        assert result.steps[0].loss == pytest.approx(want_loss, rel=1e-12)
        ops = result.steps[0].ops
        assert len(ops) == sum(len(st.forward) + len(st.backward) for st in plan.stages)
        assert result.steps[0].iteration_ms == max(op.end_ms for op in ops)


def test_failing_rank_stops_the_run_with_its_error() -> None:
    t0 = time.monotonic()
    with pytest.raises(RuntimeExecutionError, match="stage 1 failed: ValueError: boom on rank 1"):
        launch(failing_worker, 2, (1,), LaunchConfig(timeout_s=60, run_timeout_s=60))
    # The sibling blocked in recv was killed, not waited for until the 60 s timeouts.
    assert time.monotonic() - t0 < 30


def test_run_time_limit_kills_a_stuck_run() -> None:
    t0 = time.monotonic()
    with pytest.raises(RuntimeExecutionError, match=r"longer than 2 s; stage\(s\) 0, 1 still running"):
        launch(sleeping_worker, 2, (600,), LaunchConfig(run_timeout_s=2))
    assert time.monotonic() - t0 < 30


def test_torchrun_entry_point(tmp_path: Path) -> None:
    """The command ``umsearch run --print-launch`` prints, run here with torchrun --standalone."""
    save_plan(zoo_two_stage_plan(), tmp_path / "plan.json")
    torchrun = Path(sys.executable).with_name("torchrun")
    done = subprocess.run(
        [str(torchrun), "--standalone", "--nproc-per-node=2", "-m", "umsearch.runtime.worker",
         str(tmp_path / "plan.json"), "--steps=2", "--backend=gloo", "--threads=1"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [r["step"] for r in rows] == [0, 1]
    assert all(math.isfinite(r["loss"]) and r["iteration_ms"] > 0 for r in rows)
