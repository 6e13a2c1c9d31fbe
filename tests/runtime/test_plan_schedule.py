"""PlanSchedule: umsearch plans on torch's own PipelineStage objects, in 2 and 3 gloo processes.

For interleaved, V-shape, split, recomputing, unequal and per-stage-different
plans, ``PlanSchedule.step`` gives the single-process full-batch gradients and
its ``losses`` average to the full-batch loss; the same stage objects then run
torch's own ``Interleaved1F1B`` / ``ZBVZeroBubble`` to the same gradients,
so they are ordinary stages. Refusals are one line naming both sides.
"""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from tests.contract import EXAMPLE3, EXAMPLE4, EXAMPLE5
from tests.runtime.helpers import peer_plan, plan_of
from tests.runtime.test_distributed import tiny_model
from umsearch.core.plan import Plan
from umsearch.errors import PlanError
from umsearch.runtime.config import LaunchConfig
from umsearch.runtime.launch import launch
from umsearch.runtime.plan_schedule import check_stages

SEED = 11
LAUNCH = LaunchConfig(timeout_s=60)


def _on_layers(plan: Plan, per_stage: int = 2) -> Plan:
    return replace(plan, stages=tuple(replace(s, layers=(j * per_stage, (j + 1) * per_stage))
                                      for j, s in enumerate(plan.stages)))  # fmt: skip


TWO = {
    "interleaved": (_on_layers(EXAMPLE3), "Interleaved1F1B"),
    "v-shape-split": (_on_layers(EXAMPLE4), "ZBVZeroBubble"),
    "unequal-interleaved": (_on_layers(EXAMPLE5), None),
    "recompute-per-stage": (plan_of(12, ((0, 3), [4, 8], [6, 6], 2), ((3, 6), [3, 9], [12], 2)), None),
    "unequal-1f1b": (plan_of(12, ((0, 2), [2, 4, 6], None, 2), ((2, 5), [6, 6], None, 1)), None),
}
"""name -> (plan, torch schedule the same stages also run, or None)."""

THREE = {
    "interleaved-3": (peer_plan("Interleaved1F1B", 3, 2, 6, 12, 6), "Interleaved1F1B"),
    "v-shape-3": (peer_plan("ZBVZeroBubble", 3, 2, 6, 12, 6), "ZBVZeroBubble"),
    "per-stage-3": (plan_of(12, ((0, 2), [5, 7], None, 2), ((2, 4), [4, 4, 4], [6, 6], 3),
                            ((4, 6), [2, 10], None, 1)), None),  # fmt: skip
}


def _reference(plan: Plan, sum_of: bool = False) -> tuple[float, dict[str, torch.Tensor]]:
    """Single process: the full-batch mean loss and its gradients (``sum_of``: the gradients of the sum of
    the last stage's microbatch mean losses)."""
    model = tiny_model(plan.num_layers)
    net = torch.nn.Sequential(*model.layers)
    x, y = model.make_batch(plan.global_batch, torch.Generator().manual_seed(SEED))
    full = model.loss(net(x), y)
    if sum_of:
        lo, total = 0, torch.zeros((), dtype=torch.float64)
        for n in plan.stages[-1].forward:
            total = total + model.loss(net(x[lo:lo + n]), y[lo:lo + n])
            lo += n
        total.backward()
    else:
        full.backward()
    return full.item(), {n: p.grad.detach().clone() for n, p in net.named_parameters() if p.grad is not None}


def schedule_worker(rank: int, world: int, jobs: list[tuple[Plan, str | None, bool]]) -> list[dict[str, Any]]:
    """Launch target: per job, this rank's gradients and losses under PlanSchedule (and torch's schedule)."""
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import get_schedule_class

    from umsearch.pipelining import PlanSchedule
    from umsearch.runtime.model_source import stage_module

    out = []
    for plan, torch_name, scale in jobs:
        model = tiny_model(plan.num_layers)
        mine = plan.stages_of(rank)
        mods = [stage_module(model, plan.stages[j].lo, plan.stages[j].hi) for j in mine]
        stages = [PipelineStage(m, j, plan.num_stages, torch.device("cpu")) for j, m in zip(mine, mods, strict=True)]
        first, last = 0 in mine, plan.num_stages - 1 in mine
        x, y = model.make_batch(plan.global_batch, torch.Generator().manual_seed(SEED))
        args = (x,) if first else ()
        sched = PlanSchedule(list(reversed(stages)), plan, model.loss, scale_grads=scale)
        losses: list[torch.Tensor] = []
        output = sched.step(*args, target=y if last else None, losses=losses if last else None)
        grads = {n: p.grad.clone() for m in mods for n, p in m.named_parameters() if p.grad is not None}
        assert sched.stats is not None
        actions = [str(r.label) for r in sched.stats.actions]
        evaluated = sched.eval(*args, target=y if last else None)
        res: dict[str, Any] = {"grads": grads, "losses": [float(v) for v in losses], "output": output,
                               "eval": evaluated, "actions": actions}  # fmt: skip
        if torch_name is not None:
            for m in mods:
                m.zero_grad(set_to_none=True)
            cls = get_schedule_class(torch_name)
            theirs = cls(stages, len(plan.stages[0].forward), loss_fn=model.loss)
            torch_losses: list[torch.Tensor] = []
            theirs.step(*args, target=y if last else None, losses=torch_losses if last else None)
            res["torch_grads"] = {n: p.grad.clone() for m in mods for n, p in m.named_parameters()
                                  if p.grad is not None}  # fmt: skip
            res["torch_losses"] = [float(v) for v in torch_losses]
        out.append(res)
    return out


