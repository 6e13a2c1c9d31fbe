"""PlanSchedule holds no more memory than torch's own schedule class on the same plan and stages.

Two gloo processes run torch's ZBV and 1F1B plans on the same ``PipelineStage`` objects through
``PlanSchedule`` and through torch's class, one step each under the memory tally, which also counts a gradient
set without ``AccumulateGrad`` (torch's split backward writes ``weight.grad = dw`` in ``W``, which no
accumulate hook sees). After every action both hold the same gradients, and PlanSchedule's saved tensors are at most
torch's (but after the last stage's forward, whose loss torch computes only after the stage returns); the peaks
are equal to the byte.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.orchestrate.test_contender_checkpointing import mlp_model
from tests.runtime.helpers import peer_plan
from umsearch.orchestrate.contenders import make_runners
from umsearch.runtime.config import LaunchConfig, RunConfig
from umsearch.runtime.launch import launch
from umsearch.runtime.memory_tally import MemoryTally

pytestmark = pytest.mark.slow

CFG = RunConfig(warmup_steps=1, lr=0.0, launch=LaunchConfig(timeout_s=120))
PLANS = {"ZBVZeroBubble": peer_plan("ZBVZeroBubble", 2, 2, 8, 256, 8), "1F1B": peer_plan("1F1B", 2, 1, 8, 256, 8)}


def _trace(obj: Any, name: str, label: str, log: list[tuple[str, int, int]], box: list[Any]) -> None:
    own = getattr(obj, name)

    def traced(*args: Any, **kwargs: Any) -> Any:
        out = own(*args, **kwargs)
        if box[0] is not None:
            log.append((label, box[0].saved, box[0].grads))
        return out

    setattr(obj, name, traced)


def memory_worker(rank: int, world: int, schedule: str) -> dict[str, Any]:
    """Launch target: per runtime, the tally after each action of one step and the step's peak."""
    plan = PLANS[schedule]
    runners = make_runners(rank, world, [("umsearch", plan, None), ("torch", plan, schedule)],
                           lambda: mlp_model(8), CFG)  # fmt: skip
    out: dict[str, Any] = {}
    for name, runner in zip(("plan", "torch"), runners, strict=True):
        log: list[tuple[str, int, int]] = []
        box: list[Any] = [None]
        if name == "plan":
            for j, compute in runner.sched.executor.stages.items():
                for method, kind in (("forward", "F"), ("backward", "B"), ("weight", "W")):
                    _trace(compute, method, f"{j}{kind}", log, box)
        else:
            for st in runner.sched._stages if hasattr(runner.sched, "_stages") else [runner.sched._stage]:
                for method, kind in (("forward_one_chunk", "F"), ("backward_one_chunk", "B"),
                                     ("backward_weight_one_chunk", "W")):  # fmt: skip
                    _trace(st, method, f"{st.stage_index}{kind}", log, box)
        runner.step(0)  # torch sizes its buffers in its first step
        for p in runner.params:
            p.grad = None
        box[0] = tally = MemoryTally(runner.params, runner.opt)
        with tally:
            runner.step(1)
        box[0] = None
        out[name] = (log, tally.result().peak_bytes)
    return out


@pytest.mark.parametrize("schedule", sorted(PLANS))
def test_plan_schedule_keeps_no_more_alive_than_torchs_class(schedule: str) -> None:
    for got in launch(memory_worker, 2, (schedule,), CFG.launch):
        (ours, our_peak), (theirs, their_peak) = got["plan"], got["torch"]
        assert [a for a, _, _ in ours] == [a for a, _, _ in theirs]  # the same actions, in the same order
        loss_side = f"{PLANS[schedule].num_stages - 1}F"  # torch computes the loss after the stage's forward
        for (label, saved, grads), (_, torch_saved, torch_grads) in zip(ours, theirs, strict=True):
            assert grads == torch_grads
            if label != loss_side:
                assert saved <= torch_saved
        assert our_peak == their_peak
