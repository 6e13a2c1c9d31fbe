"""ZeRO-1 on the runtime (docs/model.md section 9) and the run's ``--optimizer``: a ``zero1`` plan runs with
each stage's optimizer states sharded over its ``D`` copies, gradient- and update-exact against whole
(non-sharded) Adam, and each rank keeps the state the model's zero1 formula predicts."""

from __future__ import annotations

import functools
import types
from dataclasses import replace
from typing import Any, cast

import pytest
import torch

from tests.runtime.test_data_parallel import DP_PLANS
from tests.runtime.test_distributed import tiny_model
from umsearch.core.cost import CostModel
from umsearch.core.plan import Plan
from umsearch.core.plan_rules import validate_plan
from umsearch.runtime.config import (
    FlagValueError,
    LaunchConfig,
    ModelChoice,
    RunConfig,
    configs_from_values,
    optimizer_warning,
    state_factor_of,
    to_argv,
)
from umsearch.runtime.launch import launch
from umsearch.runtime.placement import replica_worlds
from umsearch.runtime.zero1 import Zero1Optimizer, make_optimizer, optimizer_factory
from umsearch.sim.reference import state_factor

# ---------------------------------------------------------------------------
# --optimizer and the state factor it implies
# ---------------------------------------------------------------------------


def test_each_optimizer_has_the_state_factor_of_the_memory_model() -> None:
    assert state_factor_of("sgd") == 2.0 and state_factor_of("adam") == 4.0
    with pytest.raises(FlagValueError, match="--optimizer takes one of sgd, adam, got 'lamb'"):
        state_factor_of("lamb")


def test_a_state_factor_other_than_the_plans_is_one_line_of_warning() -> None:
    assert optimizer_warning("adam", 4.0) is None and optimizer_warning("sgd", 2.0) is None
    line = optimizer_warning("sgd", 4.0)
    assert line is not None and "\n" not in line
    assert "--optimizer sgd keeps 2 bytes" in line and "state_factor 4" in line and "--optimizer adam" in line


def test_the_optimizer_travels_as_a_flag_and_defaults_to_sgd() -> None:
    assert RunConfig().optimizer == "sgd"
    cfg = RunConfig(optimizer="adam", lr=0.05)
    argv = to_argv(cfg)
    assert "--optimizer=adam" in argv and "--lr=0.05" in argv
    back, _ = configs_from_values({"optimizer": "adam", "lr": 0.05})
    assert back == cfg and configs_from_values({})[0].optimizer == "sgd"
    assert to_argv(RunConfig(), ModelChoice()).count("--optimizer=sgd") == 1


# ---------------------------------------------------------------------------
# The shards in one process: stepping each copy's shard and joining them is whole Adam
# ---------------------------------------------------------------------------


def _layers(seed: int) -> list[torch.nn.Module]:
    torch.manual_seed(seed)
    return [torch.nn.Sequential(torch.nn.Linear(5, 7).double(), torch.nn.Tanh()), torch.nn.Linear(7, 3).double()]


def test_make_optimizer_shards_only_states_worth_sharding() -> None:
    params = [list(m.parameters()) for m in _layers(0)]
    assert type(make_optimizer("adam", 0.1, params)) is torch.optim.Adam
    assert type(make_optimizer("sgd", 0.1, params, zero1=True, copies=2)) is torch.optim.SGD  # SGD keeps none
    assert type(make_optimizer("adam", 0.1, params, zero1=True, copies=1)) is torch.optim.Adam
    sharded = make_optimizer("adam", 0.1, params, zero1=True, copies=2, shard=1)
    assert isinstance(sharded, Zero1Optimizer) and sharded.shard == 1
    assert [len(b.params) for b in sharded.buckets] == [2, 2]  # one flat range per stage
    assert [b.size for b in sharded.buckets] == [-(-(5 * 7 + 7) // 2), -(-(7 * 3 + 3) // 2)]
    assert make_optimizer("adam", 0.1, []) is None


@pytest.mark.parametrize("zero1", [False, True])
def test_a_weight_two_stages_of_a_rank_share_steps_once(zero1: bool) -> None:
    """A V-shape's tied embedding and head: both stages of the rank list the one weight; one SGD step with
    gradient g moves it by lr * g, not twice that (torch only warns about a parameter listed twice)."""
    shared = torch.nn.Parameter(torch.ones(4, dtype=torch.float64))
    other = torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))
    opt = make_optimizer("adam" if zero1 else "sgd", 0.5, [[shared], [other, shared]], zero1=zero1, copies=2)
    assert opt is not None
    if zero1:
        assert isinstance(opt, Zero1Optimizer)
        assert [b.params for b in opt.buckets] == [[shared], [other]]
        return
    shared.grad, other.grad = torch.full_like(shared, 2.0), torch.zeros_like(other)
    opt.step()
    assert torch.equal(shared.detach(), torch.zeros(4, dtype=torch.float64))  # 1 - 0.5 * 2, once


