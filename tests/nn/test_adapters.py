"""umsearch.nn.adapters: tuple-returning blocks become pipeline layers; unsendable outputs are named."""

from __future__ import annotations

from collections import namedtuple

import pytest
import torch
from torch import nn

from umsearch.errors import ModelSpecError
from umsearch.nn.adapters import HiddenState, check_layer_outputs, first_tensor


class TupleBlock(nn.Module):
    """A library-style block: takes a mask keyword, returns (hidden, attention weights)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.lin(x) if mask is None else self.lin(x) * mask
        return h, h.sum(-1)


def test_hidden_state_keeps_the_first_output_and_passes_kwargs() -> None:
    block = TupleBlock()
    x = torch.randn(3, 4)
    assert torch.equal(HiddenState(block)(x), block(x)[0])
    mask = torch.tensor([1.0, 0.0, 1.0, 0.0])
    assert torch.equal(HiddenState(block, kwargs={"mask": mask})(x), block(x, mask=mask)[0])
    built = HiddenState(block, make_kwargs=lambda h: {"mask": torch.ones(h.shape[-1])})
    assert torch.equal(built(x), block(x)[0])


def test_hidden_state_gradients_reach_the_block() -> None:
    block = TupleBlock()
    HiddenState(block)(torch.randn(2, 4)).sum().backward()
    assert block.lin.weight.grad is not None


def test_first_tensor_of_named_tuples_and_model_outputs() -> None:
    t = torch.zeros(1)
    assert first_tensor(namedtuple("Out", "h a")(t, None)) is t

    class ModelOutput:
        def to_tuple(self) -> tuple[torch.Tensor]:
            return (t,)

    assert first_tensor(ModelOutput()) is t
    assert first_tensor({"h": t}) == {"h": t}


def test_check_names_the_layer_and_the_fix() -> None:
    layers = [nn.Linear(4, 4), TupleBlock(), nn.Linear(4, 4)]
    with pytest.raises(ModelSpecError, match=r"layer 1 \(block1\) returns a tuple.*HiddenState"):
        check_layer_outputs(layers, ["lin0", "block1", "lin2"], torch.randn(2, 4))
    check_layer_outputs([layers[0], HiddenState(layers[1]), layers[2]], ["a", "b", "c"], torch.randn(2, 4))


def test_check_says_when_no_element_is_a_tensor() -> None:
    class Dict(nn.Module):
        def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
            return {"h": x}

    with pytest.raises(ModelSpecError, match="layer 0 \\(d\\) returns a dict.*return one tensor"):
        check_layer_outputs([Dict()], ["d"], torch.randn(1, 2))
