"""What a layer saves that its neighbour saves too (issue 38 decisions 1 and 2), measured by storage."""

from __future__ import annotations

import torch

from umsearch.core.model_spec import ModelSpec
from umsearch.measure.profiler import run_chain
from umsearch.measure.stash import input_saved_bytes, saved_storages, shared_bytes
from umsearch.nn.models import build_model


def test_a_saved_output_the_next_layer_saves_as_input_is_shared_by_hand() -> None:
    """Tanh saves its output (4 x 8 float32 = 128 bytes); the Linear after it saves that as its input."""
    torch.manual_seed(0)
    first, second = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh()), torch.nn.Linear(8, 8)
    x = torch.randn(4, 8, requires_grad=True)
    out, before = saved_storages(first, x)
    nxt = out.detach().requires_grad_(True)
    _, now = saved_storages(second, nxt)
    assert shared_bytes(before, now) == 128 and input_saved_bytes(now, nxt) == 128
    assert input_saved_bytes(before, x) == 128  # the first Linear saves its input x too


def test_the_chain_pass_measures_the_mlp_s_shared_boundaries_and_none_in_the_gpt() -> None:
    mlp = run_chain(build_model(ModelSpec(source="mlp", args={"layers": 4, "width": 64})), [1, 2], torch.device("cpu"))
    # Every boundary after a Tanh: the Tanh output (64 float32 = 256 bytes per sample) saved on both sides.
    assert mlp.boundary_shared_bytes == (0.0, 256.0, 256.0, 256.0, 256.0)
    assert mlp.input_saved_bytes == (256.0,) * 5 and mlp.out_bytes[:4] == (256.0,) * 4
    gpt = run_chain(build_model(ModelSpec(source="gpt", args={"layers": 2, "width": 32, "heads": 2, "seq": 8,
                                                              "vocab": 64})), [1, 2], torch.device("cpu"))  # fmt: skip
    # A block ends in a residual add (saves nothing) and starts with a LayerNorm's own saves: none shared,
    # and no freed storage whose address came back counts.
    assert gpt.boundary_shared_bytes == (0.0,) * 4
