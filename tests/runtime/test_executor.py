"""StageExecutor against single-process training: exact gradients for every kind of plan/2.

Ranks run as threads on in-process queues (:class:`tests.runtime.helpers.QueueHub`),
so these tests need no process group; ``test_distributed.py`` runs the same
executor under torchrun with gloo.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings

from tests.runtime.helpers import (
    WIDTH,
    dropout_model,
    param_free_first_model,
    peer_plan,
    placed,
    plan_of,
    rank_modules,
    reference_grads,
    run_threaded,
    tiny_model,
)
from tests.strategies import plans
from umsearch.core.deps import find_deadlock
from umsearch.core.plan import Plan
from umsearch.errors import RuntimeExecutionError
from umsearch.runtime.executor import RECV_WINDOW, StageExecutor, tag
from umsearch.runtime.shapes import SampleShape, encode

SEED = 7


def _assert_grads_equal(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert sorted(got) == sorted(want)
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-10, atol=1e-12, msg=name)


def _check(plan: Plan, layers: int = 6) -> list[object]:
    assert not find_deadlock(plan)
    grads, _, comms = run_threaded(plan, tiny_model(layers), SEED)
    _assert_grads_equal(grads, reference_grads(tiny_model(layers), plan.global_batch, SEED))
    return list(comms)


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


ONE_STAGE_PER_RANK = {
    "2 ranks gpipe, different partitions": plan_of(12, ((0, 3), [4, 8], None, 2), ((3, 6), [3, 3, 6], None, 3)),
    "2 ranks 1f1b": plan_of(12, ((0, 2), [2, 4, 6], None, 2), ((2, 6), [6, 6], None, 1)),
    "2 ranks recompute, backward differs": plan_of(12, ((0, 4), [4, 8], [6, 6], 2), ((4, 6), [3, 9], [12], 2)),
    "3 ranks 1f1b": plan_of(12, ((0, 2), [4, 4, 4], None, 3), ((2, 4), [6, 6], None, 2), ((4, 6), [2, 4, 6], None, 1)),
    "3 ranks mixed recompute": plan_of(
        12, ((0, 1), [12], [5, 7], 1), ((1, 3), [3, 3, 3, 3], None, 4), ((3, 6), [4, 8], [1, 11], 2)
    ),
}

SEVERAL_STAGES_PER_RANK = {
    # 4 stages looped over 2 ranks, unequal and different partitions, local hand-off 1 -> 2 is remote, 0 -> 1 too.
    "2 ranks interleaved, unequal": placed(
        12, [0, 1, 3, 4, 6], [0, 1, 0, 1], [[4, 8], [6, 6], [3, 9], [12]],
        ["0F0 0F1 2F0 2F1 2B0 2B1 0B0 0B1", "1F0 1F1 3F0 3B0 1B0 1B1"],
    ),
    # V-shape: stages 1 and 2 on rank 1 hand over locally; I/W split on every stage.
    "2 ranks V-shape, I/W split": placed(
        8, [0, 2, 3, 4, 6], [0, 1, 1, 0], [[4, 4], [2, 6], [8], [4, 4]],
        ["0F0 0F1 3F0 3I0 3F1 3I1 0I0 3W0 0I1 3W1 0W0 0W1",
         "1F0 1F1 2F0 2I0 1I0 1I1 2W0 1W0 1W1"],
    ),
    "2 ranks V-shape, recompute and split": placed(
        8, [0, 2, 3, 4, 6], [0, 1, 1, 0], [[4, 4], [2, 6], [8], [4, 4]],
        ["0F0 0F1 3F0 3F1 3B0 3B1 0I0 0I1 0W1 0W0",
         "1F0 1F1 2F0 2I0 2W0 1B0"],
        backward=[[4, 4], [8], [8], [4, 4]], recompute=[False, True, False, False],
    ),
    "3 ranks arbitrary placement, mixed": placed(
        6, [0, 1, 2, 3, 4, 5, 6], [0, 2, 1, 1, 2, 0], [[6], [3, 3], [2, 4], [6], [1, 5], [6]],
        ["0F0 5F0 5I0 5W0 0B0", "2F0 2F1 3F0 3I0 2B0 2B1 3W0", "1F0 1F1 4F0 4F1 4B0 4B1 1B1 1B0"],
    ),
}


@pytest.mark.parametrize("name", sorted(ONE_STAGE_PER_RANK))
def test_one_stage_per_rank_matches_full_batch(name: str) -> None:
    plan = ONE_STAGE_PER_RANK[name]
    comms = _check(plan)
    # Each stage sends one activation per forward and one gradient per backward, to its neighbour's rank.
    S = plan.num_stages
    for s, comm in enumerate(comms):
        st = plan.stages[s]
        sent = [(dst, n) for dst, t, (n, *_) in comm.sent if t != tag(s, False, -1, S)]  # type: ignore[attr-defined]
        assert [n for dst, n in sent if dst == s + 1] == ([] if s == S - 1 else list(st.forward))
        assert [n for dst, n in sent if dst == s - 1] == ([] if s == 0 else list(st.backward))


@pytest.mark.parametrize("name", sorted(SEVERAL_STAGES_PER_RANK))
def test_several_stages_per_rank_match_full_batch(name: str) -> None:
    plan = SEVERAL_STAGES_PER_RANK[name]
    comms = _check(plan)
    # A hand-off between two stages of one rank is a local tensor, never a message to itself.
    for r, comm in enumerate(comms):
        assert all(dst != r for dst, _, _ in comm.sent)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "name, ranks, v, microbatches",
    [("GPipe", 2, 1, 4), ("1F1B", 3, 1, 4), ("Interleaved1F1B", 2, 2, 4), ("LoopedBFS", 2, 2, 3),
     ("InterleavedZeroBubble", 2, 2, 4), ("ZBVZeroBubble", 2, 2, 4), ("ZBVZeroBubble", 3, 2, 6),
     ("Interleaved1F1B", 3, 2, 6)],
)  # fmt: skip
def test_torch_schedules_match_full_batch(name: str, ranks: int, v: int, microbatches: int) -> None:
    """Plans in torch.distributed.pipelining's own orders (as generated for docs/model.md 6.2)."""
    layers = ranks * v
    _check(peer_plan(name, ranks, v, microbatches, batch=12, layers=layers), layers=layers)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plans(num_layers=6, max_batch=8, max_ranks=3))
