"""Per-sample shapes of the tensors that cross a stage boundary, and their one-off header.

Every message is one forward microbatch of the sender, so its shape is
``(n, *sample_shape)`` with ``n`` known to both sides from the plan. Only the
per-sample shape and the dtype have to travel, once: on the first iteration
each stage learns its input's sample shape (stage 0 from its inputs, the others
from a header), runs a one-sample probe of its layers to learn its output's,
and sends that to the next stage as a fixed-size int64 header. Gradients have
the shape and dtype of the activation they belong to, so they need no header.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from umsearch.errors import RuntimeExecutionError

HEADER_LEN = 16
"""int64 words in a header: dtype code, number of dims, then up to 14 dims."""

_DTYPES: tuple[torch.dtype, ...] = (
    torch.float32, torch.float64, torch.float16, torch.bfloat16,
    torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool,
)  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class SampleShape:
    """Shape and dtype of one sample of a boundary tensor."""

    dims: tuple[int, ...]
    """Shape without the leading sample dimension."""
    dtype: torch.dtype
    """Element type."""

    def batch(self, n: int) -> tuple[int, ...]:
        """Full shape of a tensor holding ``n`` samples."""
        return (n, *self.dims)

    def empty(self, n: int, device: torch.device) -> torch.Tensor:
        """An uninitialised buffer for ``n`` samples."""
        return torch.empty(self.batch(n), dtype=self.dtype, device=device)


def of_tensor(t: torch.Tensor, where: str) -> SampleShape:
    """The sample shape of a batch-first tensor; ``where`` names it in errors."""
    if not isinstance(t, torch.Tensor):
        raise RuntimeExecutionError(
            f"{where} is a {type(t).__name__}, not a tensor; a stage boundary must carry one tensor "
            "with samples on dim 0 (wrap the layer so it returns one tensor, or move the cut)"
        )
    if t.dim() == 0:
        raise RuntimeExecutionError(f"{where} is a scalar; it needs samples on dim 0")
    if t.dtype not in _DTYPES:
        raise RuntimeExecutionError(f"{where} has dtype {t.dtype}, which the runtime cannot send")
    if t.dim() - 1 > HEADER_LEN - 2:
        raise RuntimeExecutionError(f"{where} has {t.dim()} dims; at most {HEADER_LEN - 1} are supported")
    return SampleShape(dims=tuple(t.shape[1:]), dtype=t.dtype)


def encode(shape: SampleShape) -> torch.Tensor:
    """The fixed-size int64 header describing ``shape``."""
    words = [_DTYPES.index(shape.dtype), len(shape.dims), *shape.dims]
    return torch.tensor(words + [0] * (HEADER_LEN - len(words)), dtype=torch.int64)


def decode(header: torch.Tensor) -> SampleShape:
    """Inverse of :func:`encode`."""
    words = [int(v) for v in header.cpu().tolist()]
    code, ndim = words[0], words[1]
    if not 0 <= code < len(_DTYPES) or not 0 <= ndim <= HEADER_LEN - 2:
        raise RuntimeExecutionError(
            f"corrupt shape header {words}: the neighbouring stage runs a different umsearch or plan"
        )
    return SampleShape(dims=tuple(words[2 : 2 + ndim]), dtype=_DTYPES[code])


def probe(module: torch.nn.Module, sample: torch.Tensor, where: str, kwargs: dict[str, Any] | None = None) -> SampleShape:
    """Sample shape of ``module``'s output on a one-sample input (``kwargs``: its keyword inputs, one sample's).

    Runs in eval mode without autograd so that it neither records a graph nor
    touches running statistics; the module's mode is restored afterwards.
    """
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad():
            out = module(sample, **(kwargs or {}))
    finally:
        module.train(was_training)
    shape = of_tensor(out, where)
    if out.shape[0] != sample.shape[0]:
        raise RuntimeExecutionError(
            f"{where} has {out.shape[0]} rows for {sample.shape[0]} input sample(s); layers must keep "
            "samples on dim 0"
        )
    return shape
