"""Training precision, set the same way where a model is profiled and where a plan runs.

``fp32``: float32 everywhere, TF32 off for matmuls and convolutions. ``tf32``:
float32 weights and activations, matmuls and cuDNN convolutions in TF32 (GPUs
from Ampere on; what PyTorch's cuDNN default does to convolutions anyway).
``bf16`` / ``fp16``: float32 weights under ``torch.autocast`` (activations and
matmuls in the low precision), TF32 off for what autocast leaves in float32;
``fp16`` also scales the loss (:class:`LossScaler`), because its gradients
underflow otherwise.

The TF32 switches are always set explicitly (:func:`apply_switches`) and what
they read back is recorded in the profile: a profile's times depend on them
(fp32 and TF32 matmuls differ 2-3x on an H200), so they are never left to
defaults or to ``TORCH_ALLOW_TF32_CUBLAS_OVERRIDE``.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from umsearch.core.profile import PRECISIONS
from umsearch.errors import ProfilingError

OVERRIDE_ENV = "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE"
"""Environment variable that makes cuBLAS use TF32 whatever the switches say."""

_AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}
_DTYPE_TEXT = {"fp32": "float32", "tf32": "float32 (TF32 matmuls and convolutions)",
               "bf16": "bfloat16 autocast, float32 weights", "fp16": "float16 autocast, float32 weights, loss scaling"}  # fmt: skip


@dataclass(frozen=True)
class Precision:
    """One of :data:`~umsearch.core.profile.PRECISIONS`, and what it means for torch."""

    name: str

    def __post_init__(self) -> None:
        if self.name not in PRECISIONS:
            raise ProfilingError(f"precision {self.name!r} is not one of {', '.join(PRECISIONS)}; e.g. --dtype bf16")

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        """The dtype autocast runs in, None without autocast (fp32, tf32)."""
        return _AUTOCAST.get(self.name)

    @property
    def scales_loss(self) -> bool:
        """Whether backwards start from a scaled loss (fp16)."""
        return self.name == "fp16"

    @property
    def dtype_text(self) -> str:
        """The profile's free-text ``dtype`` for this precision."""
        return _DTYPE_TEXT[self.name]

    def autocast(self, device: torch.device) -> contextlib.AbstractContextManager[Any]:
        """The context a forward runs in: autocast for bf16/fp16, nothing otherwise."""
        dtype = self.autocast_dtype
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device.type, dtype=dtype)


def check_autocast(precision: Precision, device: torch.device) -> None:
    """Raise :class:`ProfilingError` when this torch cannot autocast to ``precision`` on ``device``.

    Some versions only warn and run float32 instead (CPU float16 before torch 2.4); a matmul under
    the autocast tells, so that nothing is measured or trained in another precision than it says.
    """
    dtype = precision.autocast_dtype
    if dtype is None:
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the refusal below says it in one line
        with precision.autocast(device):
            got = (torch.ones(2, 2, device=device) @ torch.ones(2, 2, device=device)).dtype
    if got != dtype:
        other = "bf16" if precision.name == "fp16" else "fp32"
        raise ProfilingError(f"torch {torch.__version__} cannot autocast to {precision.name} on {device.type} (a "
                             f"matmul came out {str(got).removeprefix('torch.')}); use --dtype {other} here")  # fmt: skip


def check_precision(precision: Precision, device: torch.device) -> None:
    """Raise :class:`ProfilingError` when ``precision`` cannot run on ``device`` as asked."""
    check_autocast(precision, device)
    if precision.name == "tf32" and device.type != "cuda":
        raise ProfilingError("--dtype tf32 is a GPU mode (TF32 tensor cores); a CPU has none: use --dtype fp32 "
                             "or bf16 on the CPU")  # fmt: skip
    if precision.name == "fp32" and device.type == "cuda" and os.environ.get(OVERRIDE_ENV, "0") not in ("", "0"):
        raise ProfilingError(f"{OVERRIDE_ENV}={os.environ[OVERRIDE_ENV]} makes cuBLAS use TF32, so --dtype fp32 "
                             f"would measure TF32 matmuls; unset {OVERRIDE_ENV} or use --dtype tf32")  # fmt: skip


def apply_switches(precision: Precision) -> dict[str, Any]:
    """Set the TF32 switches of matmul and cuDNN for ``precision`` (on only for tf32); return what they
    read back, and the override variable, for the record."""
    tf32 = precision.name == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    dtype = precision.autocast_dtype
    return {
        "precision": precision.name,
        "autocast": str(dtype).removeprefix("torch.") if dtype is not None else None,
        "matmul_allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
        "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32),
        "loss_scaling": f"dynamic, initial scale {LossScaler.INITIAL:g}" if precision.scales_loss else None,
        OVERRIDE_ENV: os.environ.get(OVERRIDE_ENV),
    }


class LossScaler:
    """Dynamic loss scaling for fp16, the same decision on every rank of a pipeline.

    Backwards start from ``loss * scale``; at the end of an iteration the
    gradients are divided by ``scale``. When any rank's gradients hold an inf
    or a NaN (the ranks agree through :meth:`found_inf`'s all-reduce), the
    step is skipped and the scale halves; after :attr:`INTERVAL` good steps
    it doubles. This is ``torch.amp.GradScaler``'s rule, with the overflow
    check shared: every stage's gradient depends on the last stage's scale,
    so ranks that decided alone would drift apart.
    """

    INITIAL = 2.0**16
    INTERVAL = 2000

    def __init__(self) -> None:
        self.scale = self.INITIAL
        self._good = 0

    def found_inf(self, params: Iterable[torch.Tensor], device: torch.device) -> bool:
        """Whether any gradient of ``params`` on any rank is not finite (collective when distributed)."""
        grads = [p.grad for p in params if p.grad is not None]
        bad = any(not bool(torch.isfinite(g).all()) for g in grads)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            flag = torch.tensor([float(bad)], device=device)
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
            bad = bool(flag.item() > 0)
        return bad

    def unscale_and_update(self, params: Iterable[torch.Tensor], device: torch.device) -> bool:
        """Divide the gradients by the scale and update it; True when the step may be taken."""
        params = list(params)
        bad = self.found_inf(params, device)
        if bad:
            for p in params:
                p.grad = None
            self.scale /= 2.0
            self._good = 0
            return False
        for p in params:
            if p.grad is not None:
                p.grad.div_(self.scale)
        self._good += 1
        if self._good >= self.INTERVAL:
            self.scale *= 2.0
            self._good = 0
        return True
