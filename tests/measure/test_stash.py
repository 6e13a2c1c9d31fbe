"""What a layer saves that its neighbour saves too, of its input, and past its ``I`` (issue 38 decisions 1-3),
measured by storage."""

from __future__ import annotations

import torch

from umsearch.core.model_spec import ModelSpec
from umsearch.measure.profiler import run_chain
from umsearch.measure.stash import (
    input_saved_bytes,
    saved_storages,
    shared_bytes,
    weight_saved_bytes,
)
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


def test_what_i_leaves_for_w_by_hand() -> None:
    """Linear+Tanh on 4 x 8 float32: the Linear saves its input (128 B, which W needs), Tanh its output (128 B,
    which only I needs): after I the graph holds the input alone. With an input that needs no gradient, I
    does nothing and everything stays for W."""
    torch.manual_seed(0)
    layer = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh())
    x = torch.randn(4, 8)
    assert weight_saved_bytes(layer, x.requires_grad_(True)) == 128
    assert weight_saved_bytes(layer, torch.randn(4, 8)) == 256
    # With a loss on top (the last layer): the loss's own saves are freed by I as well.
    target = torch.randint(0, 8, (4,))
    assert weight_saved_bytes(layer, x, lambda o: torch.nn.functional.cross_entropy(o, target)) == 128


def test_the_chain_pass_measures_what_each_mlp_layer_keeps_for_w() -> None:
    mlp = run_chain(build_model(ModelSpec(source="mlp", args={"layers": 4, "width": 64})), [1, 2], torch.device("cpu"))
    # Inner layers keep their Linear's input (256 B per sample) and free their Tanh's output; the first
    # layer's input needs no gradient, so it frees nothing.
    assert mlp.weight_stash_bytes[0] == mlp.stash_bytes[0]
    assert mlp.weight_stash_bytes[1:4] == (256.0,) * 3 and mlp.stash_bytes[1:4] == (512.0,) * 3
