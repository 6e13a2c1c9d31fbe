"""examples/hf_gpt2.py: a Hugging Face GPT-2 in the (layers, make_batch, loss) protocol, pipelined exactly."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from examples.hf_gpt2 import build  # noqa: E402
from tests.runtime.helpers import peer_plan, placed, run_threaded  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _model(seed: int = 0):  # type: ignore[no-untyped-def]
    torch.manual_seed(seed)
    layers, make_batch, loss = build(layers=2, width=32, heads=2, seq=8, vocab=64)

    class Built:
        pass

    m = Built()
    m.layers, m.make_batch, m.loss = layers, make_batch, loss  # type: ignore[attr-defined]
    return m


def _reference(model, batch: int, seed: int) -> dict[str, torch.Tensor]:  # type: ignore[no-untyped-def]
    net = torch.nn.Sequential(*model.layers)
    x, y = model.make_batch(batch, torch.Generator().manual_seed(seed))
    net.zero_grad()
    model.loss(net(x), y).backward()
    return {n: p.grad.detach().clone() for n, p in net.named_parameters() if p.grad is not None}


def test_the_layers_compute_the_hugging_face_models_logits() -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    model = _model()
    x, _ = model.make_batch(3, torch.Generator().manual_seed(1))
    torch.manual_seed(0)
    hf = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, n_positions=8, vocab_size=64, resid_pdrop=0.0,
                                    embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0))  # fmt: skip
    with torch.no_grad():
        ours = torch.nn.Sequential(*model.layers)(x)
        torch.testing.assert_close(ours, hf(x).logits, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("plan", [
    peer_plan("ZBVZeroBubble", 2, 2, 4, batch=8, layers=4),
    peer_plan("Interleaved1F1B", 2, 2, 4, batch=8, layers=4),
    placed(8, [0, 2, 4], [0, 1], [[2, 6], [4, 4]], ["0F0 0F1 0I0 0I1 0W0 0W1", "1F0 1I0 1F1 1I1 1W1 1W0"]),
])  # fmt: skip
def test_pipelined_gradients_equal_the_single_process_ones(plan) -> None:  # type: ignore[no-untyped-def]
    grads, _, _ = run_threaded(plan, _model(), batch_seed=3)
    want = _reference(_model(), plan.global_batch, 3)
    assert sorted(grads) == sorted(want)
    for name, g in want.items():
        torch.testing.assert_close(grads[name], g, rtol=1e-5, atol=1e-6, msg=name)


def _docstring_commands() -> list[str]:
    """The ``umsearch`` lines of the example's docstring, exactly as written."""
    import examples.hf_gpt2

    doc = examples.hf_gpt2.__doc__ or ""
    return [line.strip() for line in doc.splitlines() if line.startswith("    umsearch ")]


@pytest.mark.slow
def test_the_docstrings_commands_run_as_written(tmp_path: Path) -> None:
    """Profile, search, run and validate, one line after the other, in bash, with the installed ``umsearch``
    console script (which puts no folder on the path), from a folder holding ``examples/`` as the
    repository root does and on no path: each exits 0."""
    import os
    import shutil

    shutil.copytree(ROOT / "examples", tmp_path / "examples", ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    lines = _docstring_commands()
    assert [line.split()[1] for line in lines] == ["profile", "search", "run", "validate"]
    for line in lines:
        done = subprocess.run(["bash", "-c", line], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=600, check=False)  # fmt: skip
        assert done.returncode == 0, f"{line}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
        assert "Traceback" not in done.stderr, line
    blocks = int(lines[0].split("--arg layers=")[1].split()[0])
    profile = json.loads((tmp_path / "runs" / "gpt2" / "profile.json").read_text())
    assert len(profile["layers"]) == blocks + 2  # embeddings, the blocks, the head
