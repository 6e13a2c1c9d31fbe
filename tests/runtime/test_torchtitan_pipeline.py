"""torchtitan's own llama3, cut by torchtitan's own splitting where an umsearch plan cuts, stepped on 2 gloo
processes the way torchtitan's trainer steps its schedule: gradients and loss equal to one process.

Skips without torchtitan (``pip install 'umsearch[torchtitan]'``; its models import triton too). The model is
torchtitan's ``debugmodel`` flavour with torch's SDPA as its inner attention: torchtitan's language-model
attention backends do not train on a CPU (flex has no CPU backward, varlen needs CUDA, and
``get_attention_config`` refuses "sdpa"), and everything else is torchtitan's model as its registry builds it.
"""

from __future__ import annotations

import json
import os
from types import SimpleNamespace
from typing import Any

import pytest
import torch

if os.environ.get("UMSEARCH_REQUIRE_TORCHTITAN"):  # `make test-torchtitan`: a broken install fails, never skips
    import torchtitan.models.llama3  # noqa: F401
else:
    pytest.importorskip("torchtitan.models.llama3")  # noqa: E402 (imports triton as well)

from tests.runtime.helpers import placed, plan_of  # noqa: E402
from umsearch.core.plan import Plan  # noqa: E402
from umsearch.errors import PlanError  # noqa: E402
from umsearch.runtime.plan_schedule import joined_microbatches  # noqa: E402

LAYERS = 6
NAMES = ["tok_embeddings", *(f"layers.{i}" for i in range(LAYERS)), "norm", "lm_head"]
"""The plan's layers: torchtitan's module names, one per umsearch layer."""
BATCH, SEQ, MICROBATCH = 6, 16, 2
"""torchtitan's local batch and sequence; its trainer's own (equal) microbatch size."""


def titan_llama() -> tuple[Any, torch.nn.Module]:
    """torchtitan's llama3 ``debugmodel`` (SDPA inner attention, module docstring), weights fixed by seed 0."""
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.llama3 import llama3_configs

    config = llama3_configs["debugmodel"](attn_backend="flex")
    for layer in config.layers:
        layer.attention.inner_attention = ScaledDotProductAttention.Config()
    torch.manual_seed(0)
    model = config.build()
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    return config, model


def titan_loss() -> Any:
    from torchtitan.components.loss import CrossEntropyLoss

    return CrossEntropyLoss(CrossEntropyLoss.Config())


def _batch(vocab: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    tokens = torch.randint(0, vocab, (BATCH, SEQ + 1), generator=torch.Generator().manual_seed(4))
    positions = torch.arange(SEQ).expand(BATCH, SEQ).contiguous()
    return tokens[:, :-1], tokens[:, 1:], positions


def _names_per_stage(plan: Plan) -> list[list[str]]:
    return [NAMES[st.lo:st.hi] for st in plan.stages]


def as_is(model: torch.nn.Module, **_: Any) -> torch.nn.Module:
    """A parallelize_fn applying nothing: torchtitan's llama3 one always wraps the parts in FSDP, which
    PlanSchedule does not drive yet (the pipelining_fn refuses such parts)."""
    return model


def titan_worker(rank: int, world: int, plan: Plan, dump: str) -> tuple[dict[str, torch.Tensor], float | None]:
    """Launch target: torchtitan's pipeline set up through :func:`plan_pipelining_fn` as its trainer calls a
    ``pipelining_fn`` (training in float32, no FSDP), then one step as ``Trainer.pp_forward_backward_step``
    takes it."""
    import torchtitan.distributed.parallel_dims as titan_dims
    from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig
    from torchtitan.distributed import ParallelDims

    from umsearch.runtime.torchtitan_pipeline import plan_pipelining_fn

    # torchtitan takes "cuda" where it finds no accelerator (tools/utils.py get_device_info), and its mesh then
    # calls torch.cuda.set_device: the one CPU fix this test makes (it also stops torchtitan's Trainer on a CPU).
    titan_dims.device_type = "cpu"
    config, model = titan_llama()
    dims = ParallelDims(dp_replicate=1, dp_shard=1, cp=1, tp=1, pp=world, ep=1, world_size=world)
    parallelism = ParallelismConfig(pipeline_parallel_degree=world, module_fqns_per_model_part=_names_per_stage(plan))
    schedule, parts, first, last = plan_pipelining_fn(plan)(
        model, parallel_dims=dims, training=TrainingConfig(local_batch_size=BATCH, seq_len=SEQ, mixed_precision_param="float32"),
        parallelism=parallelism, compile_config=CompileConfig(), ac_config=None,
        dump_folder=dump, device=torch.device("cpu"), model_config=config, parallelize_fn=as_is,
        loss_fn=titan_loss())  # fmt: skip
    x, y, positions = _batch(config.vocab_size)
    n = BATCH // MICROBATCH
    rows = [slice(k * MICROBATCH, (k + 1) * MICROBATCH) for k in range(n)]
    losses: list[torch.Tensor] | None = [] if last else None
    schedule.step(arg_mbs=[(x[r],) for r in rows] if first else None,
                  kwarg_mbs=[{"positions": positions[r], "attention_masks": None} for r in rows],
                  target_mbs=[y[r] for r in rows] if last else None, losses=losses,
                  loss_kwargs={"global_valid_tokens": torch.tensor(float(y.numel()))}, return_outputs=False)  # fmt: skip
    # torchtitan's parallelize_fn shards each part with FSDP (over one rank here): whole gradients are the shards.
    grads = {name: _whole(p.grad) for part in parts for name, p in part.named_parameters() if p.grad is not None}
    return grads, float(torch.stack(losses).sum()) if losses is not None else None


def _whole(t: torch.Tensor) -> torch.Tensor:
    full = getattr(t, "full_tensor", None)
    return (full() if full is not None else t).detach().clone()


def _reference() -> tuple[dict[str, torch.Tensor], float]:
    config, model = titan_llama()
    x, y, positions = _batch(config.vocab_size)
    loss, _ = titan_loss()(model(x, positions=positions), y, torch.tensor(float(y.numel())))
    loss.backward()
    return {n: p.grad for n, p in model.named_parameters() if p.grad is not None}, float(loss.detach())


def _plans() -> list[Plan]:
    # Unequal microbatches torchtitan cannot express: embeddings + 3 layers over [2, 4], the rest over [3, 3].
    two = plan_of(BATCH, ((0, 4), [2, 4], None, 2), ((4, 9), [3, 3], None, 1))
    # V-shape, 4 stages (torchtitan places it as for ZBVZeroBubble), microbatches [1, 5] and [3, 3].
    vee = placed(BATCH, [0, 2, 4, 7, 9], [0, 1, 1, 0], [[1, 5], [1, 5], [3, 3], [3, 3]],
                 ["0F0 0F1 3F0 3B0 3F1 3B1 0B0 0B1", "1F0 1F1 2F0 2F1 2B0 1B0 2B1 1B1"])  # fmt: skip
    # Ranks [0, 0, 1, 1]: neither looped nor V, cut stage by stage with torchtitan's _split_module.
    blocks = placed(BATCH, [0, 2, 4, 7, 9], [0, 0, 1, 1], [[2, 4]] * 4,
                    ["0F0 1F0 0F1 1F1 1B0 0B0 1B1 0B1", "2F0 3F0 3B0 2B0 2F1 3F1 3B1 2B1"])  # fmt: skip
    return [two, vee, blocks]


@pytest.mark.slow
@pytest.mark.parametrize("which", [0, 1, 2])
def test_torchtitan_llama3_runs_a_plan_with_single_process_gradients(which: int, tmp_path: Any) -> None:
    from umsearch.runtime.config import LaunchConfig
    from umsearch.runtime.launch import launch

    plan = _plans()[which]
    per_rank = launch(titan_worker, 2, (plan, str(tmp_path)), LaunchConfig(timeout_s=300))
    got = {k: v for grads, _ in per_rank for k, v in grads.items()}
    want, loss = _reference()
    assert sorted(got) == sorted(want)
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-4, atol=1e-6, msg=name)
    (total,) = [t for _, t in per_rank if t is not None]
    assert total == pytest.approx(loss, rel=1e-5)