def _close(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], what: str) -> None:
    assert sorted(got) == sorted(want), what
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-10, atol=1e-12, msg=f"{what}: {name}")


def _check(plans: dict[str, tuple[Plan, str | None]], world: int) -> None:
    jobs = [(plan, torch_name, True) for plan, torch_name in plans.values()]
    per_rank = launch(schedule_worker, world, (jobs,), LAUNCH)
    for i, (name, (plan, torch_name)) in enumerate(plans.items()):
        results = [per_rank[r][i] for r in range(world)]
        loss, want = _reference(plan)
        grads = {k: v for r in results for k, v in r["grads"].items()}
        _close(grads, want, name)
        last = results[plan.stages[-1].rank]
        assert len(last["losses"]) == len(plan.stages[-1].forward), name
        assert sum(last["losses"]) / len(last["losses"]) == pytest.approx(loss, rel=1e-12), name
        # Outputs of the whole batch, in sample order; eval's forwards give the same.
        model = tiny_model(plan.num_layers)
        x, _ = model.make_batch(plan.global_batch, torch.Generator().manual_seed(SEED))
        torch.testing.assert_close(last["output"], torch.nn.Sequential(*model.layers)(x).detach())
        torch.testing.assert_close(last["eval"], last["output"])
        for r in range(world):
            assert results[r]["actions"] == [str(a) for a in plan.actions[r]], name
        if torch_name is not None:
            _close({k: v for r in results for k, v in r["torch_grads"].items()}, want, f"{name} under {torch_name}")
            assert last["torch_losses"] == pytest.approx(last["losses"], rel=1e-12), name


@pytest.mark.slow
def test_two_ranks_give_single_process_gradients_and_torch_schedules_run_the_same_stages() -> None:
    _check(TWO, 2)


@pytest.mark.slow
def test_three_ranks_give_single_process_gradients_and_torch_schedules_run_the_same_stages() -> None:
    _check(THREE, 3)


@pytest.mark.slow
def test_without_scale_grads_the_gradients_are_of_the_sum_of_microbatch_losses() -> None:
    plan = TWO["unequal-1f1b"][0]
    per_rank = launch(schedule_worker, 2, ([(plan, None, False)],), LAUNCH)
    _, want = _reference(plan, sum_of=True)
    _close({k: v for r in per_rank for k, v in r[0]["grads"].items()}, want, "scale_grads=False")
    model = tiny_model(plan.num_layers)
    net = torch.nn.Sequential(*model.layers)
    x, y = model.make_batch(plan.global_batch, torch.Generator().manual_seed(SEED))
    bounds = [0, 6, 12]  # the last stage's forward list [6, 6]
    raw = [model.loss(net(x[a:b]), y[a:b]).item() for a, b in zip(bounds, bounds[1:], strict=False)]
    assert per_rank[1][0]["losses"] == pytest.approx(raw, rel=1e-12)


# ---------------------------------------------------------------- refusals


def _stage(j: int, num_stages: int = 4, rank: int = 0, size: int = 2, layers: int = 2) -> SimpleNamespace:
    mod = torch.nn.Sequential(*[torch.nn.Identity() for _ in range(layers)])
    return SimpleNamespace(stage_index=j, num_stages=num_stages, group_rank=rank, group_size=size, submod=mod)


def _plan() -> Plan:
    return _on_layers(EXAMPLE3)


def test_the_stages_of_a_rank_are_accepted_in_any_order() -> None:
    assert check_stages(_plan(), [_stage(0, rank=0), _stage(2, rank=0)]) == 0  # type: ignore[list-item]
    assert check_stages(_plan(), [_stage(1, rank=1), _stage(3, rank=1)]) == 1  # type: ignore[list-item]


@pytest.mark.parametrize(("stages", "words"), [
    ([], "no stages"),
    ([_stage(0)], "holds stages [0, 2] in the plan but got PipelineStages [0]"),
    ([_stage(0), _stage(1)], "holds stages [0, 2] in the plan but got PipelineStages [0, 1]"),
    ([_stage(0, num_stages=3), _stage(2, num_stages=3)], "num_stages=3, the plan has 4 stages"),
    ([_stage(0, size=3), _stage(2, size=3)], "group has 3 ranks, the plan 2"),
    ([_stage(0), _stage(7)], "stage_index 7 is outside the plan's stages 0..3"),
    ([_stage(0, layers=3), _stage(2)], "layers [0, 2) (2) in the plan but its module is an nn.Sequential of 3"),
])  # fmt: skip
def test_a_mismatch_between_plan_and_stages_is_one_line_naming_both(stages: list[Any], words: str) -> None:
    with pytest.raises(PlanError) as err:
        check_stages(_plan(), stages)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_a_data_parallel_plan_is_refused() -> None:
    from tests.contract import example8

    with pytest.raises(PlanError, match="2 data-parallel replicas"):
        check_stages(example8(), [_stage(0, num_stages=2)])  # type: ignore[list-item]
