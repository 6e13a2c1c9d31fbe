"""A tiny float64 model and a single-process reference gradient for the runtime tests."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from umsearch.core.actions import parse_actions
from umsearch.core.plan import Plan, Stage, equal_split, placed_plan
from umsearch.core.plan_rules import validate_plan
from umsearch.core.schedules import PEER_SCHEDULES, warmup_rule

WIDTH = 6
IN = 5
OUT = 3


@dataclass(frozen=True)
class TinyModel:
    """Linear/Tanh layers on float64, MSE loss: every sample independent, so splits are exact."""

    layers: list[torch.nn.Module]
    make_batch: Callable[[int, torch.Generator], tuple[torch.Tensor, torch.Tensor]]
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _batch(b: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.randn(b, IN, generator=g, dtype=torch.float64),
            torch.randn(b, OUT, generator=g, dtype=torch.float64))  # fmt: skip


def param_free_first_model(seed: int = 0) -> TinyModel:
    """``[Tanh(), Linear]``: cut at 1, the first stage has no parameters at all."""
    torch.manual_seed(seed)
    return TinyModel([torch.nn.Tanh(), torch.nn.Linear(IN, OUT).double()], _batch, torch.nn.functional.mse_loss)


def dropout_model(seed: int = 0) -> TinyModel:
    """``[Linear, Dropout(0.5), Linear]``: a forward that draws random numbers."""
    torch.manual_seed(seed)
    layers: list[torch.nn.Module] = [torch.nn.Linear(IN, WIDTH).double(), torch.nn.Dropout(0.5),
                                     torch.nn.Linear(WIDTH, OUT).double()]  # fmt: skip
    return TinyModel(layers, _batch, torch.nn.functional.mse_loss)


def tiny_model(num_layers: int = 6, seed: int = 0) -> TinyModel:
    """``num_layers`` layers: Linear+Tanh blocks, the last a plain Linear."""
    torch.manual_seed(seed)
    dims = [IN] + [WIDTH] * (num_layers - 1) + [OUT]
    layers: list[torch.nn.Module] = []
    for i, (a, b) in enumerate(zip(dims, dims[1:], strict=False)):
        lin = torch.nn.Linear(a, b).double()
        layers.append(lin if i == num_layers - 1 else torch.nn.Sequential(lin, torch.nn.Tanh()))
    return TinyModel(layers, _batch, torch.nn.functional.mse_loss)


def reference_grads(model: TinyModel, batch: int, batch_seed: int) -> dict[str, torch.Tensor]:
    """Full-batch mean-loss gradients in one process, named like the runtime names them."""
    net = torch.nn.Sequential(*model.layers)
    x, y = model.make_batch(batch, torch.Generator().manual_seed(batch_seed))
    net.zero_grad()
    model.loss(net(x), y).backward()
    return {n: p.grad.detach().clone() for n, p in net.named_parameters() if p.grad is not None}


Spec = tuple[tuple[int, int], Sequence[int], Sequence[int] | None, int]
"""``(layers, forward, backward or None, warmup)``: one stage on its own rank (docs/model.md 6.1)."""


def plan_of(batch: int, *specs: Spec) -> Plan:
    """Stage ``j`` on rank ``j``, ordered by the warmup rule; recompute when a backward list is given."""
    stages = tuple(Stage(layers=lay, rank=j, forward=tuple(fwd), backward=tuple(bwd if bwd is not None else fwd),
                         recompute=bwd is not None)
                   for j, (lay, fwd, bwd, _) in enumerate(specs))  # fmt: skip
    actions = tuple(warmup_rule(j, st.forward, st.backward, w) for j, (st, (_, _, _, w)) in
                    enumerate(zip(stages, specs, strict=True)))  # fmt: skip
    return validate_plan(Plan(global_batch=batch, ranks=len(stages), stages=stages, actions=actions))


def placed(batch: int, cuts: Sequence[int], ranks_of: Sequence[int], forward: Sequence[Sequence[int]],
           actions: Sequence[str], backward: Sequence[Sequence[int]] | None = None,
           recompute: Sequence[bool] | None = None) -> Plan:  # fmt: skip
    """A plan/2 from cut points, each stage's rank, its lists and every rank's actions as text."""
    acts = [parse_actions(a) for a in actions]
    return validate_plan(placed_plan(cuts, ranks_of, batch, forward, acts, backward, recompute))


def peer_plan(name: str, ranks: int, stages_per_rank: int, microbatches: int, batch: int, layers: int) -> Plan:
    """torch's schedule ``name`` with equal microbatches and layers split as evenly as possible."""
    peer = PEER_SCHEDULES[name]
    S = ranks * stages_per_rank
    cuts = [round(j * layers / S) for j in range(S + 1)]
    sizes = equal_split(batch, microbatches)
    return validate_plan(placed_plan(cuts, peer.stage_ranks(ranks, stages_per_rank), batch, [sizes] * S,
                                     peer.generate(ranks, stages_per_rank, microbatches)))  # fmt: skip


class _Done:
    """A send that completed when it was posted (the queue holds a copy)."""

    def wait(self) -> None:
        return None

    def is_completed(self) -> bool:
        return True


class _Pending:
    def __init__(self, q: queue.Queue[torch.Tensor], buffer: torch.Tensor, comm: QueueComm) -> None:
        self.q, self.buffer, self.comm, self.done = q, buffer, comm, False

    def wait(self) -> None:
        if not self.done:
            self.buffer.copy_(self.q.get(timeout=30))
            self.done = True
            self.comm.outstanding -= 1

    def is_completed(self) -> bool:
        return self.done


