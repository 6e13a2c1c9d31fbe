"""Tied weights across ranks: the gradient of a weight shared by stages on different ranks is the sum of all
its uses on every rank that holds it, through PlanSchedule and through ``umsearch run``, equal to one process
(and the copies stay equal as they train)."""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import Any

import pytest
import torch

from tests.runtime.helpers import placed, plan_of
from umsearch.core.plan import Plan
from umsearch.core.plan_rules import validate_plan
from umsearch.errors import PlanError
from umsearch.nn.tied import mark_tied, tied_layers
from umsearch.runtime.tied import TiedGrads, marked_ties, ties_by_identity, ties_by_name

GPT2 = {"n_layer": 2, "n_embd": 32, "n_head": 4, "n_positions": 32, "vocab_size": 97, "seq": 12}
GEMMA = {"num_hidden_layers": 2, "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4,
         "num_key_value_heads": 1, "head_dim": 8, "vocab_size": 97, "seq": 12}  # fmt: skip
FAMILIES = {"gpt2": GPT2, "gemma": GEMMA}
BATCH_SEED = 11


def _shared_pair() -> tuple[torch.nn.Module, torch.nn.Module, torch.nn.Parameter]:
    first, last = torch.nn.Embedding(5, 3), torch.nn.Linear(3, 5, bias=False)
    shared = torch.nn.Parameter(torch.randn(5, 3))
    first.weight = last.weight = shared
    return first, last, shared


def test_a_mark_names_the_layers_and_the_plan_names_their_ranks() -> None:
    first, last, w = _shared_pair()
    mark_tied(w, (3, 0, 3))
    assert tied_layers(w) == (0, 3) and tied_layers(torch.nn.Parameter(torch.zeros(1))) == ()
    plan = plan_of(4, ((0, 2), [4], None, 1), ((2, 4), [4], None, 1))
    (tie,) = marked_ties(plan, {0: torch.nn.Sequential(first)})
    assert tie.ranks == (0, 1) and tie.params[0] is w
    # Both stages on one rank share the parameter object: one tie, nothing to exchange.
    (same,) = marked_ties(plan, {0: torch.nn.Sequential(first), 1: torch.nn.Sequential(last)})
    assert same.params == (w,)


def test_ties_by_identity_name_the_weight_in_every_stage_that_holds_it() -> None:
    first, last, _ = _shared_pair()
    other = torch.nn.Linear(3, 3)
    mods = {0: torch.nn.Sequential(first), 1: torch.nn.Sequential(other), 2: torch.nn.Sequential(last)}
    assert ties_by_identity(mods) == [{0: "0.weight", 2: "0.weight"}]


@pytest.mark.parametrize(("ties", "message"), [
    ([{0: "0.weight"}], "names 1 stage"),
    ([{0: "0.weight", 7: "0.weight"}], "outside the plan's stages 0..1"),
    ([{0: "0.nope", 1: "0.weight"}], "stage 0's module has no parameter '0.nope'"),
])  # fmt: skip
def test_a_tie_named_wrong_is_refused_in_one_line(ties: list[dict[int, str]], message: str) -> None:
    plan = plan_of(4, ((0, 1), [4], None, 1), ((1, 2), [4], None, 1))
    first, _, _ = _shared_pair()
    with pytest.raises(PlanError, match=message) as info:
        ties_by_name(plan, {0: torch.nn.Sequential(first)}, ties)
    assert "\n" not in str(info.value)


def test_without_torch_distributed_nothing_is_summed() -> None:
    # A replay runs one rank alone: its gradient stays its own.
    first, _, w = _shared_pair()
    mark_tied(w, (0, 1))
    plan = plan_of(4, ((0, 1), [4], None, 1), ((1, 2), [4], None, 1))
    tied = TiedGrads.of_marks(plan, 0, {0: torch.nn.Sequential(first)})
    assert tied
    w.grad = torch.ones_like(w)
    tied.begin()
    tied.sum()
    assert torch.equal(w.grad, torch.ones_like(w))


# ------------------------------------------------------------------------------------------------ processes
def tied_model(name: str, seed: int = 0) -> Any:
    """The family's tiny ``hf:`` model, tied, in float64 (a picklable factory for ``umsearch run``)."""
    from umsearch.core.model_spec import ModelSpec
    from umsearch.nn.models import build_model
    from umsearch.nn.spec import BuiltModel

    built = build_model(ModelSpec(source=f"hf:{name}", args=FAMILIES[name]), seed=seed)
    return BuiltModel([m.double() for m in built.layers], built.names, built.make_batch, built.loss)


