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

from umsearch.errors import ProfilingError
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


class Tokens(nn.Module):
    """Feature map ``(b, c, h, w)`` -> ``(b, h * w, width)`` tokens (a 1x1 convolution) with learned positions."""

    def __init__(self, channels: int, width: int, tokens: int) -> None:
        super().__init__()
        self.proj = nn.Conv2d(channels, width, 1)
        self.pos = nn.Parameter(torch.randn(tokens, width) * 0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Contiguous tokens: torch's pipelining receives a stage's output into a buffer of the same
        # strides, and gloo refuses a transposed one.
        return self.proj(x).flatten(2).transpose(1, 2).contiguous() + self.pos


class EncoderBlock(Block):
    """Pre-norm transformer block attending over every token (no causal mask)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class PoolHead(nn.Module):
    def __init__(self, width: int, classes: int) -> None:
        super().__init__()
        self.ln, self.out = nn.LayerNorm(width), nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.ln(x).mean(dim=1))


def hybrid(stem: int = 4, blocks: int = 4, image: int = 32, channels: int = 32, width: int = 128, heads: int = 4,
           classes: int = 10) -> BuiltModel:  # fmt: skip
    """Two regimes of layers: a convolutional stem (3x3 conv + ReLU at full resolution, a 2x2 pool fused
    into every second one) feeding transformer encoder blocks over the stem's pixels as tokens."""
    mods: list[nn.Module] = []
    names: list[str] = []
    c_in, side = 3, image
    for i in range(stem):
        layer: list[nn.Module] = [nn.Conv2d(c_in, channels, 3, padding=1), nn.ReLU()]
        if i % 2 == 1 and side % 2 == 0 and side > 4:
            layer.append(nn.MaxPool2d(2))
            side //= 2
        mods.append(nn.Sequential(*layer))
        names.append(f"conv{i}" + ("+pool" if len(layer) == 3 else ""))
        c_in = channels
    mods.append(Tokens(c_in, width, side * side))
    names.append("tokens")
    mods += [EncoderBlock(width, heads, side * side) for _ in range(blocks)]
    names += [f"block{i}" for i in range(blocks)]
    mods.append(PoolHead(width, classes))
    names.append("head")

    def batch(b: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(b, 3, image, image, generator=g), torch.randint(0, classes, (b,), generator=g)

    return BuiltModel(mods, names, batch, nn.functional.cross_entropy)


ZOO: dict[str, Callable[..., BuiltModel]] = {"gpt": gpt, "vgg16": vgg16, "mlp": mlp, "hybrid": hybrid}

_DEFAULTS: dict[str, dict[str, Any]] = {
    name: {k: p.default for k, p in inspect.signature(f).parameters.items()} for name, f in ZOO.items()
}


LIMITS: dict[str, dict[str, tuple[int, int]]] = {
    "gpt": {"layers": (1, 10_000), "width": (1, 65_536), "heads": (1, 1024), "seq": (1, 1_048_576),
            "vocab": (2, 10_000_000)},
    "vgg16": {"image": (32, 8192), "classes": (2, 1_000_000), "width": (1, 4096)},
    "mlp": {"layers": (1, 10_000), "width": (1, 1_048_576), "inputs": (1, 1_048_576), "classes": (2, 1_000_000)},
    "hybrid": {"stem": (1, 64), "blocks": (1, 10_000), "image": (4, 8192), "channels": (1, 65_536),
               "width": (1, 65_536), "heads": (1, 1024), "classes": (2, 1_000_000)},
}  # fmt: skip
"""Smallest and largest value of every zoo argument (all integers)."""


def check_zoo_args(name: str, args: dict[str, Any]) -> None:
    """Raise :class:`ProfilingError` for a zoo argument that is not an integer in its range, or that
    does not fit the others (heads dividing width; a VGG image a multiple of 32)."""
    for key, value in args.items():
        if key not in LIMITS[name]:
            continue  # an unknown name is the builder's TypeError, reported below with the accepted ones
        lo, hi = LIMITS[name][key]
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise ProfilingError(f"zoo model {name}: --arg {key}={value!r} must be an integer from {lo} to {hi}, "
                                 f"e.g. --arg {key}={max(lo, min(hi, _DEFAULTS[name][key]))}")  # fmt: skip
    if name in ("gpt", "hybrid"):
        width, heads = args.get("width", 128), args.get("heads", 4)
        if width % heads:
            raise ProfilingError(f"zoo model {name}: heads={heads} must divide width={width} (each head gets width / "
                                 f"heads channels), e.g. --arg heads={_divisor(width, heads)}")  # fmt: skip
    if name == "vgg16" and args.get("image", 32) % 32:
        image = args["image"]
        raise ProfilingError(f"zoo model vgg16: image={image} must be a multiple of 32 (five 2x2 poolings), "
                             f"e.g. --arg image={max(32, image // 32 * 32)}")  # fmt: skip


def _divisor(width: int, heads: int) -> int:
    return max(d for d in range(1, min(width, heads) + 1) if width % d == 0)


def build_zoo(name: str, args: dict[str, Any]) -> BuiltModel:
    """Build a zoo model, naming unknown models and arguments and refusing values outside their range."""
    if name not in ZOO:
        raise ProfilingError(f"unknown model {name!r}; zoo models: {', '.join(ZOO)}, or give package.module:function")
    check_zoo_args(name, args)
    try:
        return ZOO[name](**args)
    except TypeError as exc:
        accepted = ", ".join(inspect.signature(ZOO[name]).parameters)
        raise ProfilingError(f"bad argument for zoo model {name}: {exc}; it takes {accepted}") from None