def test_random_plans_match_full_batch(plan: Plan) -> None:
    assume(not find_deadlock(plan))
    grads, _, _ = run_threaded(plan, tiny_model(6), SEED)
    _assert_grads_equal(grads, reference_grads(tiny_model(6), plan.global_batch, SEED))


def test_sgd_steps_match_single_process_training() -> None:
    plan = SEVERAL_STAGES_PER_RANK["2 ranks V-shape, I/W split"]
    model = tiny_model(6)
    run_threaded(plan, model, SEED, steps=3, lr=0.1)
    ref = tiny_model(6)
    net = torch.nn.Sequential(*ref.layers)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for step in range(3):
        x, y = ref.make_batch(8, torch.Generator().manual_seed(SEED + step))
        opt.zero_grad()
        ref.loss(net(x), y).backward()
        opt.step()
    for a, b in zip(torch.nn.Sequential(*model.layers).parameters(), net.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_actions_follow_the_list_and_are_timed() -> None:
    model = tiny_model(3)
    plan = placed(6, [0, 3], [0], [[2, 4]], ["0F0 0I0 0F1 0B1 0W0"])
    ex = StageExecutor(plan, 0, rank_modules(plan, model, 0), model.loss)
    x, y = model.make_batch(6, torch.Generator().manual_seed(0))
    stats = ex.run_iteration(x, y)
    assert [(a.kind, a.mb, a.size) for a in stats.actions] == [("F", 0, 2), ("I", 0, 2), ("F", 1, 4), ("B", 1, 4),
                                                               ("W", 0, 2)]  # fmt: skip
    assert all(0 <= a.start_ms <= a.end_ms for a in stats.actions)
    assert all(a.end_ms <= b.start_ms for a, b in zip(stats.actions, stats.actions[1:], strict=False))
    assert stats.pipeline_ms == stats.actions[-1].end_ms <= stats.step_ms


def test_bad_inputs_name_the_batch() -> None:
    model = tiny_model(3)
    plan = plan_of(6, ((0, 3), [6], None, 1))
    ex = StageExecutor(plan, 0, rank_modules(plan, model, 0), model.loss)
    x, y = model.make_batch(5, torch.Generator())
    with pytest.raises(RuntimeExecutionError, match="global_batch = 6"):
        ex.run_iteration(x, y)
    with pytest.raises(RuntimeExecutionError, match="needs the batch's targets"):
        ex.run_iteration(model.make_batch(6, torch.Generator())[0], None)


def test_constructor_refusals() -> None:
    model = tiny_model(4)
    two = plan_of(6, ((0, 2), [6], None, 1), ((2, 4), [6], None, 1))
    with pytest.raises(RuntimeExecutionError, match="needs a comm"):
        StageExecutor(two, 0, rank_modules(two, model, 0), None)
    with pytest.raises(RuntimeExecutionError, match="outside the plan"):
        StageExecutor(two, 2, rank_modules(two, model, 0), model.loss)
    v = SEVERAL_STAGES_PER_RANK["2 ranks V-shape, I/W split"]
    with pytest.raises(RuntimeExecutionError, match=r"holds stages \[1, 2\] but got 1 stage module"):
        StageExecutor(v, 1, rank_modules(v, tiny_model(6), 1)[:1], None, comm=object())  # type: ignore[arg-type]


def test_first_stage_without_parameters() -> None:
    """[Tanh(), Linear] cut at 1: stage 0 has nothing to differentiate, and must not try."""
    for plan in (plan_of(6, ((0, 1), [2, 4], None, 2), ((1, 2), [3, 3], None, 1)),
                 plan_of(6, ((0, 1), [6], [2, 4], 1), ((1, 2), [3, 3], None, 1)),
                 placed(6, [0, 1, 2], [0, 1], [[2, 4], [6]], ["0F0 0F1 0I0 0I1 0W0 0W1", "1F0 1I0 1W0"])):  # fmt: skip
        grads, _, _ = run_threaded(plan, param_free_first_model(), SEED)
        _assert_grads_equal(grads, reference_grads(param_free_first_model(), 6, SEED))


def test_receives_are_posted_in_a_bounded_window() -> None:
    """GPipe over 8 one-sample microbatches: a rank never has more than RECV_WINDOW receives pending
    per link, not the whole batch's 8, and the gradients stay exact."""
    plan = plan_of(8, ((0, 3), [1] * 8, None, 8), ((3, 6), [1] * 8, None, 8))
    comms = _check(plan)
    assert [c.max_outstanding for c in comms] == [RECV_WINDOW, RECV_WINDOW]  # type: ignore[attr-defined]


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
    with pytest.raises(RuntimeExecutionError, match=r"stage 0 draws random numbers"):
        _dropout_grads(plan_of(12, ((0, 3), [4, 8], [6, 6], 1)))


class _StuckComm:
    """Hands rank 1 its shape header, then every activation wait times out the way gloo does."""

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

    def isend(self, dst: int, tensor: torch.Tensor, t: int) -> _Done:
        return self._Done()

    def irecv(self, src: int, buffer: torch.Tensor, t: int) -> _Done:
        if t == tag(0, False, -1, 2):
            buffer.copy_(encode(SampleShape(dims=(WIDTH,), dtype=torch.float64)))
            return self._Done()
        return self._Stuck()

    def barrier(self) -> None:
        return None


def test_a_wait_that_times_out_names_the_rank_the_message_and_the_action() -> None:
    model = tiny_model(4)
    plan = plan_of(6, ((0, 2), [2, 4], None, 2), ((2, 4), [3, 3], None, 2))
    ex = StageExecutor(plan, 1, rank_modules(plan, model, 1), model.loss, _StuckComm())
    y = model.make_batch(6, torch.Generator())[1]
    with pytest.raises(RuntimeExecutionError, match=r"^rank 1 gave up waiting for activation message 0F0 from rank 0, "
                                                    r"needed by 1F0: Timed out waiting 2000ms"):  # fmt: skip
        ex.run_iteration(None, y)
