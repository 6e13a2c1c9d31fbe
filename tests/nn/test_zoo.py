"""Zoo models hand contiguous tensors between layers: torch's pipelining receives a stage's output
into a buffer with the same strides, and gloo refuses a non-contiguous one (the hybrid model's
transposed tokens did, found by the tune benchmark)."""

from __future__ import annotations

import pytest
import torch

from umsearch.core.model_spec import ModelSpec
from umsearch.nn.models import build_model
from umsearch.nn.zoo import ZOO

SMALL = {"gpt": {"layers": 2, "width": 32, "heads": 2, "seq": 8}, "vgg16": {"image": 32, "width": 4},
         "mlp": {"width": 16, "layers": 2}, "hybrid": {"stem": 2, "blocks": 1, "channels": 8, "width": 16}}  # fmt: skip


@pytest.mark.parametrize("name", sorted(ZOO))
def test_every_layer_output_is_contiguous(name: str) -> None:
    model = build_model(ModelSpec(source=name, args=SMALL[name]))
    x, _ = model.make_batch(2, torch.Generator().manual_seed(0))
    for i, layer in enumerate(model.layers):
        x = layer(x)
        assert x.is_contiguous(), f"{name} layer {i} ({type(layer).__name__}) returns a non-contiguous tensor"
