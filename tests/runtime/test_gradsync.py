"""Bucketed gradient sync (docs/model.md section 9, version 2.3) in one process: the runtime cuts buckets
by the model's rule and all-reduces each once its gradients are final, during the stage's last backward,
in bucket order. The all-reduce itself is recorded, not run (the four-process test in
``test_data_parallel.py`` runs it)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.runtime.helpers import placed, rank_modules, tiny_model
from umsearch.core.cluster import bucket_cap_bytes, bucket_firsts
from umsearch.runtime.executor import StageExecutor
from umsearch.runtime.gradsync import GradSync, buckets_of
from umsearch.runtime.placement import Seat


class _Launches(GradSync):
    """A GradSync whose all-reduces are recorded: per launch, the stage, a copy of its gradients, and
    whether the stage's last action had ended yet (``start`` called)."""

    def __init__(self) -> None:
        super().__init__(placement=Seat(replica=0, rank=0), group=object(), replicas=2)  # type: ignore[arg-type]
        self.launched: list[tuple[int, list[torch.Tensor], list[torch.Tensor], bool]] = []
        self.ended: set[int] = set()

    def start(self, stage: int, params: Any) -> None:
        self.ended.add(stage)
        super().start(stage, params)

    def _reduce(self, stage: int, params: Any) -> None:
        got = [p for p in params if p.grad is not None]
        self.launched.append((stage, got, [p.grad.clone() for p in got], stage in self.ended))

    def finish(self) -> None:
        pass


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.integers(0, 5000), min_size=1, max_size=12), mib=st.none() | st.floats(1e-4, 0.01))
def test_buckets_follow_the_model_rule(sizes: list[int], mib: float | None) -> None:
    """:func:`buckets_of` on real parameters cuts where :func:`bucket_firsts` cuts on their bytes, top layer first."""
    layers = [[torch.zeros(n // 4 + 1)] if n else [] for n in sizes]
    nbytes = [sum(p.numel() * p.element_size() for p in ps) for ps in layers]
    prefix = np.concatenate([[0.0], np.cumsum(nbytes)])
    firsts = np.empty(len(layers), dtype=np.int64)
    m = bucket_firsts(prefix, 0, len(layers), bucket_cap_bytes(mib), firsts)
    want, top = [], len(layers)
    for a in firsts[:m].tolist():
        want.append([id(p) for i in range(top - 1, a - 1, -1) for p in layers[i]])
        top = a
    assert [[id(p) for p in b] for b in buckets_of(layers, mib)] == want


def _run(mib: float | None, actions: str) -> tuple[_Launches, list[torch.nn.Sequential]]:
    plan = replace(placed(4, [0, 4], [0], [[2, 2]], [actions]), bucket_mib=mib)
    model = tiny_model(4)
    modules = rank_modules(plan, model, 0)
    sync = _Launches()
    StageExecutor(plan, 0, modules, model.loss, grad_sync=sync).run_iteration(
        *model.make_batch(4, torch.Generator().manual_seed(0)))
    return sync, modules


@pytest.mark.parametrize("actions", ["0F0 0F1 0B0 0B1", "0F0 0F1 0I0 0W0 0I1 0W1"])
def test_each_layer_bucket_goes_during_the_last_backward_with_final_gradients(actions: str) -> None:
    """A cap below one layer's bytes: four buckets, launched top layer first; all but the last before the
    last ``B``/``W`` has ended, each with its gradients already final."""
    sync, modules = _run(1e-6, actions)
    layers = list(modules[0])
    assert [s for s, *_ in sync.launched] == [0] * 4
    for (_, params, grads, _), layer in zip(sync.launched, reversed(layers), strict=True):
        assert [id(p) for p in params] == [id(p) for p in layer.parameters()]
        for p, g in zip(params, grads, strict=True):
            assert p.grad is not None and torch.equal(g, p.grad)  # nothing was added after the launch
    assert [after for *_, after in sync.launched[:3]] == [False] * 3


def test_one_bucket_without_a_cap_goes_after_the_last_backward() -> None:
    sync, modules = _run(None, "0F0 0F1 0B0 0B1")
    assert len(sync.launched) == 1 and sync.launched[0][3]
    assert [id(p) for p in sync.launched[0][1]] == [id(p) for p in modules[0].parameters()]


def test_a_large_cap_is_one_bucket_launched_within_the_last_backward() -> None:
    sync, modules = _run(25.0, "0F0 0F1 0B0 0B1")
    assert len(sync.launched) == 1 and not sync.launched[0][3]
    assert sorted(id(p) for p in sync.launched[0][1]) == sorted(id(p) for p in modules[0].parameters())


class _Stage:
    """A stage's parameters by layer, as :meth:`GradSync.arm` reads them."""

    def __init__(self, layers: list[list[torch.nn.Parameter]]) -> None:
        self.layers = [(i, torch.nn.Identity(), list(ps)) for i, ps in enumerate(layers)]
        self.params = list({id(p): p for ps in layers for p in ps}.values())


def test_a_weight_shared_by_two_layers_waits_for_the_end_of_the_action() -> None:
    """Layers 0 and 2 share a weight, accumulated once per layer's graph when the layers run apart: its
    bucket (layer 0's, the lowest) launches only after the action, with the weight's gradient complete."""
    w, a, b = (torch.nn.Parameter(torch.ones(3)) for _ in range(3))
    stage = _Stage([[w, a], [b], [w]])
    assert [[id(p) for p in k] for k in buckets_of([[w, a], [b], [w]], 1e-6)] == [[], [id(b)], [id(w), id(a)]]
    sync = _Launches()
    sync.arm(0, stage, 1e-6)  # type: ignore[arg-type]
    (2 * w).sum().backward()  # layer 2's graph: the shared weight's first gradient
    (3 * b).sum().backward()  # layer 1's
    assert [len(params) for _, params, _, _ in sync.launched] == [0, 1]
    (w * a).sum().backward()  # layer 0's: the shared weight's second gradient
    assert len(sync.launched) == 2
    sync.start(0, stage.params)
    _, params, grads, after = sync.launched[2]
    assert after and [id(p) for p in params] == [id(w), id(a)]
    assert torch.equal(grads[0], torch.full((3,), 3.0)) and torch.equal(grads[1], torch.ones(3))


def test_a_weight_two_stages_share_is_synced_by_the_stage_whose_backward_ends_last() -> None:
    from types import SimpleNamespace

    from umsearch.runtime.gradsync import synced_by_stage

    tied, a, b = (torch.nn.Parameter(torch.zeros(2)) for _ in range(3))
    head = SimpleNamespace(params=[a, tied], layers=[(3, torch.nn.Identity(), [a, tied])])
    embed = SimpleNamespace(params=[tied, b], layers=[(0, torch.nn.Identity(), [tied]), (1, torch.nn.Identity(), [b])])
    views = synced_by_stage({3: head, 0: embed}, {3: 5, 0: 9})  # stage 0's last backward comes later
    assert views[0] is embed and [id(p) for p in views[0].params] == [id(tied), id(b)]
    assert [id(p) for p in views[3].params] == [id(a)]
    assert [[id(p) for p in ps] for _, _, ps in views[3].layers] == [[id(a)]]
    swapped = synced_by_stage({3: head, 0: embed}, {3: 9, 0: 5})
    assert swapped[3] is head and [id(p) for p in swapped[0].params] == [id(b)]