def test_microbatch_lists_join_into_the_batch_in_order() -> None:
    x = torch.arange(12).reshape(6, 2)
    args, kwargs, target = joined_microbatches([(x[:2],), (x[2:4],), (x[4:],)],
                                               [{"p": x[:2], "flag": True}, {"p": x[2:4], "flag": True},
                                                {"p": x[4:], "flag": True}], [x[:2], x[2:4], x[4:]])  # fmt: skip
    assert torch.equal(args[0], x) and torch.equal(kwargs["p"], x) and kwargs["flag"] is True
    assert torch.equal(target, x)
    with pytest.raises(PlanError, match="'flag' differs between microbatches"):
        joined_microbatches(None, [{"flag": 1}, {"flag": 2}], None)


def test_a_plan_without_module_names_or_of_another_batch_is_refused() -> None:
    from umsearch.runtime.torchtitan_pipeline import plan_pipelining_fn

    plan = _plans()[0]
    fn = plan_pipelining_fn(plan)
    common = {"parallel_dims": None, "compile_config": None, "ac_config": None, "dump_folder": "", "device": None,
              "model_config": None, "parallelize_fn": None, "loss_fn": None}  # fmt: skip
    with pytest.raises(PlanError, match="set \\[parallelism\\] module_fqns_per_model_part"):
        fn(None, training=SimpleNamespace(local_batch_size=BATCH),
           parallelism=SimpleNamespace(module_fqns_per_model_part=None), **common)
    with pytest.raises(PlanError, match=f"local_batch_size = 4 but the plan's batch is {BATCH}"):
        fn(None, training=SimpleNamespace(local_batch_size=4),
           parallelism=SimpleNamespace(module_fqns_per_model_part=_names_per_stage(plan)), **common)


def test_the_exported_recipe_gives_torchtitan_this_pipelining_fn(tmp_path: Any) -> None:
    from umsearch.formats.torchtitan import RECIPE_FILE, plan_schedule_recipe

    plan = _plans()[0]
    (tmp_path / "umsearch_plan.json").write_text(json.dumps(plan.to_json()))
    namespace: dict[str, Any] = {"__file__": str(tmp_path / RECIPE_FILE)}
    exec(compile(plan_schedule_recipe(plan, NAMES, "plan.json"), RECIPE_FILE, "exec"), namespace)
    assert namespace["MODULE_FQNS_PER_MODEL_PART"] == _names_per_stage(plan)
    fn = namespace["pipelining_fn"]()
    with pytest.raises(PlanError, match=f"local_batch_size = 4 but the plan's batch is {BATCH}"):
        fn(None, training=SimpleNamespace(local_batch_size=4), parallelism=SimpleNamespace(),
           parallel_dims=None, compile_config=None, ac_config=None, dump_folder="", device=None,
           model_config=None, parallelize_fn=None, loss_fn=None)  # fmt: skip
