"""The shape header and the one-sample probe."""

from __future__ import annotations

import pytest
import torch

from umsearch.errors import RuntimeExecutionError
from umsearch.runtime.shapes import HEADER_LEN, SampleShape, decode, encode, of_tensor, probe


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.int64])
def test_header_round_trip(dtype: torch.dtype) -> None:
    shape = SampleShape(dims=(3, 64, 128), dtype=dtype)
    header = encode(shape)
    assert header.shape == (HEADER_LEN,) and header.dtype == torch.int64
    assert decode(header) == shape


def test_corrupt_header_is_refused() -> None:
    with pytest.raises(RuntimeExecutionError, match="corrupt shape header"):
        decode(torch.full((HEADER_LEN,), 99, dtype=torch.int64))


def test_probe_keeps_mode_and_records_no_graph() -> None:
    norm = torch.nn.BatchNorm1d(7)
    net = torch.nn.Sequential(torch.nn.Linear(4, 7), norm)
    assert norm.running_mean is not None
    before = norm.running_mean.clone()
    shape = probe(net, torch.randn(1, 4), "test layer")
    assert shape == SampleShape(dims=(7,), dtype=torch.float32)
    assert net.training  # restored
    assert torch.equal(norm.running_mean, before)  # eval mode: statistics untouched


class _Pair(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x, x


def test_non_tensor_boundary_is_refused() -> None:
    with pytest.raises(RuntimeExecutionError, match="not a tensor"):
        probe(_Pair(), torch.randn(1, 2), "the output of stage 0")
    with pytest.raises(RuntimeExecutionError, match="scalar"):
        of_tensor(torch.tensor(1.0), "x")
