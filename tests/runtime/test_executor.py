"""StageExecutor in one process: one stage alone, or several on threads over queues.

The multi-process gloo tests (test_distributed.py) check the same equivalence
over real sockets; these run many more plans because they cost milliseconds.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tests.runtime.helpers import (
    WIDTH,
    dropout_model,
    param_free_first_model,
    plan_of,
    reference_grads,
    run_threaded,
    tiny_model,
)
from umsearch.core.errors import RuntimeExecutionError
from umsearch.core.plan import Plan, StagePlan
from umsearch.runtime.executor import HEADER_TAG, RECV_WINDOW, StageExecutor
from umsearch.runtime.model import stage_module
from umsearch.runtime.preflight import structural_cost
from umsearch.runtime.shapes import SampleShape, encode
from umsearch.sim.reference import simulate

SEED = 7


def _assert_grads_equal(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert sorted(got) == sorted(want)
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-10, atol=1e-12, msg=name)


@pytest.mark.parametrize(
    "forward, backward",
    [((12,), None), ((1, 5, 6), None), ((4, 8), (3, 3, 3, 3)), ((12,), (2, 10))],
)
def test_single_stage_matches_full_batch(forward: tuple[int, ...], backward: tuple[int, ...] | None) -> None:
    model = tiny_model(4)
    plan = plan_of(12, ((0, 4), forward, backward, 1))
    grads, losses, _ = run_threaded(plan, model, SEED)
    _assert_grads_equal(grads, reference_grads(tiny_model(4), 12, SEED))
    x, y = model.make_batch(12, torch.Generator().manual_seed(SEED))
    want_loss = model.loss(torch.nn.Sequential(*model.layers)(x), y).item()
    assert losses[0] == pytest.approx(want_loss, rel=1e-12)


CASES = {
    "2 stages gpipe, different partitions": plan_of(12, ((0, 3), [4, 8], None, 2), ((3, 6), [3, 3, 6], None, 3)),
    "2 stages 1f1b": plan_of(12, ((0, 2), [2, 4, 6], None, 2), ((2, 6), [6, 6], None, 1)),
    "2 stages recompute, backward differs": plan_of(
        12, ((0, 4), [4, 8], [6, 6], 2), ((4, 6), [3, 9], [12], 2)
    ),
    "3 stages 1f1b": plan_of(12, ((0, 2), [4, 4, 4], None, 3), ((2, 4), [6, 6], None, 2), ((4, 6), [2, 4, 6], None, 1)),
    "3 stages mixed recompute": plan_of(
        12, ((0, 1), [12], [5, 7], 1), ((1, 3), [3, 3, 3, 3], None, 4), ((3, 6), [4, 8], [1, 11], 2)
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_threaded_pipeline_matches_full_batch(name: str) -> None:
    plan = CASES[name]
    assert not simulate(plan, structural_cost(6)).deadlock
    grads, _, comms = run_threaded(plan, tiny_model(6), SEED)
    _assert_grads_equal(grads, reference_grads(tiny_model(6), 12, SEED))
    # Message bookkeeping: each stage sends one activation per forward and one gradient per backward.
    for s, comm in enumerate(comms):
        st = plan.stages[s]
        sent = [(peer, n) for peer, tag, (n, *_) in comm.sent if tag != HEADER_TAG]
        sent_next = [n for peer, n in sent if peer == "next"]
        sent_prev = [n for peer, n in sent if peer == "prev"]
        assert sent_next == ([] if s == plan.num_stages - 1 else list(st.forward))
        assert sent_prev == ([] if s == 0 else list(st.backward))


def test_sgd_steps_match_single_process_training() -> None:
    plan = CASES["3 stages mixed recompute"]
    model = tiny_model(6)
    run_threaded(plan, model, SEED, steps=3, lr=0.1)
    ref = tiny_model(6)
    net = torch.nn.Sequential(*ref.layers)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for step in range(3):
        x, y = ref.make_batch(12, torch.Generator().manual_seed(SEED + step))
        opt.zero_grad()
        ref.loss(net(x), y).backward()
        opt.step()
    for a, b in zip(torch.nn.Sequential(*model.layers).parameters(), net.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def _partition(total: int) -> st.SearchStrategy[tuple[int, ...]]:
    def build(cuts: list[int]) -> tuple[int, ...]:
        edges = [0, *sorted(set(cuts)), total]
        return tuple(b - a for a, b in zip(edges, edges[1:], strict=False))

    return st.lists(st.integers(1, total - 1), max_size=min(5, total - 1)).map(build)


@st.composite
def random_plans(draw: st.DrawFn) -> Plan:
    B = draw(st.integers(2, 10))
    S = draw(st.integers(2, 3))
    cuts = sorted(draw(st.sets(st.integers(1, 5), min_size=S - 1, max_size=S - 1)))
    edges = [0, *cuts, 6]
    stages = []
    for s in range(S):
        fwd = draw(_partition(B))
        recompute = draw(st.booleans())
        bwd = draw(_partition(B)) if recompute else fwd
        warmup = draw(st.integers(1, len(fwd)))
        stages.append(StagePlan(layers=(edges[s], edges[s + 1]), forward=fwd, backward=bwd,
                                warmup=warmup, recompute=recompute))  # fmt: skip
    return Plan(global_batch=B, stages=tuple(stages))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_plans())
def test_random_plans_match_full_batch(plan: Plan) -> None:
    assume(not simulate(plan, structural_cost(6)).deadlock)
    grads, _, _ = run_threaded(plan, tiny_model(6), SEED)
    _assert_grads_equal(grads, reference_grads(tiny_model(6), plan.global_batch, SEED))


def test_ops_follow_the_static_order_and_are_timed() -> None:
    model = tiny_model(3)
    plan = plan_of(6, ((0, 3), [2, 4], [1, 5], 1))
    ex = StageExecutor(plan, 0, stage_module(model, 0, 3), model.loss)
    x, y = model.make_batch(6, torch.Generator().manual_seed(0))
    stats = ex.run_iteration(x, y)
    assert [(o.kind, o.index, o.size) for o in stats.ops] == [("F", 0, 2), ("B", 0, 1), ("F", 1, 4), ("B", 1, 5)]
    assert all(0 <= o.start_ms <= o.end_ms for o in stats.ops)
    assert all(a.end_ms <= b.start_ms for a, b in zip(stats.ops, stats.ops[1:], strict=False))
    assert stats.pipeline_ms == stats.ops[-1].end_ms <= stats.step_ms


def test_bad_inputs_name_the_batch() -> None:
    model = tiny_model(3)
    plan = plan_of(6, ((0, 3), [6], None, 1))
    ex = StageExecutor(plan, 0, stage_module(model, 0, 3), model.loss)
    x, y = model.make_batch(5, torch.Generator())
    with pytest.raises(RuntimeExecutionError, match="global_batch = 6"):
        ex.run_iteration(x, y)
    with pytest.raises(RuntimeExecutionError, match="needs the batch's targets"):
        ex.run_iteration(model.make_batch(6, torch.Generator())[0], None)


def test_constructor_refusals() -> None:
    model = tiny_model(4)
    two = plan_of(6, ((0, 2), [6], None, 1), ((2, 4), [6], None, 1))
    with pytest.raises(RuntimeExecutionError, match="needs a comm"):
        StageExecutor(two, 0, stage_module(model, 0, 2), None)
    with pytest.raises(RuntimeExecutionError, match="needs loss_fn"):
        StageExecutor(plan_of(6, ((0, 4), [6], None, 1)), 0, stage_module(model, 0, 4), None)
    with pytest.raises(RuntimeExecutionError, match="outside the plan"):
        StageExecutor(two, 2, stage_module(model, 0, 2), model.loss)


def test_first_stage_without_parameters() -> None:
    """[Tanh(), Linear] cut at 1: stage 0 has nothing to differentiate, and must not try."""
    for plan in (plan_of(6, ((0, 1), [2, 4], None, 2), ((1, 2), [3, 3], None, 1)),
                 plan_of(6, ((0, 1), [6], [2, 4], 1), ((1, 2), [3, 3], None, 1))):  # fmt: skip
        grads, _, _ = run_threaded(plan, param_free_first_model(), SEED)
        _assert_grads_equal(grads, reference_grads(param_free_first_model(), 6, SEED))


def test_receives_are_posted_in_a_bounded_window() -> None:
    """GPipe over 8 one-sample microbatches: a stage never has more than RECV_WINDOW receives pending
    per direction, not the whole batch's 8, and the gradients stay exact."""
    plan = plan_of(8, ((0, 3), [1] * 8, None, 8), ((3, 6), [1] * 8, None, 8))
    grads, _, comms = run_threaded(plan, tiny_model(6), SEED)
    _assert_grads_equal(grads, reference_grads(tiny_model(6), 8, SEED))
    assert [c.max_outstanding for c in comms] == [RECV_WINDOW, RECV_WINDOW]