@pytest.mark.parametrize("copies", [2, 3])
def test_every_copy_stepping_its_shard_is_whole_adam(copies: int) -> None:
    """``copies`` optimizers without a group (each steps its shard alone); joining the shards after each step
    (what the all-gather does) gives torch's whole-state Adam, step for step."""
    whole = _layers(0)
    ref = torch.optim.Adam([p for m in whole for p in m.parameters()], lr=0.05)
    copy = [_layers(0) for _ in range(copies)]
    opts = [Zero1Optimizer([list(m.parameters()) for m in c], optimizer_factory("adam", 0.05), group=None,
                           copies=copies, shard=i) for i, c in enumerate(copy)]  # fmt: skip
    gen = torch.Generator().manual_seed(1)
    for _ in range(3):
        grads = [torch.randn(p.shape, generator=gen, dtype=p.dtype) for m in whole for p in m.parameters()]
        for layers in (whole, *copy):
            for p, g in zip((p for m in layers for p in m.parameters()), grads, strict=True):
                p.grad = g.clone()
        ref.step()
        for opt in opts:
            opt.step()
        for j in range(len(whole)):  # join: copy i's shard of every stage's flat range
            flats = [torch.cat([p.detach().reshape(-1) for p in c[j].parameters()]) for c in copy]
            size = opts[0].buckets[j].size
            joined = torch.cat([flats[i][i * size : (i + 1) * size] for i in range(copies)])
            for c in copy:
                offset = 0
                for p in c[j].parameters():
                    p.data.copy_(joined[offset : offset + p.numel()].view_as(p))
                    offset += p.numel()
        for c in copy:
            for (name, p), q in zip(((n, p) for m in whole for n, p in m.named_parameters()),
                                    (q for m in c for q in m.parameters()), strict=True):  # fmt: skip
                torch.testing.assert_close(q, p, rtol=1e-12, atol=1e-14, msg=name)
    for opt in opts:  # between steps only the states stay: each a shard of the moments
        assert all(b.work.numel() == 0 and b.work.grad is None for b in opt.buckets)
        moments = sum(s[k].numel() for s in opt.state.values() for k in ("exp_avg", "exp_avg_sq"))
        assert moments == 2 * sum(b.size for b in opt.buckets)
    opts[0].zero_grad(set_to_none=True)
    assert all(p.grad is None for m in copy[0] for p in m.parameters())


# ---------------------------------------------------------------------------
# Four processes: D = 2 replicas x R = 2 ranks, zero1 against whole Adam
# ---------------------------------------------------------------------------

ADAM = RunConfig(steps=3, seed=3, lr=0.05, optimizer="adam", launch=LaunchConfig(timeout_s=60))

ZERO1_PLANS = {
    "unequal-1f1b-dp_inner": DP_PLANS["unequal-1f1b-dp_inner"],  # one stage per rank
    "zbv-iw-pp_inner": DP_PLANS["zbv-iw-pp_inner"],  # split I/W backward, two stages per rank
}


def _zero1(plan: Plan, on: bool) -> Plan:
    return validate_plan(replace(plan, zero1=on))


