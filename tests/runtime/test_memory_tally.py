"""The memory tally counts the model's terms: saved storages once, parameters apart, gradients as they appear."""

from __future__ import annotations

import gc

import torch

from umsearch.runtime.memory_tally import MemoryTally, optimizer_state_bytes, storage_bytes


def test_a_storage_saved_twice_counts_once_and_leaves_after_backward() -> None:
    x = torch.randn(100, dtype=torch.float64, requires_grad=True)
    with MemoryTally([]) as tally:
        y = x * x  # mul saves x as both of its operands
        assert tally.saved == 800 and list(tally._held.values()) == [{(0, 800): 2}]
        z = (x[:50] * 2.0).sin()  # sin saves its input: a new storage (x[:50] * 2 is not x)
        assert tally.saved == 800 + 400
        total = y.sum() + z.sum()
    total.backward()
    del y, z, total
    gc.collect()
    result = tally.result()
    assert result.saved_peak_bytes == 1200 and result.saved_end_bytes == 0 and tally.saved == 0
    assert result.peak_bytes == 1200  # no parameters, no gradients of parameters


def test_views_of_one_storage_count_once() -> None:
    x = torch.randn(10, 10, requires_grad=True)
    with MemoryTally([]) as tally:
        a = x.exp()  # saves its output: a's storage
        b = a[:5].sin()  # saves a view of a: the same storage
        c = a.t().cos()  # and another view
        assert tally.saved == a.untyped_storage().nbytes()
    (b.sum() + c.sum()).backward()
    del a, b, c
    gc.collect()
    assert tally.saved == 0


def test_parameters_gradients_and_optimizer_states_are_state() -> None:
    lin = torch.nn.Linear(4, 3)
    opt = torch.optim.SGD(lin.parameters(), lr=0.1, momentum=0.9)
    params = list(lin.parameters())
    x = torch.randn(8, 4)
    for _ in range(2):
        opt.zero_grad(set_to_none=True)
        with MemoryTally(params, opt) as tally:
            lin(x).square().mean().backward()
            opt.step()
        r = tally.result()
        assert r.param_bytes == (12 + 3) * 4 and r.grad_bytes == (12 + 3) * 4
        assert r.optimizer_bytes == (12 + 3) * 4 == optimizer_state_bytes(opt)  # momentum, made at the first step
        # Linear saves x (not its weight: a parameter); square saves the output; both gone after backward.
        assert r.saved_peak_bytes == storage_bytes([x]) + 8 * 3 * 4 and r.saved_end_bytes == 0
        assert r.peak_bytes <= r.state_bytes + r.saved_peak_bytes
        assert r.peak_bytes >= r.param_bytes + r.optimizer_bytes + r.saved_peak_bytes


def test_hooks_are_removed_after_the_block() -> None:
    lin = torch.nn.Linear(2, 2)
    with MemoryTally(lin.parameters()) as tally:
        pass
    lin(torch.randn(3, 2)).sum().backward()
    assert tally.saved == 0 and tally.grads == 0


def test_gradients_under_the_tally_are_the_same() -> None:
    """The tally keeps saved tensors detached (no cycle through a node that saves its output): autograd
    computes exactly what it computes without it."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2), torch.nn.Sigmoid())
    x = torch.randn(6, 4)
    net(x).square().sum().backward()
    want = [p.grad.clone() for p in net.parameters() if p.grad is not None]
    net.zero_grad(set_to_none=True)
    with MemoryTally(net.parameters()) as tally:
        net(x).square().sum().backward()
    got = [p.grad for p in net.parameters()]
    assert all(g is not None and torch.equal(g, w) for g, w in zip(got, want, strict=True))
    assert tally.saved == 0 and tally.result().saved_peak_bytes > 0


def test_a_saved_view_counts_its_extent_not_its_whole_storage() -> None:
    """Issue 38 decision 4, by hand: a (8, 4) float32 batch is 128 bytes, 16 per row. A microbatch of rows 0-1
    saved by a multiply counts 32 bytes; rows 1-2 beside it add one row (the union: 48); freed, nothing."""
    batch = torch.randn(8, 4)
    w = torch.randn(4, requires_grad=True)
    with MemoryTally([w]) as tally:
        first = batch[0:2] * w  # mul saves its other operand: the view of rows 0-1
        assert tally.saved == 32
        second = batch[1:3] * w
        assert tally.saved == 48
        strided = batch[:, 0] * w[0]  # column 0 of every row: from the first element to the last, 29 floats
        assert tally.saved == (28 + 1) * 4
    (first.sum() + second.sum() + strided.sum()).backward()
    del first, second, strided
    gc.collect()
    assert tally.saved == 0 and tally.result().saved_peak_bytes == 116


def test_a_held_tensor_counts_once_with_the_saved_views_that_share_it() -> None:
    """A recomputing stage keeps its input outside autograd: held, it counts; saved views of it add nothing."""
    x = torch.randn(6, 2, dtype=torch.float64)  # 96 bytes
    w = torch.randn(2, dtype=torch.float64, requires_grad=True)
    with MemoryTally([w]) as tally:
        token = tally.hold(x)
        assert tally.saved == 96
        y = x[2:4] * w  # saves rows 2-3 of x: inside what is held
        assert tally.saved == 96
        del token
        gc.collect()
        assert tally.saved == 32  # the saved rows stay
    y.sum().backward()
    del y
    gc.collect()
    assert tally.saved == 0


def test_a_recomputing_stage_registers_its_kept_inputs_only_while_a_tally_counts() -> None:
    """``held`` is how runtime/stage.py registers a recomputing stage's stash: free without a tally."""
    from umsearch.runtime.memory_tally import held

    x = torch.randn(4, 8)  # 128 bytes
    assert held(x) is None
    with MemoryTally([]) as tally:
        token = held(x)
        assert token is not None and tally.saved == 128
        del token
        gc.collect()
        assert tally.saved == 0
    assert held(x) is None  # the tally has ended


def test_a_gradient_set_by_assignment_counts_at_the_next_event_and_at_the_end() -> None:
    """torch's split backward writes ``weight.grad = dw`` (no accumulate hook runs): the tally still counts it."""
    w, v = torch.zeros(16, requires_grad=True), torch.zeros(8, requires_grad=True)
    x = torch.ones(16, requires_grad=True)
    with MemoryTally([w, v]) as tally:
        w.grad = torch.ones(16)  # 64 bytes, unseen by any hook
        assert tally.grads == 0
        y = (x * x).sum()  # a saved tensor: the next event
        assert tally.grads == 64
        v.grad = torch.ones(8)  # 32 bytes, after the last event
    assert tally.result().grad_bytes == 96
    del y