def _all_grads(net: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every name of every parameter (a tied one under each of its names), as the ranks name them."""
    return {n: p.grad.detach().clone() for n, p in net.named_parameters(remove_duplicate=False)
            if p.grad is not None}  # fmt: skip


def _reference(name: str, batch: int, seeds: list[int], lr: float) -> dict[str, torch.Tensor]:
    """One process: SGD over ``seeds``' batches; the last batch's gradients (before its step)."""
    model = tied_model(name)
    net = torch.nn.Sequential(*model.layers)
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    for k, seed in enumerate(seeds):
        opt.zero_grad()
        x, y = model.make_batch(batch, torch.Generator().manual_seed(seed))
        model.loss(net(x), y).backward()
        if k < len(seeds) - 1:
            opt.step()
    return _all_grads(net)


def _tolerances(name: str) -> tuple[float, float]:
    # Gemma's RMSNorm computes in float32 whatever the model's dtype: batch splits show at 1e-7 there.
    return (1e-5, 1e-8) if name == "gemma" else (1e-9, 1e-12)


def _assert_grads(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], name: str) -> None:
    assert sorted(got) == sorted(want)
    rtol, atol = _tolerances(name)
    for n in want:
        torch.testing.assert_close(got[n], want[n], rtol=rtol, atol=atol, msg=n)


def schedule_worker(rank: int, world: int, name: str, plan: Plan, steps: int) -> dict[str, torch.Tensor]:
    """Launch target: ``steps`` PlanSchedule steps on one batch without zeroing (gradients accumulate)."""
    from torch.distributed.pipelining import PipelineStage

    from umsearch.pipelining import PlanSchedule
    from umsearch.runtime.model_source import stage_module

    model = tied_model(name)
    mine = plan.stages_of(rank)
    mods = [stage_module(model, plan.stages[j].lo, plan.stages[j].hi) for j in mine]
    stages = [PipelineStage(m, j, plan.num_stages, torch.device("cpu")) for j, m in zip(mine, mods, strict=True)]
    x, y = model.make_batch(plan.global_batch, torch.Generator().manual_seed(BATCH_SEED))
    sched = PlanSchedule(stages, plan, model.loss)
    for _ in range(steps):
        sched.step(*((x,) if 0 in mine else ()), target=y if plan.num_stages - 1 in mine else None)
    return {n: p.grad.clone() for m in mods for n, p in m.named_parameters(remove_duplicate=False)
            if p.grad is not None}  # fmt: skip


def _two_ranks() -> Plan:
    # Embeddings + layer 1 on rank 0 over [2, 4]; layer 2 + head on rank 1 over [3, 3]: the tie crosses ranks.
    return plan_of(6, ((0, 2), [2, 4], None, 2), ((2, 4), [3, 3], None, 1))


def _v_shape() -> Plan:
    # Stages 0 and 3 (embeddings, head) both on rank 0: the tie stays on one rank.
    return placed(4, [0, 1, 2, 3, 4], [0, 1, 1, 0], [[2, 2]] * 4,
                  ["0F0 0F1 3F0 3B0 3F1 3B1 0B0 0B1", "1F0 2F0 1F1 2F1 2B0 1B0 2B1 1B1"])  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_plan_schedule_sums_a_tied_weight_across_ranks_and_accumulates_across_steps(name: str) -> None:
    pytest.importorskip("transformers")
    from umsearch.runtime.config import LaunchConfig
    from umsearch.runtime.launch import launch

    for plan in (_two_ranks(), _v_shape()):
        per_rank = launch(schedule_worker, 2, (name, plan, 2), LaunchConfig(timeout_s=120))
        got = {k: v for r in per_rank for k, v in r.items()}
        once = _reference(name, plan.global_batch, [BATCH_SEED], lr=0.0)
        _assert_grads(got, {k: 2 * v for k, v in once.items()}, name)
        head = f"{plan.stages[-1].hi - 1}.head.weight"
        assert torch.equal(got[head], got["0.tokens.weight"])  # the copies' sums agree to the bit


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_umsearch_run_sums_a_tied_weight_and_the_copies_train_alike(name: str) -> None:
    pytest.importorskip("transformers")
    from umsearch.runtime.config import LaunchConfig, RunConfig
    from umsearch.runtime.run_plan import run_plan

    cfg = RunConfig(steps=3, seed=2, lr=0.5, collect_grads=True, launch=LaunchConfig(timeout_s=120))
    plan = _two_ranks()
    result = run_plan(plan, functools.partial(tied_model, name), cfg)
    assert result.grads is not None
    want = _reference(name, plan.global_batch, [cfg.batch_seed(s) for s in range(cfg.steps)], lr=cfg.lr)
    # Step 3's gradients match only if both copies of the tied weight took the same two steps.
    _assert_grads(result.grads, want, name)


@pytest.mark.slow
@pytest.mark.parametrize("shape", ["two ranks", "V, per-layer buckets"])
def test_a_data_parallel_run_sums_the_tie_within_each_replica(shape: str) -> None:
    """On the V the tied weight is one parameter of two stages of rank 0, with buckets small enough to go
    during the backward: the gradients stay exact (the stage whose last backward runs last all-reduces it,
    gradsync ``synced_by_stage``, tested alone in tests/runtime/test_gradsync.py)."""
    pytest.importorskip("transformers")
    from umsearch.runtime.config import LaunchConfig, RunConfig
    from umsearch.runtime.run_plan import run_plan

    cfg = RunConfig(steps=2, seed=1, lr=0.5, collect_grads=True, launch=LaunchConfig(timeout_s=180))
    if shape == "two ranks":
        plan = validate_plan(replace(_two_ranks(), global_batch=12, data_parallel=2))  # 6 samples per replica
    else:
        plan = validate_plan(replace(_v_shape(), global_batch=8, data_parallel=2, bucket_mib=1e-6))
    result = run_plan(plan, functools.partial(tied_model, "gpt2"), cfg)
    assert result.grads is not None
    want = _reference("gpt2", plan.global_batch, [cfg.batch_seed(s) for s in range(cfg.steps)], lr=cfg.lr)
    _assert_grads(result.grads, want, "gpt2")
