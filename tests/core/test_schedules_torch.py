"""umsearch's peer schedules against torch.distributed.pipelining's own (docs/model.md 6.2).

No process group is needed: torch's schedule constructors only read a few
attributes of their stage objects (``num_stages``, ``group_size``,
``group_rank``, ``submod``), so small stand-ins build every schedule, and
the same stand-ins, recording the compute calls made on them, run torch's
own ``_step_microbatches`` (the code a real step runs) with every send and
receive empty. Two orders of torch's are compared with ours, per rank and
action for action (idle steps, communication, UNSHARD/RESHARD and
REDUCE_GRAD dropped):

- the recorded order, ``schedule.pipeline_order``;
- the executed order, what ``_step_microbatches`` actually calls
  ``forward_one_chunk`` / ``backward_one_chunk`` / ``backward_weight_one_chunk``
  with.

They agree everywhere except one place, where torch's record is wrong and
ours follows what it executes. ``Schedule1F1B._get_pipeline_order`` in torch
2.13 numbers the last rank's forwards from 1: for every ``R >= 1`` and
``M >= R`` the last rank's recorded list is ``F1 B0 F2 B1 ... FM B(M-1)``
(``FM`` does not exist), while ``Schedule1F1B._step_microbatches`` runs
``F0 B0 F1 B1 ... F(M-1) B(M-1)`` there (its warmup is
``min(M, num_stages - stage_index)`` = 1 forward, counted from 0). Its
other ranks are recorded correctly. A single-stage schedule never
validates or runs its ``pipeline_order``, which is why torch does not
notice; :func:`test_1f1b_recorded_order_bug` pins the discrepancy so a torch
upgrade that fixes it shows up here.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

pytest.importorskip("torch.distributed.pipelining")

from torch.distributed.pipelining import schedules as tps  # noqa: E402
from torch.distributed.pipelining._utils import generate_stage_to_rank_mapping  # noqa: E402

from umsearch.core.actions import Action, format_actions  # noqa: E402
from umsearch.core.schedules import PEER_SCHEDULES, PeerSchedule, PlacementKind, placement  # noqa: E402

RANKS = (1, 2, 3, 4)
STAGES_PER_RANK = (1, 2, 3)
MICROBATCHES = (1, 2, 3, 4, 5, 6, 7, 8, 9, 12)
SHAPES = list(itertools.product(RANKS, STAGES_PER_RANK, MICROBATCHES))
COMPUTE = {"F", "B", "I", "W"}


class Recorder:
    """A stand-in pipeline stage: the attributes torch's schedules read, and a log of compute calls."""

    def __init__(self, stage_index: int, num_stages: int, group_size: int, group_rank: int,
                 log: list[Action]) -> None:  # fmt: skip
        self.stage_index = stage_index
        self.num_stages = num_stages
        self.group_size = group_size
        self.group_rank = group_rank
        self.submod = None  # not an FSDP module, not compiled
        self.stage_index_to_group_rank: dict[int, int] = {}
        self.has_backward = False
        self.output_chunks: list[Any] = []
        self.log = log

    @property
    def is_first(self) -> bool:
        return self.stage_index == 0

    @property
    def is_last(self) -> bool:
        return self.stage_index == self.num_stages - 1

    # What torch's runtime calls to compute.
    def forward_one_chunk(self, mb: int, *args: Any, **kwargs: Any) -> None:
        self.log.append(Action(self.stage_index, "F", mb))

    def backward_one_chunk(self, mb: int, loss: Any = None, full_backward: bool = True,
                           last_backward: bool = False) -> None:  # fmt: skip
        self.log.append(Action(self.stage_index, "B" if full_backward else "I", mb))

    def backward_weight_one_chunk(self, mb: int, last_backward: bool = False) -> None:
        self.log.append(Action(self.stage_index, "W", mb))

    # Communication: nothing to send or receive, so every p2p batch is empty.
    def get_fwd_recv_ops(self, mb: int) -> list[Any]:
        return []

    get_fwd_send_ops = get_bwd_recv_ops = get_bwd_send_ops = get_fwd_recv_ops

    def set_local_fwd_input(self, *args: Any) -> None:
        pass

    def set_local_bwd_input(self, *args: Any) -> None:
        pass

    def get_local_bwd_output(self, mb: int) -> None:
        return None

    def perform_reduce_grad(self, factor: int) -> None:
        pass

    def scale_grads(self, factor: int) -> None:
        pass

    def clear_runtime_states(self) -> None:
        pass


def torch_class(sched: PeerSchedule) -> Any:
    cls: Any = tps.get_schedule_class(sched.name)
    assert cls.__name__ == sched.torch_class
    return cls


def build(sched: PeerSchedule, ranks: int, v: int, m: int, rank: int = 0,
          log: list[Action] | None = None) -> Any:  # fmt: skip
    """torch's schedule object for the shape, as rank ``rank`` builds it."""
    log = [] if log is None else log
    cls = torch_class(sched)
    stages = [Recorder(s, ranks * v, ranks, rank, log)
              for s, owner in enumerate(placement(sched.placement, ranks, v)) if owner == rank]  # fmt: skip
    if issubclass(cls, tps.PipelineScheduleSingle):
        if v != 1:
            # A single-stage schedule takes one stage object: more cannot even be passed.
            raise ValueError("single-stage schedule")
        return cls(stages[0], m)
    return cls(stages, m)


