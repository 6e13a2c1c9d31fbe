"""The executor interprets its rank's lowered program: its messages are the program's, it routes nothing itself,
and a rank process checks its plan at most as often as the gate says."""

from __future__ import annotations

import ast
import dataclasses
import functools
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import umsearch.runtime.executor as executor_module
from tests.runtime.helpers import (
    QueueComm,
    QueueHub,
    peer_plan,
    placed,
    rank_modules,
    reference_grads,
    run_threads,
    tiny_model,
)
from tests.runtime.test_executor import ONE_STAGE_PER_RANK, SEVERAL_STAGES_PER_RANK
from umsearch.core import plan_rules
from umsearch.core.plan import Plan
from umsearch.core.program import (
    LOSS,
    Channel,
    FixedShape,
    Input,
    Publish,
    RankProgram,
    Receive,
    Send,
    Step,
    lower,
    tag,
    untag,
)
from umsearch.runtime.config import RunConfig
from umsearch.runtime.executor import StageExecutor
from umsearch.runtime.replay import replay_rank

ZOO = {**ONE_STAGE_PER_RANK, **SEVERAL_STAGES_PER_RANK,
       "ZBV, 2 ranks": peer_plan("ZBVZeroBubble", 2, 2, 4, batch=12, layers=4),
       "Interleaved1F1B, 3 ranks": peer_plan("Interleaved1F1B", 3, 2, 6, batch=12, layers=6)}  # fmt: skip


class _Recording(QueueComm):
    """A :class:`QueueComm` that logs every send and receive it is asked for, in order."""

    def __init__(self, hub: QueueHub, rank: int) -> None:
        super().__init__(hub, rank)
        self.log: list[tuple[str, int, int, tuple[int, ...]]] = []

    def isend(self, dst: int, tensor: torch.Tensor, tag: int) -> Any:
        self.log.append(("send", dst, tag, tuple(tensor.shape)))
        return super().isend(dst, tensor, tag)

    def irecv(self, src: int, buffer: torch.Tensor, tag: int) -> Any:
        self.log.append(("recv", src, tag, tuple(buffer.shape)))
        return super().irecv(src, buffer, tag)


def _run(plan: Plan, layers: int, forward_only: bool) -> list[_Recording]:
    model, hub = tiny_model(layers), QueueHub(plan.ranks)
    comms = [_Recording(hub, r) for r in range(plan.ranks)]
    programs = lower(plan, forward_only=forward_only)
    errors: list[BaseException] = []

    def body(r: int) -> None:
        try:
            ex = StageExecutor(plan, r, rank_modules(plan, model, r), model.loss, comms[r], forward_only=forward_only,
                               program=programs[r])  # fmt: skip
            for step in range(2):
                x, y = model.make_batch(plan.global_batch, torch.Generator().manual_seed(step))
                ex.run_iteration(x if ex.needs_inputs else None, y if ex.needs_targets else None)
        except BaseException as exc:  # noqa: BLE001 - surfaced below
            errors.append(exc)
            hub.barrier.abort()

    run_threads(body, plan.ranks, errors)
    return comms


@pytest.mark.parametrize("forward_only", [False, True])
@pytest.mark.parametrize("name", sorted(ZOO))
def test_the_executors_messages_are_its_programs(name: str, forward_only: bool) -> None:
    """Every iteration, each rank posts exactly the program's receives and sends exactly its sends, in order,
    with buffers of the message's samples; the shape headers come once, before."""
    plan = ZOO[name]
    layers = plan.num_layers
    programs = lower(plan, forward_only=forward_only)
    for comm, prog in zip(_run(plan, layers, forward_only), programs, strict=True):
        headers = [e for e in comm.log if untag(e[2], plan.num_stages)[2] < 0]
        body = [e for e in comm.log if untag(e[2], plan.num_stages)[2] >= 0]
        want_headers = [("recv", ch.sender_rank, ch.header_tag) for ch in prog.channels
                        if not ch.local and not ch.gradient] + [("send", h.peer, h.tag) for h in prog.headers]  # fmt: skip
        assert sorted((k, peer, t) for k, peer, t, _ in headers) == sorted(want_headers)
        recvs = [(peer, t, shape[0]) for k, peer, t, shape in body if k == "recv"]
        want = [(r.peer, r.tag, prog.channels[r.channel].sizes[r.message]) for r in prog.receives]
        assert recvs == want * 2
        assert [(peer, t) for k, peer, t, _ in body if k == "send"] == [(s.peer, s.tag) for s in prog.sends] * 2


