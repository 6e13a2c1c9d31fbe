"""What a layer saves per microbatch whatever its size, and the weights layers share, as the profiler measures them
(docs/model.md 5, version 2.3: ``stash_fixed_bytes``, ``tied_weights``)."""

from __future__ import annotations

import pytest
import torch

from umsearch.core.model_spec import ModelSpec
from umsearch.core.profile import TiedWeight
from umsearch.measure.profiler import run_chain, tied_weights
from umsearch.measure.stash import fixed_and_per_sample, saved_bytes
from umsearch.nn.models import build_model


class _Scaled(torch.nn.Module):
    """A Linear (saves its input: 32 bytes per sample) times a constant made on each call (saved by the
    multiplication: 32 bytes per microbatch, whatever its size)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) * torch.full((8,), 2.0)


def test_a_constant_saved_per_call_is_the_fixed_part_by_hand() -> None:
    torch.manual_seed(0)
    layer, sizes = _Scaled(), (1, 2, 4)
    saved = [float(saved_bytes(layer, torch.randn(b, 8, requires_grad=True))[1]) for b in sizes]
    assert saved == [64.0, 96.0, 160.0]
    assert fixed_and_per_sample(sizes, saved) == (32.0, 32.0)


@pytest.mark.parametrize(("sizes", "saved", "fit"), [
    ((1, 2, 4), (10.0, 20.0, 40.0), (0.0, 10.0)),  # all per sample: as before the field
    ((1, 3, 8), (7.0, 11.0, 21.0), (5.0, 2.0)),  # the line through the two largest sizes
    ((1, 2), (9.0, 20.0), (0.0, 10.0)),  # a negative intercept is no fixed part
    ((1, 2), (30.0, 20.0), (20.0, 0.0)),  # saves less at a larger size: at most what it saved
])  # fmt: skip
def test_the_fit_gives_the_largest_size_exactly(sizes: tuple[int, ...], saved: tuple[float, ...],
                                                fit: tuple[float, float]) -> None:  # fmt: skip
    fixed, per_sample = fixed_and_per_sample(sizes, saved)
    assert (fixed, per_sample) == fit
    assert fixed + per_sample * sizes[-1] == saved[-1]


def test_the_chain_pass_finds_the_zoo_gpt_s_masks_and_the_mlp_s_loss_scalar() -> None:
    """The gpt's blocks save their causal mask (8 x 8 float32) once per microbatch: the same fixed part from
    sizes 1-2 as from 2-4, and the profile's per-sample stash less than the largest size's saves per sample."""
    gpt = build_model(ModelSpec(source="gpt", args={"layers": 2, "width": 32, "heads": 2, "seq": 8, "vocab": 64}))
    small, large = (run_chain(gpt, sizes, torch.device("cpu")) for sizes in ([1, 2], [1, 2, 4]))
    assert small.stash_fixed_bytes[1:3] == large.stash_fixed_bytes[1:3] == (8 * 8 * 4.0,) * 2
    assert large.stash_sample_bytes[1] + large.stash_fixed_bytes[1] / 4 == large.stash_bytes[1]
    mlp = run_chain(build_model(ModelSpec(source="mlp", args={"layers": 4, "width": 64})), [1, 2], torch.device("cpu"))
    # Only the last layer's loss saves a float32 scalar per microbatch.
    assert mlp.stash_fixed_bytes == (0.0,) * 4 + (4.0,) and mlp.stash_sample_bytes[:4] == mlp.stash_bytes[:4]


def test_gpt2_s_tied_embedding_and_head_are_one_weight_of_two_layers() -> None:
    pytest.importorskip("transformers")
    built = build_model(ModelSpec(source="hf:gpt2", args={"n_layer": 2, "n_embd": 16, "n_head": 2, "n_positions": 16,
                                                         "vocab_size": 50, "seq": 8}))  # fmt: skip
    last = len(built.layers) - 1
    assert tied_weights(built) == (TiedWeight(layers=(0, last), bytes=50 * 16 * 4.0),)
    assert tied_weights(build_model(ModelSpec(source="mlp", args={"layers": 2, "width": 8}))) == ()