def _dropout_grads(plan: Plan) -> tuple[dict[str, torch.Tensor], float | None]:
    model = dropout_model()
    torch.manual_seed(1234)
    grads, losses, _ = run_threaded(plan, model, SEED)
    return grads, losses[0]


def test_recompute_replays_the_forwards_random_draws() -> None:
    """Dropout on a recomputing stage: the recomputation sees the forward's masks, as without recompute."""
    plain, plain_loss = _dropout_grads(plan_of(12, ((0, 3), [4, 8], None, 1)))
    replayed, replayed_loss = _dropout_grads(plan_of(12, ((0, 3), [4, 8], [4, 8], 1)))
    _assert_grads_equal(replayed, plain)
    assert replayed_loss == plain_loss
    # ... and the RNG stream goes on as if the recomputation had drawn nothing.
    _dropout_grads(plan_of(12, ((0, 3), [4, 8], [4, 8], 1)))
    after_replay = torch.get_rng_state()
    _dropout_grads(plan_of(12, ((0, 3), [4, 8], None, 1)))
    assert torch.equal(after_replay, torch.get_rng_state())


def test_recompute_refuses_to_replay_randomness_across_a_different_partition() -> None:
    with pytest.raises(RuntimeExecutionError, match=r"stage 0 draws random numbers .* backward microbatch 0 "
                                                    r"\(samples \[0, 6\)\)"):  # fmt: skip
        _dropout_grads(plan_of(12, ((0, 3), [4, 8], [6, 6], 1)))


