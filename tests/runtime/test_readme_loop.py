"""The README's "Use a plan in your own pipelining loop" lines, run as written on two gloo processes.

The block is taken from README.md; only the plan's path is pointed at a
plan written here, and the names the README leaves to the user (``parts``,
``device``, ``loss_fn``, ``batches``) are given. Two steps of AdamW on an
unequal, interleaved plan end with the parameters of two steps of
single-process AdamW on the full batches.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from tests.contract import EXAMPLE5
from tests.runtime.test_distributed import tiny_model
from umsearch.core.plan import Plan
from umsearch.core.plan_io import save_plan
from umsearch.runtime.config import LaunchConfig
from umsearch.runtime.launch import launch

README = Path(__file__).resolve().parents[2] / "README.md"
HEADING = "## Use a plan in your own pipelining loop"


def readme_block() -> str:
    """The first python block under the heading."""
    text = README.read_text()
    section = text[text.index(HEADING):]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None, "no python block under the heading"
    return match.group(1)


def _plan() -> Plan:
    cuts = [0, 2, 3, 5, 6]
    return replace(EXAMPLE5, stages=tuple(replace(s, layers=(cuts[j], cuts[j + 1])) for j, s in enumerate(EXAMPLE5.stages)))


def _batches(plan: Plan, model: object) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [model.make_batch(plan.global_batch, torch.Generator().manual_seed(s)) for s in (1, 2)]  # type: ignore[attr-defined]


def loop_worker(rank: int, world: int, plan_path: str) -> tuple[dict[str, torch.Tensor], int]:
    """Launch target: the README's lines; this rank's parameters after them, and how many times the lines
    checked a plan (:func:`umsearch.core.plan_rules.validate_plan`'s real checks, not those it skips)."""
    from umsearch.core import plan_rules
    from umsearch.runtime.model_source import stage_module

    code = readme_block().replace('"runs/gpt2r/plan.json"', repr(plan_path))
    plan = _plan()
    model = tiny_model(plan.num_layers)
    parts = {j: stage_module(model, st.lo, st.hi) for j, st in enumerate(plan.stages)}
    scope = {"parts": parts, "device": torch.device("cpu"), "loss_fn": model.loss, "batches": _batches(plan, model)}
    checks: list[Plan] = []
    check = plan_rules._check

    def counted(plan: Plan) -> None:
        checks.append(plan)
        check(plan)

    plan_rules._check = counted
    try:
        exec(compile(code, "README.md", "exec"), scope)
    finally:
        plan_rules._check = check
    return {n: p.detach().clone() for j in plan.stages_of(rank) for n, p in parts[j].named_parameters()}, len(checks)


@pytest.mark.slow
def test_the_readme_loop_trains_like_one_process_and_checks_the_plan_once(tmp_path: Path) -> None:
    plan = _plan()
    save_plan(plan, tmp_path / "plan.json")
    per_rank = launch(loop_worker, 2, (str(tmp_path / "plan.json"),), LaunchConfig(timeout_s=60))
    model = tiny_model(plan.num_layers)
    net = torch.nn.Sequential(*model.layers)
    opt = torch.optim.AdamW(net.parameters())
    for x, y in _batches(plan, model):
        opt.zero_grad()
        model.loss(net(x), y).backward()
        opt.step()
    assert [checks for _, checks in per_rank] == [1, 1]  # each process checks the plan once, loading it
    got = {k: v for params, _ in per_rank for k, v in params.items()}
    want = dict(net.named_parameters())
    assert sorted(got) == sorted(want)
    for name, value in got.items():
        torch.testing.assert_close(value, want[name].detach(), rtol=1e-10, atol=1e-12, msg=name)