def test_the_executor_has_no_routing_code_of_its_own() -> None:
    """No tag arithmetic, no source or consumer questions, no slicing of partitions, no posting window:
    all of that is the program's (umsearch.core.program)."""
    tree = ast.parse(Path(executor_module.__file__).read_text())
    classes = {n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
    assert classes == {"IterationStats", "StageExecutor"}
    routing = {"tag", "untag", "consumer", "source", "all_overlaps", "spans", "releases", "consumer_stage",
               "source_stage", "lower_rank_links"}  # fmt: skip
    called = {n.func.id if isinstance(n.func, ast.Name) else n.func.attr
              for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name | ast.Attribute)}  # fmt: skip
    assert not called & routing
    window = {"RECV_WINDOW", "readers", "through", "next_reader", "seq", "posted"}
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | {
        n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)
    }
    assert not used & (window - {"RECV_WINDOW"})
    assert not any(isinstance(n, ast.Name) and n.id == "RECV_WINDOW" and isinstance(n.ctx, ast.Load)
                   for n in ast.walk(tree))  # fmt: skip


@pytest.fixture
def checks() -> Iterator[list[int]]:
    """Counts every call of ``validate_plan``, wherever a module imported it (this module imports replay, and
    with it the preflight, first)."""
    original = plan_rules.validate_plan
    calls: list[int] = []

    def counted(plan: Plan, *args: Any, **kwargs: Any) -> Plan:
        calls.append(1)
        return original(plan, *args, **kwargs)

    patched = [(m, name) for m in list(sys.modules.values()) if m is not None and m.__name__.startswith("umsearch")
               for name, v in vars(m).items() if v is original]  # fmt: skip
    for m, name in patched:
        setattr(m, name, counted)
    try:
        yield calls
    finally:
        for m, name in patched:
            setattr(m, name, original)


TWO_RANKS = placed(8, [0, 3, 6], [0, 1], [[2, 6], [4, 4]], ["0F0 0F1 0B0 0B1", "1F0 1B0 1F1 1B1"])


@pytest.mark.parametrize("check", [False, True])
def test_a_rank_given_a_checked_plan_does_not_check_it_again(checks: list[int], check: bool) -> None:
    """A rank process is handed the launcher's checked Plan (pickled, not plan JSON) and lowers it once: no
    check runs again, the model checks of ``--check`` (runtime/preflight.py) included."""
    replay_rank(TWO_RANKS, functools.partial(tiny_model, 6), 1, steps=1, cfg=RunConfig(check=check))
    assert len(checks) == 0



def _attribute_reads(tree: ast.AST) -> set[str]:
    return {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}


def test_the_executor_reads_every_peer_tag_and_slice_from_the_program() -> None:
    """What a message is (an activation, a gradient, a header) is the program's: the executor never asks a
    channel who sends on it or in which direction, passes every send and receive the ``peer`` and ``tag`` a
    program operation carries, cuts the batch only at a step's ``rows`` and builds inputs only from ``pieces``."""
    tree = ast.parse(Path(executor_module.__file__).read_text())
    meaning = {"sender", "sender_rank", "gradient", "local", "header_tag", "activations", "gradients", "headers",
               "consumer", "source", "cf", "cb"}  # fmt: skip
    assert not _attribute_reads(tree) & meaning
    for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
        name = call.func.attr if isinstance(call.func, ast.Attribute) else None
        if name in ("isend", "irecv"):
            peer, _, tag = call.args
            assert isinstance(peer, ast.Attribute) and peer.attr == "peer", ast.unparse(call)
            assert isinstance(tag, ast.Attribute) and tag.attr == "tag", ast.unparse(call)
        if name == "narrow":
            assert [ast.unparse(a) for a in call.args] == ["0", "*step.rows"], ast.unparse(call)
    assembled = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
                 and n.func.id == "assemble"]  # fmt: skip
    assert [ast.unparse(c.args[1]) for c in assembled] == ["inp.pieces"]


