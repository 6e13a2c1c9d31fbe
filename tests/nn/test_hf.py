"""``hf:NAME``: a Hugging Face causal LM from its config, split into embeddings, decoder layers and head.

The split computes what the whole model computes (logits equal to the model's own forward), stays causal,
keeps a sliding window, and refuses a model of another shape in one line naming what is missing. The
2-process tests run each family's plan through PlanSchedule to single-process gradients, tied
embeddings kept tied (tests/runtime/test_tied.py holds the tie to one process in depth).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")

from tests.runtime.helpers import plan_of  # noqa: E402
from umsearch.core.model_spec import ModelSpec  # noqa: E402
from umsearch.core.plan import Plan  # noqa: E402
from umsearch.errors import ModelSpecError  # noqa: E402
from umsearch.nn.hf import _config, _split  # noqa: E402
from umsearch.nn.models import build_model  # noqa: E402
from umsearch.nn.spec import BuiltModel  # noqa: E402
from umsearch.nn.tied import tied_layers  # noqa: E402

TINY = {"num_hidden_layers": 2, "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 97, "seq": 12}  # fmt: skip
FAMILIES: dict[str, dict[str, Any]] = {
    "llama": TINY,
    "mistral": TINY,
    "qwen2": TINY,
    "qwen3": {**TINY, "head_dim": 8},
    "gemma": {**TINY, "num_key_value_heads": 1, "head_dim": 8},
    "phi3": TINY,
    "gpt2": {"n_layer": 2, "n_embd": 32, "n_head": 4, "n_positions": 32, "vocab_size": 97, "seq": 12},
}
"""Each family at a tiny size (GPT-2 names its fields its own way)."""
TIED = {"gemma", "gpt2"}


def _model_and_split(name: str, args: dict[str, Any]) -> tuple[torch.nn.Module, BuiltModel]:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    overrides = {k: v for k, v in args.items() if k != "seq"}
    config, _ = _config(name, overrides)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    return model, _split(f"hf:{name}", model, config, args["seq"])


def _forward(built: BuiltModel, ids: torch.Tensor) -> torch.Tensor:
    x = ids
    for layer in built.layers:
        x = layer(x)
    return x


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_the_split_computes_what_the_whole_model_computes_and_stays_causal(name: str) -> None:
    model, built = _model_and_split(name, FAMILIES[name])
    assert len(built.layers) == 4 and len(built.names) == 4
    ids, _ = built.make_batch(3, torch.Generator().manual_seed(1))
    mine = _forward(built, ids)
    torch.testing.assert_close(mine, model(input_ids=ids).logits)
    later = ids.clone()
    later[:, 6:] = (later[:, 6:] + 1) % 97  # change every token from position 6 on
    torch.testing.assert_close(_forward(built, later)[:, :6], mine[:, :6])
    assert not torch.allclose(_forward(built, later)[:, 6:], mine[:, 6:])


def test_a_sliding_window_shorter_than_the_sequence_is_kept() -> None:
    args = {**TINY, "sliding_window": 4}
    model, built = _model_and_split("mistral", args)
    ids, _ = built.make_batch(2, torch.Generator().manual_seed(2))
    torch.testing.assert_close(_forward(built, ids), model(input_ids=ids).logits)
    early = ids.clone()
    early[:, 0] = (early[:, 0] + 1) % 97  # position 11 no longer sees position 0 (window 4)
    torch.testing.assert_close(_forward(built, early)[:, 8:], _forward(built, ids)[:, 8:])


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_build_model_takes_hf_specs_from_files_and_keeps_ties(name: str) -> None:
    spec = ModelSpec.from_json({"source": f"hf:{name}", "args": FAMILIES[name]}, "the plan's model")
    assert spec.trusted and spec.is_hf  # transformers' own classes: no code of the file's choosing
    built = build_model(spec, seed=3)
    again = build_model(spec, seed=3)
    for a, b in zip(built.layers, again.layers, strict=True):
        for (n, p), (_, q) in zip(a.named_parameters(), b.named_parameters(), strict=True):
            assert torch.equal(p, q), n  # the seed fixes the weights
    assert not built.notes
    shared = {id(p) for p in built.layers[0].parameters()} & {id(p) for p in built.layers[-1].parameters()}
    assert bool(shared) == (name in TIED)  # embeddings and head hold one parameter, marked with both layers
    assert [tied_layers(p) for p in built.layers[-1].parameters() if id(p) in shared] == [(0, 3)] * len(shared)
    x, y = built.make_batch(4, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (4, 12) and torch.equal(x[:, 1:], y[:, :-1])


@pytest.mark.parametrize(("source", "args", "message"), [
    ("hf:bert", {"num_hidden_layers": 1}, "does not have the shape of a causal LM that umsearch splits: no "
                                          "decoder layer list, final norm"),
    ("hf:no-such-type", {}, "give a model type transformers knows"),
    ("hf:llama", {"no_such_field": 1}, "has no config field 'no_such_field'"),
    ("hf:llama", {"seq": 0}, "seq=0 must be an integer from 1"),
    ("hf:./nowhere", {}, "the folder has no config.json"),
])  # fmt: skip
def test_a_model_of_another_shape_is_refused_in_one_line(source: str, args: dict[str, Any], message: str) -> None:
    with pytest.raises(ModelSpecError, match=message) as info:
        build_model(ModelSpec(source=source, args={**args}), seed=0)
    assert "\n" not in str(info.value)


def test_a_model_too_large_for_the_memory_here_is_refused_before_any_weight_is_made(
        monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    import umsearch.nn.hf as hf

    monkeypatch.setattr(hf, "_available_bytes", lambda: 100_000.0)
    with pytest.raises(ModelSpecError, match=r"hf:llama has 0.00 billion parameters .* give smaller sizes"):
        build_model(ModelSpec(source="hf:llama", args=TINY), seed=0)


def test_config_aliases_are_fields_too() -> None:
    built = build_model(ModelSpec(source="hf:gpt2", args={"num_hidden_layers": 1, "hidden_size": 16, "n_head": 2,
                                                          "vocab_size": 50, "seq": 4}), seed=0)  # fmt: skip
    assert len(built.layers) == 3


def test_a_local_folder_with_a_config_is_a_model(tmp_path: Path) -> None:
    from transformers import LlamaConfig

    fields: dict[str, Any] = {k: v for k, v in TINY.items() if k != "seq"}
    LlamaConfig(**fields).save_pretrained(tmp_path)
    built = build_model(ModelSpec(source=f"hf:{tmp_path}", args={"seq": 5}), seed=0)
    assert len(built.layers) == 4 and _forward(built, built.make_batch(2, torch.Generator())[0]).shape == (2, 5, 97)


# ------------------------------------------------------------------------------------------------ 2 processes
HF_SEED = 5


def _built64(name: str) -> BuiltModel:
    built = build_model(ModelSpec(source=f"hf:{name}", args=FAMILIES[name]), seed=0)
    return BuiltModel([m.double() for m in built.layers], built.names, built.make_batch, built.loss)


def hf_schedule_worker(rank: int, world: int, name: str, plan: Plan) -> dict[str, torch.Tensor]:
    """Launch target: this rank's gradients of one PlanSchedule step of the family's model."""
    from torch.distributed.pipelining import PipelineStage

    from umsearch.pipelining import PlanSchedule
    from umsearch.runtime.model_source import stage_module

    model = _built64(name)
    mine = plan.stages_of(rank)
    mods = [stage_module(model, plan.stages[j].lo, plan.stages[j].hi) for j in mine]
    stages = [PipelineStage(m, j, plan.num_stages, torch.device("cpu")) for j, m in zip(mine, mods, strict=True)]
    x, y = model.make_batch(plan.global_batch, torch.Generator().manual_seed(HF_SEED))
    sched = PlanSchedule(stages, plan, model.loss)
    sched.step(*((x,) if 0 in mine else ()), target=y if plan.num_stages - 1 in mine else None)
    return {n: p.grad.clone() for m in mods for n, p in m.named_parameters(remove_duplicate=False)
            if p.grad is not None}  # fmt: skip


def _plan() -> Plan:
    # Two ranks, unequal lists: stage 0 (embeddings, layer 1) 1F1B over [2, 4], stage 1 (layer 2, head) [3, 3].
    return plan_of(6, ((0, 2), [2, 4], None, 2), ((2, 4), [3, 3], None, 1))


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_a_plan_through_plan_schedule_gives_single_process_gradients(name: str) -> None:
    from umsearch.runtime.config import LaunchConfig
    from umsearch.runtime.launch import launch

    plan = _plan()
    per_rank = launch(hf_schedule_worker, 2, (name, plan), LaunchConfig(timeout_s=120))
    got = {k: v for r in per_rank for k, v in r.items()}
    model = _built64(name)
    net = torch.nn.Sequential(*model.layers)
    x, y = model.make_batch(plan.global_batch, torch.Generator().manual_seed(HF_SEED))
    model.loss(net(x), y).backward()
    want = {n: p.grad for n, p in net.named_parameters(remove_duplicate=False) if p.grad is not None}
    assert sorted(got) == sorted(want)
    for n in want:
        # Gemma's RMSNorm computes in float32 whatever the model's dtype: there, batch splits show at 1e-7.
        rtol, atol = (1e-5, 1e-8) if name == "gemma" else (1e-9, 1e-12)
        torch.testing.assert_close(got[n], want[n], rtol=rtol, atol=atol, msg=n)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_profile_and_search_an_hf_model_on_two_ranks(name: str, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    import json

    from tests.cli.helpers import run_cli

    args = [a for k, v in FAMILIES[name].items() for a in ("--arg", f"{k}={v}")]
    profile = tmp_path / "p.json"
    code, _, err = run_cli(capsys, "profile", f"hf:{name}", *args, "--sizes", "1,2", "--repeats", "2",
                           "--link-latency-ms", "0.1", "--link-bandwidth-gbps", "5", "--out", str(profile))  # fmt: skip
    assert code == 0, err
    assert "untied" not in err
    code, out, err = run_cli(capsys, "search", "--profile", str(profile), "--ranks", "2", "--batch", "8",
                             "--generations", "2", "--out", str(tmp_path / "s"), "--json")  # fmt: skip
    assert code == 0, err
    plan = json.loads((tmp_path / "s" / "plan.json").read_text())
    assert plan["model"]["source"] == f"hf:{name}" and json.loads(out)["iteration_ms"] > 0