class _StuckComm:
    """Hands stage 1 its shape header, then every activation wait times out the way gloo does."""

    device = torch.device("cpu")

    class _Done:
        def wait(self) -> None:
            return None

        def is_completed(self) -> bool:
            return True

    class _Stuck(_Done):
        def wait(self) -> None:
            raise RuntimeError("[/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out "
                               "waiting 2000ms for recv operation to complete")  # fmt: skip

    def isend(self, peer: str, tensor: torch.Tensor, tag: int) -> _Done:
        return self._Done()

    def irecv(self, peer: str, buffer: torch.Tensor, tag: int) -> _Done:
        if tag == HEADER_TAG:
            buffer.copy_(encode(SampleShape(dims=(WIDTH,), dtype=torch.float64)))
            return self._Done()
        return self._Stuck()

    def barrier(self) -> None:
        return None


def test_a_wait_that_times_out_names_the_stage_the_message_and_the_op() -> None:
    model = tiny_model(4)
    plan = plan_of(6, ((0, 2), [2, 4], None, 2), ((2, 4), [3, 3], None, 2))
    ex = StageExecutor(plan, 1, stage_module(model, 2, 4), model.loss, _StuckComm())
    y = model.make_batch(6, torch.Generator())[1]
    with pytest.raises(RuntimeExecutionError, match=r"^stage 1 gave up waiting for activation message 0 from stage 0, "
                                                    r"needed by forward microbatch 0: Timed out waiting 2000ms"):  # fmt: skip
        ex.run_iteration(None, y)
