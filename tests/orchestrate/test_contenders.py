"""Contenders on one runtime: plans through PlanSchedule and torch's schedule classes on the same stage objects.

Two gloo processes: a torch 1F1B peer, the same peer plan through
``PlanSchedule``, and an unequal plan cut the same way. The peer plan's
``PlanSchedule`` and torch's class hold the very same ``PipelineStage``
objects; a plan with other microbatches than a torch schedule does not
share torch's buffers; every plan's round brings back its actions with the
wall time as ``step_ms``.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest

from tests.runtime.helpers import peer_plan, plan_of
from tests.runtime.test_distributed import tiny_model
from umsearch.orchestrate.contenders import Entry, machine, make_runners, mixed_worker
from umsearch.runtime.config import LaunchConfig, RunConfig
from umsearch.runtime.launch import launch
from umsearch.runtime.replay import replay_rank

pytestmark = pytest.mark.slow

PEER = peer_plan("1F1B", 2, 1, 4, 8, 4)
UNEQUAL = plan_of(8, ((0, 2), [3, 5], None, 2), ((2, 4), [2, 6], None, 1))
GPIPE = peer_plan("GPipe", 2, 1, 2, 8, 4)
JOBS = [("umsearch", PEER, None), ("torch", PEER, "1F1B"), ("umsearch", UNEQUAL, None),
        ("torch", GPIPE, "GPipe")]  # fmt: skip
CFG = RunConfig(warmup_steps=1, launch=LaunchConfig(timeout_s=60))


def _stage_ids(sched: Any) -> list[int]:
    stages = getattr(sched, "_stages", None) or [sched._stage]
    return [id(s) for s in stages]


def sharing_worker(rank: int, world: int) -> dict[str, Any]:
    """Launch target: which runners hold the same stage objects, and one round of every job."""
    runners = make_runners(rank, world, JOBS, functools.partial(tiny_model, 4), CFG)
    ids = [_stage_ids(r.sched) for r in runners]
    return {"ids": ids, "rounds": mixed_worker(rank, world, JOBS, functools.partial(tiny_model, 4), CFG, 2)}


def test_a_plan_and_the_torch_schedule_of_its_cut_share_stage_objects_and_plans_bring_back_actions() -> None:
    per_rank = launch(sharing_worker, 2, (), CFG.launch)
    for rank, got in enumerate(per_rank):
        ids = got["ids"]
        assert ids[0] == ids[1]  # the peer plan through PlanSchedule and torch's 1F1B: the same stages
        assert ids[2] == ids[0]  # the unequal plan cut alike: PlanSchedule takes them too
        assert ids[3] != ids[1]  # GPipe's other microbatches keep torch's buffers apart
        for measured in got["rounds"]:
            for job, value in zip(JOBS, measured, strict=True):
                if job[0] == "torch":
                    assert isinstance(value, float) and value > 0
                else:
                    plan = PEER if job[1] == PEER else UNEQUAL
                    assert [str(a.label) for a in value.actions] == [str(a) for a in plan.actions[rank]]
                    assert value.step_ms >= value.pipeline_ms > 0


def test_every_contender_has_a_measured_peak_per_rank_and_a_plans_is_the_replays_tally() -> None:
    factory = functools.partial(tiny_model, 4)
    entries = [Entry(name=f"{kind} {i}", plan=plan, runtime=kind, schedule=sched)  # type: ignore[arg-type]
               for i, (kind, plan, sched) in enumerate(JOBS)]  # fmt: skip
    got = machine(factory, CFG)(entries, 2)
    for e, m in zip(entries, got, strict=True):
        assert len(m.peak_bytes) == e.plan.ranks and all(b > 0 for b in m.peak_bytes)
        if e.runtime == "umsearch":
            # The same plan's rank alone, replayed with its tally: the very same figure, to the byte.
            assert m.peak_bytes == tuple(replay_rank(e.plan, factory, r, cfg=CFG, steps=1).tally.peak_bytes
                                         for r in range(e.plan.ranks))  # fmt: skip
    # torch's own class holds more saved tensors at once with more microbatches in flight: GPipe's 2 whole
    # halves of the batch against 1F1B's 4 quarters, the same stages, parameters and optimizer.
    torch_1f1b, torch_gpipe = got[1].peak_bytes, got[3].peak_bytes
    assert torch_gpipe[0] > torch_1f1b[0]
