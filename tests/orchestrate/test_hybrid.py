"""The two-regime zoo model (a convolutional stem feeding transformer blocks): per-sample, so microbatches
sum to the full-batch gradient, which every pipeline plan relies on."""

from __future__ import annotations

import torch

from umsearch.nn.zoo import build_zoo


def test_microbatch_gradients_sum_to_the_full_batch_gradient() -> None:
    torch.manual_seed(0)
    model = build_zoo("hybrid", {"stem": 2, "blocks": 2, "image": 8, "channels": 4, "width": 16, "heads": 2})
    assert model.names == ["conv0", "conv1+pool", "tokens", "block0", "block1", "head"]
    net = torch.nn.Sequential(*model.layers)
    x, y = model.make_batch(6, torch.Generator().manual_seed(1))

    def grads(parts: list[tuple[int, int]]) -> list[torch.Tensor]:
        net.zero_grad()
        for lo, hi in parts:
            (model.loss(net(x[lo:hi]), y[lo:hi]) * (hi - lo) / 6).backward()
        return [p.grad.clone() for p in net.parameters() if p.grad is not None]

    for a, b in zip(grads([(0, 6)]), grads([(0, 1), (1, 4), (4, 6)]), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