class QueueHub:
    """In-process stand-in for torch.distributed: one queue per (sender, receiver, tag)."""

    def __init__(self, ranks: int) -> None:
        self.queues: dict[tuple[int, int, int], queue.Queue[torch.Tensor]] = {}
        self.lock = threading.Lock()
        self.barrier = threading.Barrier(ranks)

    def channel(self, src: int, dst: int, tag: int) -> queue.Queue[torch.Tensor]:
        with self.lock:
            return self.queues.setdefault((src, dst, tag), queue.Queue())

    def comm(self, rank: int) -> QueueComm:
        return QueueComm(self, rank)


class QueueComm:
    """The :class:`umsearch.runtime.comm.Comm` of one rank on a :class:`QueueHub`."""

    def __init__(self, hub: QueueHub, rank: int) -> None:
        self.hub, self.rank = hub, rank
        self.sent: list[tuple[int, int, tuple[int, ...]]] = []  # (dst, tag, shape)
        self.outstanding = 0  # receives posted and not yet waited for
        self.max_outstanding = 0

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def isend(self, dst: int, tensor: torch.Tensor, tag: int) -> _Done:
        self.sent.append((dst, tag, tuple(tensor.shape)))
        self.hub.channel(self.rank, dst, tag).put(tensor.detach().clone())
        return _Done()

    def irecv(self, src: int, buffer: torch.Tensor, tag: int) -> _Pending:
        self.outstanding += 1
        self.max_outstanding = max(self.max_outstanding, self.outstanding)
        return _Pending(self.hub.channel(src, self.rank, tag), buffer, self)

    def barrier(self) -> None:
        self.hub.barrier.wait(timeout=30)


def rank_modules(plan: Plan, model: TinyModel, rank: int) -> list[torch.nn.Sequential]:
    """The stage modules rank ``rank`` holds, in stage order."""
    from umsearch.runtime.model_source import stage_module

    return [stage_module(model, plan.stages[j].lo, plan.stages[j].hi) for j in plan.stages_of(rank)]


def run_threaded(plan: Plan, model: TinyModel, batch_seed: int, steps: int = 1,
                 lr: float | None = None) -> tuple[dict[str, torch.Tensor], list[float | None], list[QueueComm]]:  # fmt: skip
    """Run ``plan`` with one thread per rank on queues; (grads, losses per step, comms)."""
    from umsearch.runtime.executor import StageExecutor

    R = plan.ranks
    hub = QueueHub(R)
    comms = [hub.comm(r) for r in range(R)]
    grads: dict[str, torch.Tensor] = {}
    losses: list[float | None] = [None] * steps
    errors: list[BaseException] = []

    def body(r: int) -> None:
        try:
            modules = rank_modules(plan, model, r)
            params = [p for m in modules for p in m.parameters()]
            opt = torch.optim.SGD(params, lr=lr) if lr is not None and params else None
            ex = StageExecutor(plan, r, modules, model.loss, comms[r], optimizer=opt)
            for step in range(steps):
                x, y = model.make_batch(plan.global_batch, torch.Generator().manual_seed(batch_seed + step))
                stats = ex.run_iteration(x if ex.needs_inputs else None, y if ex.needs_targets else None)
                if ex.needs_targets:
                    losses[step] = stats.loss
            grads.update({n: p.grad.clone() for m in modules for n, p in m.named_parameters() if p.grad is not None})
        except BaseException as exc:  # noqa: BLE001 - surfaced to the test below
            errors.append(exc)
            hub.barrier.abort()

    run_threads(body, R, errors)
    return grads, losses, comms


def multi_plan_worker(rank: int, world: int, jobs: list[tuple[Plan, Any]], factory: Any) -> list[Any]:
    """Launcher target running several (checked Plan, RunConfig) jobs in one set of processes (saves start-up)."""
    from umsearch.runtime.worker import stage_worker

    return [stage_worker(rank, world, plan, factory, cfg) for plan, cfg in jobs]


def failing_worker(rank: int, world: int, bad_rank: int) -> int:
    """Rank ``bad_rank`` fails at once; the others wait for a message it never sends."""
    import torch.distributed as dist

    if rank == bad_rank:
        raise ValueError(f"boom on rank {rank}")
    buf = torch.zeros(1)
    dist.recv(buf, src=bad_rank)
    return rank


def sleeping_worker(rank: int, world: int, seconds: float, pid_dir: str) -> int:
    """Every rank notes its pid in ``pid_dir``, then sleeps (a stand-in for a stuck pipeline)."""
    import os
    import time
    from pathlib import Path

    (Path(pid_dir) / f"{rank}.pid").write_text(str(os.getpid()))
    time.sleep(seconds)
    return rank


MLP_SPEC: dict[str, Any] = {"source": "mlp", "args": {"width": 16}}
"""A small zoo model for the end-to-end tests; its layer count comes from the zoo itself."""


def zoo_two_stage_plan(spec: dict[str, Any] = MLP_SPEC, batch: int = 8) -> Plan:
    """A 2-stage plan with unequal microbatches over the whole of ``spec``'s layers."""
    from umsearch.nn.models import ModelSpec, build_model

    L = len(build_model(ModelSpec.from_json(spec)).layers)
    cut = L // 2
    return plan_of(batch, ((0, cut), [2, batch - 2], None, 2), ((cut, L), [4, batch - 4], None, 1))


def run_threads(body: Any, n: int, errors: list[BaseException]) -> None:
    """``body(r)`` for r in 0..n-1, one thread each (ranks in one process); the first error any raised is raised."""
    threads = [threading.Thread(target=body, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    if errors:
        raise errors[0]