def ours(action: Any) -> Action | None:
    """torch's action as umsearch's, or None for idle steps and non-compute actions."""
    if action is None or action.computation_type.value not in COMPUTE:
        return None
    return Action(action.stage_index, action.computation_type.value, action.microbatch_index)


def recorded(schedule: Any, ranks: int) -> tuple[tuple[Action, ...], ...]:
    order = schedule.pipeline_order
    assert sorted(order) == list(range(ranks))
    return tuple(tuple(a for a in map(ours, order[r]) if a is not None) for r in range(ranks))


def executed(sched: PeerSchedule, ranks: int, v: int, m: int) -> tuple[tuple[Action, ...], ...]:
    """What torch's runtime computes on each rank: its _step_microbatches run on Recorders."""
    out = []
    for rank in range(ranks):
        log: list[Action] = []
        schedule = build(sched, ranks, v, m, rank, log)
        # Stage initialisation exchanges shapes with the neighbours; there are none.
        schedule._initialize_stage = schedule._initialize_stages = lambda *a, **k: None
        schedule._step_microbatches()
        out.append(tuple(log))
    return tuple(out)


def accepted_shapes(name: str) -> list[tuple[int, int, int]]:
    sched = PEER_SCHEDULES[name]
    return [s for s in SHAPES if sched.accepts(*s) is None]


CASES = [(name, *shape) for name in PEER_SCHEDULES for shape in accepted_shapes(name)]


@pytest.mark.parametrize("name", list(PEER_SCHEDULES))
def test_accepts_what_torch_accepts(name: str) -> None:
    sched = PEER_SCHEDULES[name]
    for ranks, v, m in SHAPES:
        try:
            build(sched, ranks, v, m)
        except ValueError as err:
            torch_reason: str | None = str(err)
        else:
            torch_reason = None
        ours_reason = sched.accepts(ranks, v, m)
        assert (ours_reason is None) == (torch_reason is None), (
            name,
            ranks,
            v,
            m,
            ours_reason,
            torch_reason,
        )


@pytest.mark.parametrize(("name", "ranks", "v", "m"), CASES)
def test_equals_torch_executed_order(name: str, ranks: int, v: int, m: int) -> None:
    sched = PEER_SCHEDULES[name]
    mine = sched.generate(ranks, v, m)
    theirs = executed(sched, ranks, v, m)
    for r in range(ranks):
        assert format_actions(mine[r]) == format_actions(theirs[r]), f"rank {r}"


@pytest.mark.parametrize(("name", "ranks", "v", "m"), CASES)
def test_equals_torch_recorded_order(name: str, ranks: int, v: int, m: int) -> None:
    sched = PEER_SCHEDULES[name]
    mine = sched.generate(ranks, v, m)
    theirs = recorded(build(sched, ranks, v, m), ranks)
    for r in range(ranks):
        if name == "1F1B" and r == ranks - 1:
            continue  # torch's record is wrong there: see test_1f1b_recorded_order_bug
        assert format_actions(mine[r]) == format_actions(theirs[r]), f"rank {r}"


@pytest.mark.parametrize(("ranks", "m"), [(r, m) for r in RANKS for m in MICROBATCHES if m >= r])
def test_1f1b_recorded_order_bug(ranks: int, m: int) -> None:
    # torch 2.13 records the last rank's forwards as F1..FM; it executes F0..F(M-1).
    sched = PEER_SCHEDULES["1F1B"]
    last = sched.generate(ranks, 1, m)[-1]
    theirs = recorded(build(sched, ranks, 1, m), ranks)[-1]
    shifted = tuple(a._replace(mb=a.mb + 1) if a.kind == "F" else a for a in last)
    assert theirs == shifted
    assert executed(sched, ranks, 1, m)[-1] == last


@pytest.mark.parametrize(
    ("name", "ranks", "v", "m"), [c for c in CASES if c[0] != "1F1B" and c[0] != "GPipe"]
)
def test_runtime_stage_mapping_is_our_placement(name: str, ranks: int, v: int, m: int) -> None:
    # The multi-stage runtime infers each stage's rank from the lists; it must be ours.
    sched = PEER_SCHEDULES[name]
    schedule = build(sched, ranks, v, m)
    mapping = schedule.stage_index_to_group_rank
    assert tuple(mapping[s] for s in range(ranks * v)) == sched.stage_ranks(ranks, v)


@pytest.mark.parametrize(("ranks", "v"), list(itertools.product(RANKS, STAGES_PER_RANK)))
def test_placement_matches_torch(ranks: int, v: int) -> None:
    styles: tuple[tuple[PlacementKind, str], ...] = (("loop", "loop"), ("vshape", "v"))
    for kind, style in styles:
        mapping = generate_stage_to_rank_mapping(ranks, ranks * v, style=style)
        assert placement(kind, ranks, v) == tuple(mapping[s] for s in range(ranks * v))