LOSS_PLAN = placed(8, [0, 3, 6], [0, 1], [[2, 6], [4, 4]], ["0F0 0F1 0B0 0B1", "1F0 1F1 1B0 1B1"])
"""The last stage's forwards all come before its backwards: its losses go to rank 0 before any gradient."""


def _losses_to_rank_0(plan: Plan) -> tuple[RankProgram, RankProgram]:
    """The lowered programs of :data:`LOSS_PLAN` plus a message kind the executor was never told about: rank 1
    sends every forward microbatch's loss to rank 0 (after its output, under the tags the last stage's unused
    activations would have), and rank 0 receives them first on that link (the sender's order) and publishes
    them after its last step."""
    first, last = lower(plan)
    S, scalar = plan.num_stages, FixedShape((), "float64")
    sends = tuple(dataclasses.replace(s, outputs=(*s.outputs, Send(peer=0, tag=tag(S - 1, False, s.action.mb, S),
                                                                   name=f"loss {s.action}", shape=scalar, count=1,
                                                                   value=LOSS)))
                  if s.action is not None and s.action.is_forward else s for s in last.steps)  # fmt: skip
    losses = len(plan.stages[-1].forward)
    channel = Channel(stage=0, gradient=False, sender=S - 1, sender_rank=1, local=False, sizes=(1,) * losses,
                      header_tag=-1, shape=scalar)  # fmt: skip
    c = len(first.channels)
    receives = tuple(Receive(channel=c, message=k, peer=1, tag=tag(S - 1, False, k, S)) for k in range(losses))
    collect = Step(action=None, input=Input(channel=c, pieces=tuple((k, 0, 1) for k in range(losses)),
                                            release=tuple(range(losses))),
                   posts=(), outputs=(Publish("losses"),), ends_backward_of=None)  # fmt: skip
    return (dataclasses.replace(first, channels=(*first.channels, channel), prelude=receives + first.prelude,
                                steps=(*first.steps, collect)),
            dataclasses.replace(last, steps=sends))  # fmt: skip


def test_a_message_kind_the_executor_does_not_know_runs_from_the_program_alone() -> None:
    """A new kind of message written into the programs only (:func:`_losses_to_rank_0`) runs: rank 0 gets the
    last stage's microbatch losses, and every gradient is still the single-process one."""
    plan, model = LOSS_PLAN, tiny_model(6)
    programs = _losses_to_rank_0(plan)
    hub = QueueHub(plan.ranks)
    executors: list[StageExecutor] = []
    for r in range(plan.ranks):
        executors.append(StageExecutor(plan, r, rank_modules(plan, model, r), model.loss, hub.comm(r),
                                       program=programs[r]))  # fmt: skip
    errors: list[BaseException] = []

    def body(r: int) -> None:
        try:
            x, y = model.make_batch(plan.global_batch, torch.Generator().manual_seed(3))
            ex = executors[r]
            ex.run_iteration(x if ex.needs_inputs else None, y if ex.needs_targets else None)
        except BaseException as exc:  # noqa: BLE001 - surfaced below
            errors.append(exc)
            hub.barrier.abort()

    run_threads(body, plan.ranks, errors)
    (published,) = executors[0].published["losses"]
    assert torch.equal(published, torch.stack(executors[1].microbatch_losses()))
    want = reference_grads(model, plan.global_batch, 3)
    got = {n: p.grad for ex in executors for j, s in ex.stages.items()
           for n, p in s.module.named_parameters() if p.grad is not None}  # fmt: skip
    assert want.keys() == got.keys() and all(torch.allclose(got[n], want[n], rtol=0, atol=1e-12) for n in want)
