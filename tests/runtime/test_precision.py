"""Precision in the runtime: fp16 loss scaling (unscaled gradients, a shared skip on overflow), the TF32
switches set explicitly, and the checks of a precision against its device."""

from __future__ import annotations

import pytest
import torch

from tests.runtime.helpers import plan_of, tiny_model
from umsearch.errors import ProfilingError
from umsearch.nn.precision import (
    OVERRIDE_ENV,
    LossScaler,
    Precision,
    apply_switches,
    check_precision,
)
from umsearch.runtime.executor import StageExecutor
from umsearch.runtime.model_source import stage_module

PLAN = plan_of(8, ((0, 4), [2, 2, 4], None, 3))


class Scale(torch.nn.Module):
    """Multiplies its input: large enough, a float16 matmul after it overflows."""

    def __init__(self, factor: float) -> None:
        super().__init__()
        self.factor = factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.factor


def _run(precision: str, factor: float = 1.0,
         device: str = "cpu") -> tuple[StageExecutor, float | None, dict[str, torch.Tensor]]:  # fmt: skip
    model = tiny_model(4)
    layers = [m.float() for m in model.layers]
    layers[0] = torch.nn.Sequential(Scale(factor), layers[0])
    net = stage_module(type(model)(layers, model.make_batch, model.loss), 0, 4).to(device)
    ex = StageExecutor(PLAN, 0, [net], model.loss, None, precision=precision, device=device)
    x, y = model.make_batch(8, torch.Generator().manual_seed(0))
    stats = ex.run_iteration(x.float(), y.float())
    return ex, stats.loss, {n: p.grad.cpu().clone() for n, p in net.named_parameters() if p.grad is not None}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_low_precision_stages_run_on_the_gpu(precision: str) -> None:
    """Autocast on CUDA (as the profiler ran it): gradients within low-precision reach of fp32's."""
    _, loss, grads = _run(precision, device="cuda")
    _, loss32, grads32 = _run("fp32", device="cuda")
    assert loss == pytest.approx(loss32, rel=3e-2)
    for name in grads32:
        torch.testing.assert_close(grads[name], grads32[name], rtol=5e-2, atol=1e-2, msg=name)


def test_fp16_gradients_come_back_unscaled() -> None:
    ex, loss, grads = _run("fp16")
    _, loss32, grads32 = _run("fp32")
    assert ex.scaler is not None and ex.scaler.scale == LossScaler.INITIAL
    assert loss == pytest.approx(loss32, rel=1e-2)  # the reported loss is not multiplied by the scale
    assert sorted(grads) == sorted(grads32)
    for name in grads32:
        torch.testing.assert_close(grads[name], grads32[name], rtol=5e-2, atol=5e-3, msg=name)


def test_an_fp16_overflow_skips_the_step_and_halves_the_scale() -> None:
    ex, _, grads = _run("fp16", factor=1e6)  # float16 tops out near 65504
    assert ex.scaler is not None and ex.scaler.scale == LossScaler.INITIAL / 2
    assert grads == {}  # dropped: nothing to step on


def test_bf16_needs_no_scaler() -> None:
    ex, loss, _ = _run("bf16")
    assert ex.scaler is None and loss is not None and loss == loss


def test_the_tf32_switches_are_set_for_every_precision() -> None:
    try:
        assert apply_switches(Precision("tf32"))["matmul_allow_tf32"] is True
        assert torch.backends.cudnn.allow_tf32 is True
        record = apply_switches(Precision("bf16"))
        assert (record["matmul_allow_tf32"], record["cudnn_allow_tf32"], record["autocast"]) == (False, False, "bfloat16")
    finally:
        apply_switches(Precision("fp32"))


def test_precisions_a_device_cannot_honour_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ProfilingError, match="--dtype tf32 is a GPU mode"):
        check_precision(Precision("tf32"), torch.device("cpu"))
    monkeypatch.setenv(OVERRIDE_ENV, "1")
    with pytest.raises(ProfilingError, match=f"{OVERRIDE_ENV}=1 makes cuBLAS use TF32"):
        check_precision(Precision("fp32"), torch.device("cuda", 0))
    check_precision(Precision("tf32"), torch.device("cuda", 0))  # what the override does anyway
    with pytest.raises(ProfilingError, match="precision 'fp8' is not one of"):
        Precision("fp8")


def test_an_autocast_this_torch_ignores_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Older torch only warns and stays in float32 (CPU float16): refused, not measured as fp16."""
    import contextlib

    from umsearch.nn.precision import check_autocast

    check_autocast(Precision("bf16"), torch.device("cpu"))
    monkeypatch.setattr(Precision, "autocast", lambda self, device: contextlib.nullcontext())
    with pytest.raises(ProfilingError, match=r"cannot autocast to fp16 on cpu \(a matmul came out float32\); use "
                                             r"--dtype bf16 here"):  # fmt: skip
        check_autocast(Precision("fp16"), torch.device("cpu"))