def sessions(rank: int, world: int, jobs: list[tuple[Plan, Any, RunConfig]]) -> list[dict[str, Any]]:
    """Launch target: every job's gradients after each step, weights after the last, and state bytes."""
    from umsearch.runtime.memory_tally import optimizer_state_bytes, storage_bytes
    from umsearch.runtime.worker import RankSession

    out = []
    for plan, factory, cfg in jobs:
        s = RankSession(rank, world, plan, factory, cfg)
        grads = []
        for step in range(cfg.steps):
            s.step(step)
            grads.append(s.grads())
        params = [p for m in s.modules for p in m.parameters()]
        opt = s.executor.optimizer
        out.append({
            "replica": s.placement.replica, "rank": s.rank, "grads": grads,
            "params": {n: p.detach().clone() for m in s.modules for n, p in m.named_parameters()},
            "zero1": isinstance(opt, Zero1Optimizer), "buckets": len(getattr(opt, "buckets", ())),
            "param_bytes": storage_bytes(params), "grad_bytes": storage_bytes(p.grad for p in params if p.grad is not None),
            "state_bytes": optimizer_state_bytes(opt),
            "moment_bytes": sum(v.numel() * v.element_size() for st in opt.state.values() for k, v in st.items()
                                if k in ("exp_avg", "exp_avg_sq")) if opt is not None else 0,
        })  # fmt: skip
    return out


def adam_reference(layers: int, batch: int, cfg: RunConfig) -> tuple[list[dict[str, torch.Tensor]], dict[str, torch.Tensor]]:
    """Single-process whole-state Adam: the gradients of every step and the weights after the last."""
    model = tiny_model(layers)
    net = torch.nn.Sequential(*model.layers)
    opt = torch.optim.Adam(net.parameters(), lr=cfg.lr)
    grads = []
    for step in range(cfg.steps):
        x, y = model.make_batch(batch, torch.Generator().manual_seed(cfg.batch_seed(step)))
        opt.zero_grad()
        model.loss(net(x), y).backward()
        grads.append({n: p.grad.detach().clone() for n, p in net.named_parameters() if p.grad is not None})
        opt.step()
    return grads, {n: p.detach().clone() for n, p in net.named_parameters()}


def _close(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], what: str) -> None:
    assert sorted(got) == sorted(want), what
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-10, atol=1e-12, msg=f"{what} {k}")


@pytest.mark.slow
def test_zero1_adam_is_gradient_and_update_exact_and_keeps_a_shard_of_the_states() -> None:
    jobs = [(_zero1(plan, on), functools.partial(tiny_model, plan.num_layers), ADAM)
            for plan in ZERO1_PLANS.values() for on in (True, False)]  # fmt: skip
    per_process = launch(sessions, 4, (jobs,), ADAM.launch)
    for i, (name, base) in enumerate(ZERO1_PLANS.items()):
        want_grads, want_params = adam_reference(base.num_layers, base.global_batch, ADAM)
        for on in (True, False):
            plan = _zero1(base, on)
            D = plan.data_parallel
            # the model's state term: (2 + (state_factor - 2) / D) x P under zero1, state_factor x P without
            factor = state_factor(plan, cast(CostModel, types.SimpleNamespace(state_factor=state_factor_of("adam"))))
            assert factor == (3.0 if on else 4.0)
            what = f"{name} zero1={on}"
            reports = [done[2 * i + (0 if on else 1)] for done in per_process]
            for d, world in enumerate(replica_worlds(plan)):
                mine = [reports[w] for w in world]
                assert all(r["replica"] == d and r["zero1"] is on for r in mine), what
                for step in range(ADAM.steps):  # after 1 and 3 steps (and 2): the full-batch gradient
                    _close({k: v for r in mine for k, v in r["grads"][step].items()}, want_grads[step],
                           f"{what} replica {d} step {step + 1}")  # fmt: skip
                _close({k: v for r in mine for k, v in r["params"].items()}, want_params, f"{what} replica {d} weights")
            for r in reports:
                P, buckets = r["param_bytes"], r["buckets"]
                assert r["grad_bytes"] == P, what
                if on:
                    # Each rank keeps one shard of Adam's moments: (4 - 2) / D x P, up to D - 1 padding
                    # elements per shard; and one step counter per shard.
                    formula = (state_factor_of("adam") - 2) / D * P
                    assert formula <= r["moment_bytes"] <= formula + buckets * 2 * (D - 1) * 8, what
                    assert r["state_bytes"] - r["moment_bytes"] <= buckets * 8, what
                    assert P + r["grad_bytes"] + r["moment_bytes"] == pytest.approx(factor * P, abs=buckets * 16), what
                else:
                    assert r["moment_bytes"] == 2 * P, what
                    assert P + r["grad_bytes"] + r["moment_bytes"] == factor * P, what
