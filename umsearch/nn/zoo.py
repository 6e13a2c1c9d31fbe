"""Zoo models in plain torch (no torchvision), no dropout and no batch norm.

Every op is per-sample, so splitting a batch into microbatches and summing the
weighted losses gives exactly the full-batch gradient.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from umsearch.core.errors import ProfilingError
from umsearch.nn.spec import BuiltModel


class Embedding(nn.Module):
    """Token plus learned position embedding."""

    def __init__(self, vocab: int, width: int, seq: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Parameter(torch.randn(seq, width) * 0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tok(x) + self.pos[: x.shape[1]]


class Block(nn.Module):
    """Pre-norm causal decoder block."""

    def __init__(self, width: int, heads: int, seq: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
        self.mask: torch.Tensor
        self.register_buffer("mask", torch.triu(torch.ones(seq, seq, dtype=torch.bool), 1), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        n = x.shape[1]
        x = x + self.attn(h, h, h, attn_mask=self.mask[:n, :n], need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class Head(nn.Module):
    def __init__(self, width: int, vocab: int) -> None:
        super().__init__()
        self.ln, self.out = nn.LayerNorm(width), nn.Linear(width, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.ln(x))


def _token_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


def gpt(layers: int = 14, width: int = 128, heads: int = 4, seq: int = 64, vocab: int = 512) -> BuiltModel:
    """GPT-style decoder: embedding, ``layers`` blocks, head (the paper's GPT1-14 by default)."""
    mods: list[nn.Module] = [Embedding(vocab, width, seq), *[Block(width, heads, seq) for _ in range(layers)], Head(width, vocab)]
    names = ["embedding", *[f"block{i}" for i in range(layers)], "head"]

    def batch(b: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randint(0, vocab, (b, seq + 1), generator=g)
        return x[:, :-1], x[:, 1:]

    return BuiltModel(mods, names, batch, _token_loss)


def vgg16(image: int = 32, classes: int = 10, width: int = 16) -> BuiltModel:
    """VGG16: 13 conv+ReLU layers (pools fused into the layer before), 3 classifier layers."""
    plan: list[int | str] = [1, 1, "M", 2, 2, "M", 4, 4, 4, "M", 8, 8, 8, "M", 8, 8, 8, "M"]
    mods: list[nn.Sequential] = []
    names: list[str] = []
    c_in = 3
    for v in plan:
        if isinstance(v, str):  # "M": pool fused into the previous layer
            mods[-1] = nn.Sequential(*mods[-1], nn.MaxPool2d(2))
            names[-1] += "+pool"
            continue
        c_out = v * width
        mods.append(nn.Sequential(nn.Conv2d(c_in, c_out, 3, padding=1), nn.ReLU()))
        names.append(f"conv{len(names)}")
        c_in = c_out
    side = image // 32
    feat = c_in * side * side
    mods += [nn.Sequential(nn.Flatten(), nn.Linear(feat, 32 * width), nn.ReLU()),
             nn.Sequential(nn.Linear(32 * width, 32 * width), nn.ReLU()), nn.Sequential(nn.Linear(32 * width, classes))]  # fmt: skip
    names += ["fc1", "fc2", "fc3"]

    def batch(b: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(b, 3, image, image, generator=g), torch.randint(0, classes, (b,), generator=g)

    return BuiltModel(list(mods), names, batch, nn.functional.cross_entropy)


def mlp(layers: int = 8, width: int = 256, inputs: int = 64, classes: int = 10) -> BuiltModel:
    """A stack of Linear+Tanh layers and a classifier."""
    dims = [inputs] + [width] * layers
    mods: list[nn.Module] = [nn.Sequential(nn.Linear(a, b), nn.Tanh()) for a, b in zip(dims, dims[1:], strict=False)]
    mods.append(nn.Linear(width, classes))
    names = [f"linear{i}" for i in range(layers)] + ["classifier"]

    def batch(b: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(b, inputs, generator=g), torch.randint(0, classes, (b,), generator=g)

    return BuiltModel(mods, names, batch, nn.functional.cross_entropy)


ZOO: dict[str, Callable[..., BuiltModel]] = {"gpt": gpt, "vgg16": vgg16, "mlp": mlp}


def build_zoo(name: str, args: dict[str, Any]) -> BuiltModel:
    """Build a zoo model, naming unknown models and arguments."""
    if name not in ZOO:
        raise ProfilingError(f"unknown model {name!r}; zoo models: {', '.join(ZOO)}, or give package.module:function")
    try:
        return ZOO[name](**args)
    except TypeError as exc:
        accepted = ", ".join(inspect.signature(ZOO[name]).parameters)
        raise ProfilingError(f"bad argument for zoo model {name}: {exc}; it takes {accepted}") from None
