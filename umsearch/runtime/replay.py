"""Replay one rank of a plan alone, on one device: its own work, measured, against the prediction.

A real run times a rank's actions among its peers, so what a rank measures
mixes its own compute with theirs (a slow neighbour, a shared link, cores
shared between processes). :func:`replay_rank` runs one rank's action list
with no peer at all, through the executor's own code path:

- the rank builds its stages exactly as ``umsearch run`` does
  (:class:`ReplaySession` is a :class:`~umsearch.runtime.worker.RankSession`
  whose links are a :class:`ReplayComm`), in the run's precision, on the
  replica-0 samples of the batches ``run`` trains on;
- :class:`ReplayComm` stands in for the other ranks. A send computes its
  tensor and drops it. A receive gets a tensor of exactly the shape and dtype
  the neighbouring stage sends for that message (activations for ``F``,
  gradients for ``B``/``I``): the message's tag (:func:`umsearch.core.program.tag`)
  names the sending stage, the direction and the microbatch, the buffer the
  executor posts has the plan's size, and the contents are a deterministic
  function of the tag. A shape header (``mb = -1``) is answered with the
  header the sending stage would send: its output's sample shape, found by
  probing the stages before it on one sample
  (:func:`umsearch.runtime.shapes.probe`, under the precision's autocast),
  as the sending rank's executor does. Receives are filled when the executor
  waits for them, before the reading action's start stamp, so the fill is
  never part of an action's time;
- a data-parallel plan replays a rank of replica 0 on its
  ``plan.replica_batch`` samples, with a :class:`~umsearch.runtime.gradsync.GradSync`
  that has no process group (its ``start`` and ``finish`` do nothing).

So the rank never waits, and each action's time (the executor's
:class:`~umsearch.core.actions.ActionRecord`) is its own work. The first
iteration is also tallied (:class:`~umsearch.runtime.memory_tally.MemoryTally`:
saved tensors, parameters, gradients, optimizer states; the memory is the
same every iteration, and the later, timed ones then run without the
tally's per-tensor hooks); with more than one iteration the first is warm-up
and the medians are over the rest.

:func:`predict` gives what docs/model.md says of each rank: the simulator's
busy time, every action's duration (``F``/``B``/``I``/``W`` totals) and the
section-5 peak memory; :func:`replay_document` sets one beside the other
(``umsearch.replay/1``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import statistics
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from umsearch.core.actions import KINDS, Action
from umsearch.core.cost import CostModel
from umsearch.core.deps import Dependencies
from umsearch.core.plan import Plan
from umsearch.core.program import untag as untag  # re-exported: replay reads the program's tags
from umsearch.errors import PlanError, RuntimeExecutionError
from umsearch.nn.precision import Precision
from umsearch.runtime.comm import Handle, RankComm
from umsearch.runtime.config import RunConfig
from umsearch.runtime.executor import IterationStats
from umsearch.runtime.gradsync import GradSync
from umsearch.runtime.memory_tally import Tally, storage_bytes
from umsearch.runtime.model_source import ModelFactory, ModelLike, stage_module
from umsearch.runtime.placement import replica_worlds, world_size
from umsearch.runtime.shapes import HEADER_LEN, SampleShape, encode, probe
from umsearch.runtime.worker import GroupCache, RankSession

REPLAY_SCHEMA = "umsearch.replay/1"
"""Schema of ``replay.json``."""

SPREAD = 8
"""A received message is a slice of its pool starting at one of this many offsets (by its tag)."""


# ---------------------------------------------------------------------------------------------------- the device
def parse_device(text: str) -> torch.device:
    """``cpu``, ``cuda`` or ``cuda:N`` as a device this machine has; the error says which ones it has."""
    value = text.strip().lower()
    head, _, index = value.partition(":")
    if head not in ("cpu", "cuda") or (head == "cpu" and index) or (index and not index.isdigit()):
        raise RuntimeExecutionError(f"--device {text!r} is not a device; give cpu, cuda or cuda:N (e.g. cuda:0)")
    if head == "cpu":
        return torch.device("cpu")
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        raise RuntimeExecutionError(f"--device {text} asks for a GPU but torch {torch.__version__} sees none on this "
                                    "machine; replay on --device cpu, or run where a CUDA GPU is visible")  # fmt: skip
    i = int(index) if index else 0
    if i >= count:
        raise RuntimeExecutionError(f"--device {text}: this machine has {count} GPU(s), cuda:0..cuda:{count - 1}; "
                                    "pick one of them")  # fmt: skip
    return torch.device("cuda", i)


@contextlib.contextmanager
def _on_device(device: torch.device) -> Iterator[None]:
    """Make ``device`` the current CUDA device (the executor's clock records events on its stream)."""
    if device.type != "cuda":
        yield
        return
    with torch.cuda.device(device):
        yield


@contextlib.contextmanager
def _threads(device: torch.device, threads: int | None) -> Iterator[None]:
    """torch's CPU threads as a rank of ``run`` sets them (``--threads``), restored after."""
    if device.type != "cpu" or threads is None:
        yield
        return
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(old)


# ---------------------------------------------------------------------------------------------------- shapes
class StageShapes:
    """The sample shape of every stage's output, as the executors learn them: stage 0 from a sample of
    the model's batch, each later stage from a zero sample of its input's shape, probed on ``device``
    under the precision's autocast. Computed on first need, each stage once."""

    def __init__(self, plan: Plan, model: ModelLike, device: torch.device, precision: Precision) -> None:
        self.plan, self.model, self.device, self.precision = plan, model, device, precision
        self._out: list[SampleShape] = []

    def output(self, stage: int) -> SampleShape:
        """Sample shape (and dtype) of what stage ``stage`` sends forward."""
        while len(self._out) <= stage:
            j = len(self._out)
            st = self.plan.stages[j]
            if j == 0:
                inputs, _ = self.model.make_batch(1, torch.Generator().manual_seed(0))
                sample = inputs[:1].to(self.device)
            else:
                sample = self._out[j - 1].empty(1, self.device).zero_()
            module = stage_module(self.model, st.lo, st.hi)
            with _moved(module, self.device), self.precision.autocast(self.device):
                self._out.append(probe(module, sample, f"the output of stage {j} (layers [{st.lo}, {st.hi}))"))
        return self._out[stage]


@contextlib.contextmanager
def _moved(module: torch.nn.Module, device: torch.device) -> Iterator[None]:
    """``module`` on ``device`` for the block; back where it was after (another rank's stage stays off the GPU)."""
    first = next(iter([*module.parameters(), *module.buffers()]), None)
    home = first.device if first is not None else device
    if home != device:
        module.to(device)
    try:
        yield
    finally:
        if home != device:
            module.to(home)


# ---------------------------------------------------------------------------------------------------- the comm
class _Done:
    """A send that is over when posted: the tensor was dropped."""

    def wait(self) -> None:
        return None

    def is_completed(self) -> bool:
        return True


class _Fill:
    """A receive whose message is made when the executor waits for it (before the reader's start stamp)."""

    def __init__(self, comm: ReplayComm, buffer: torch.Tensor, tag: int) -> None:
        self.comm, self.buffer, self.tag, self.done = comm, buffer, tag, False

    def wait(self) -> None:
        if not self.done:
            self.comm.fill(self.buffer, self.tag)
            self.done = True

    def is_completed(self) -> bool:
        return self.done


class ReplayComm(RankComm):
    """The other ranks of a replayed rank: sends are dropped, receives made up (module docstring).

    A :class:`~umsearch.runtime.comm.Comm` with no process group: ``barrier`` returns at once.
    Every received message of one sample shape and dtype is a slice of one pool of random values
    (made once, of the plan's largest microbatch plus :data:`SPREAD` samples), starting at
    ``tag % SPREAD``: deterministic per message, one copy per receive.
    """

    def __init__(self, *, plan: Plan, rank: int, device: torch.device, shapes: StageShapes) -> None:
        super().__init__(rank=rank, groups={}, device=device)
        self.plan, self.shapes = plan, shapes
        self.num_stages = plan.num_stages
        self.largest = max(max((*st.forward, *st.backward)) for st in plan.stages)
        self.pools: dict[tuple[tuple[int, ...], torch.dtype], torch.Tensor] = {}
        self.headers: dict[int, SampleShape] = {}
        """Sending stage -> the shape its header said (what this rank was told)."""
        self.received = self.sent = 0
        """Messages made up / dropped (headers not counted)."""

    def isend(self, dst: int, tensor: torch.Tensor, tag: int) -> Handle:
        """Drop ``tensor`` (computed already: the send's own work is done)."""
        if untag(tag, self.num_stages)[2] >= 0:
            self.sent += 1
        return _Done()

    def irecv(self, src: int, buffer: torch.Tensor, tag: int) -> Handle:
        """A receive that makes its message when waited for."""
        return _Fill(self, buffer, tag)

    def barrier(self) -> None:
        """Nobody to wait for."""

    def fill(self, buffer: torch.Tensor, tag: int) -> None:
        """Write the message ``tag`` names into ``buffer``: a header, or a slice of the pool of its shape."""
        stage, _, mb = untag(tag, self.num_stages)
        if mb < 0:
            if buffer.numel() != HEADER_LEN or buffer.dtype != torch.int64:
                raise RuntimeExecutionError(f"a shape header is {HEADER_LEN} int64 words, the executor posted "
                                            f"{tuple(buffer.shape)} {buffer.dtype}")  # fmt: skip
            shape = self.shapes.output(stage)
            self.headers[stage] = shape
            buffer.copy_(encode(shape).to(buffer.device))
            return
        n = buffer.shape[0] if buffer.dim() else 1
        buffer.copy_(self._pool(buffer, n).narrow(0, tag % SPREAD, n).view_as(buffer))
        self.received += 1

    def _pool(self, buffer: torch.Tensor, n: int) -> torch.Tensor:
        key = (tuple(buffer.shape[1:]), buffer.dtype)
        pool = self.pools.get(key)
        if pool is None or pool.shape[0] < n + SPREAD - 1:
            size = (max(self.largest, n) + SPREAD - 1, *key[0])
            gen = torch.Generator().manual_seed(0)
            if buffer.dtype.is_floating_point or buffer.dtype.is_complex:
                values = torch.randn(size, generator=gen).to(buffer.dtype)
            else:
                values = torch.randint(0, 2, size, generator=gen).to(buffer.dtype)
            pool = self.pools[key] = values.to(buffer.device)
        return pool

    @property
    def pool_bytes(self) -> int:
        """Device bytes the pools hold (part of a device's peak, not of the rank's work)."""
        return storage_bytes(self.pools.values())


class ReplaySession(RankSession):
    """A :class:`~umsearch.runtime.worker.RankSession` (the model, stages, optimizer and executor exactly as
    ``run`` builds them) whose links are a :class:`ReplayComm` and whose data-parallel all-reduce has no
    group: one rank alone, no process group needed."""

    comm: ReplayComm | None = None

    def _groups(self, plan: Plan, world_rank: int, device: torch.device,
                cache: GroupCache) -> tuple[RankComm | None, GradSync | None]:  # fmt: skip
        shapes = StageShapes(plan, self.model, device, Precision(self.cfg.precision or "fp32"))
        self.comm = ReplayComm(plan=plan, rank=self.placement.rank, device=device, shapes=shapes) if plan.ranks > 1 else None
        sync = GradSync(placement=self.placement, group=None, replicas=plan.data_parallel) if plan.data_parallel > 1 else None
        return self.comm, sync


# ---------------------------------------------------------------------------------------------------- prediction
@dataclass(frozen=True, kw_only=True)
class RankPrediction:
    """What docs/model.md predicts for one rank."""

    busy_ms: float
    """The simulator's busy time: the sum of the rank's action durations (section 4, overheads included)."""
    action_ms: tuple[float, ...]
    """Every action's duration, in list order."""
    kind_ms: dict[str, float]
    """Total duration per action kind present (``F``, ``B``, ``I``, ``W``)."""
    peak_bytes: float
    """Section 5: state plus peak activations."""
    state_bytes: float
    """``state_factor * P``: weights, gradients and optimizer states."""
    activation_bytes: float
    """Peak stashed activations."""


def predict(plan: Plan, cost: CostModel) -> tuple[RankPrediction, ...]:
    """Per rank, the simulator's busy time and peak memory, and every action's duration."""
    from umsearch.sim.reference import ActionTiming, rank_state_bytes, simulate

    sim = simulate(plan, cost)
    if sim.busy_ms is None or sim.peak_memory_bytes is None:
        raise PlanError("the plan deadlocks: " + "; ".join(sim.blocked))
    timing = ActionTiming(plan, cost, Dependencies(plan))
    out = []
    for r, acts in enumerate(plan.actions):
        durations = tuple(timing.duration(a) for a in acts)
        kinds: dict[str, float] = {}
        for a, d in zip(acts, durations, strict=True):
            kinds[a.kind] = kinds.get(a.kind, 0.0) + d
        state = rank_state_bytes(plan, cost, r)  # a weight tied between its stages once
        peak = float(sim.peak_memory_bytes[r])
        out.append(RankPrediction(busy_ms=float(sim.busy_ms[r]), action_ms=durations, kind_ms=kinds, peak_bytes=peak,
                                  state_bytes=state, activation_bytes=peak - state))  # fmt: skip
    return tuple(out)


# ---------------------------------------------------------------------------------------------------- replay
def _busy(stats: IterationStats) -> float:
    return sum(a.end_ms - a.start_ms for a in stats.actions)


def _kinds(stats: IterationStats) -> dict[str, float]:
    out: dict[str, float] = {}
    for a in stats.actions:
        out[a.kind] = out.get(a.kind, 0.0) + (a.end_ms - a.start_ms)
    return out


@dataclass(frozen=True, kw_only=True)
class RankReplay:
    """One rank replayed: every iteration's stats, the memory tally, and the prediction when there is one."""

    rank: int
    stages: tuple[int, ...]
    device: torch.device
    steps: tuple[IterationStats, ...]
    """Every iteration (the first is warm-up when there are several)."""
    tally: Tally
    """The model's memory terms over the first iteration."""
    actions: tuple[Action, ...]
    """The rank's list in the plan."""
    prediction: RankPrediction | None = None
    pool_bytes: int = 0
    """Device bytes the made-up messages' pools held (:attr:`ReplayComm.pool_bytes`)."""
    headers: dict[int, SampleShape] = dataclasses.field(default_factory=dict)
    """Sending stage -> the sample shape its (made-up) header told this rank."""

    @property
    def kept(self) -> tuple[IterationStats, ...]:
        """The iterations after warm-up (the first), or the only one."""
        return self.steps[1:] if len(self.steps) > 1 else self.steps

    @property
    def measured_busy_ms(self) -> float:
        """The sum of the rank's action times in :attr:`median_step`: the median over the kept iterations
        (the lower middle one, an actual iteration, as ``run`` reports its median)."""
        return _busy(self.median_step)

    @property
    def measured_kind_ms(self) -> dict[str, float]:
        """Per action kind present, the (lower) median over the kept iterations of its actions' total time."""
        per = [_kinds(s) for s in self.kept]
        return {k: statistics.median_low(p.get(k, 0.0) for p in per) for k in KINDS if any(k in p for p in per)}

    @property
    def median_step(self) -> IterationStats:
        """The kept iteration of median busy time (the lower middle one: an actual iteration)."""
        ordered = sorted(self.kept, key=_busy)
        return ordered[(len(ordered) - 1) // 2]

    @property
    def device_peak_bytes(self) -> int | None:
        """CUDA only: the largest allocated device memory of any kept iteration."""
        peaks = [s.peak_memory_bytes for s in self.kept if s.peak_memory_bytes is not None]
        return max(peaks) if peaks else None

    def kind_ratios(self) -> dict[str, float | None]:
        """Measured over predicted time per action kind (None without a prediction or where it is 0)."""
        measured = self.measured_kind_ms
        pred = self.prediction.kind_ms if self.prediction is not None else {}
        return {k: (v / pred[k] if pred.get(k) else None) for k, v in measured.items()}

    def to_json(self) -> dict[str, Any]:
        """This rank's entry of ``replay.json``."""
        p = self.prediction
        measured_kinds = self.measured_kind_ms
        busy = self.measured_busy_ms
        median = self.median_step
        out: dict[str, Any] = {
            "rank": self.rank, "replica": 0, "stages": list(self.stages),
            "predicted_busy_ms": p.busy_ms if p else None, "measured_busy_ms": busy,
            "busy_ratio": busy / p.busy_ms if p and p.busy_ms > 0 else None,
            "kind_ratios": self.kind_ratios(),
            "kinds": {k: {"predicted_ms": p.kind_ms.get(k) if p else None, "measured_ms": v}
                      for k, v in measured_kinds.items()},
            "predicted_peak_bytes": p.peak_bytes if p else None, "measured_peak_bytes": self.tally.peak_bytes,
            "memory_over_prediction": bool(p and self.tally.peak_bytes > p.peak_bytes),
            "predicted_memory": {"state_bytes": p.state_bytes, "activation_peak_bytes": p.activation_bytes} if p else None,
            "measured_memory": self.tally.to_json(),
            "measured_busy_all_ms": [_busy(s) for s in self.steps],
            "actions": [{"action": r.label, "size": r.size, "measured_ms": r.end_ms - r.start_ms,
                         "predicted_ms": p.action_ms[i] if p else None}
                        for i, r in enumerate(median.actions)],
        }  # fmt: skip
        if self.device.type == "cuda":
            out["device_peak_bytes"] = self.device_peak_bytes
            out["message_pool_bytes"] = self.pool_bytes
        return out


def check_rank(plan: Plan, rank: int) -> None:
    """Raise unless ``rank`` is one of the plan's pipeline ranks."""
    if not 0 <= rank < plan.ranks:
        raise RuntimeExecutionError(f"--rank {rank} is not a rank of the plan, which has {plan.ranks} rank(s): give "
                                    f"0..{plan.ranks - 1}, or --all-ranks")  # fmt: skip


def check_steps(steps: int) -> None:
    """Raise unless ``steps`` is a positive number of iterations."""
    if steps < 1:
        raise RuntimeExecutionError(f"--steps {steps}: replay at least one iteration (e.g. --steps 3: one warm-up, "
                                    "the median of two)")  # fmt: skip


def session_config(cfg: RunConfig, device: torch.device) -> RunConfig:
    """``cfg`` with the backend whose device a rank runs on is ``device``'s type (gloo: CPU, nccl: CUDA)."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    return dataclasses.replace(cfg, launch=dataclasses.replace(cfg.launch, backend=backend))


def replay_rank(plan: Plan, factory: ModelFactory, rank: int, *, device: torch.device | str = "cpu",
                cfg: RunConfig | None = None, steps: int = 3,
                prediction: RankPrediction | None = None) -> RankReplay:  # fmt: skip
    """Run rank ``rank``'s action list alone for ``steps`` iterations on ``device`` (module docstring).

    ``factory`` builds the plan's model (as for :func:`umsearch.runtime.run_plan.run_plan`); ``cfg``
    gives the precision (``cfg.precision``, None: fp32), the seed of weights and batches, the CPU
    threads and whether to check the plan against the model; its backend follows ``device``.
    No process group is used or needed.
    """
    device = torch.device(device)
    cfg = session_config(cfg or RunConfig(), device)
    check_rank(plan, rank)
    check_steps(steps)
    with _on_device(device), _threads(device, cfg.launch.threads):
        session = ReplaySession(replica_worlds(plan)[0][rank], world_size(plan), plan, factory, cfg,
                                device=device)
        first, tally = session.tallied_step(0)
        stats = (first, *(session.step(i) for i in range(1, steps)))
    comm = session.comm
    return RankReplay(rank=rank, stages=plan.stages_of(rank), device=device, steps=stats, tally=tally,
                      actions=plan.actions[rank], prediction=prediction,
                      pool_bytes=comm.pool_bytes if comm is not None else 0,
                      headers=dict(comm.headers) if comm is not None else {})  # fmt: skip


def replay_document(replays: Sequence[RankReplay], *, steps: int, meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """``replay.json`` (``umsearch.replay/1``): one entry per replayed rank, after ``meta``."""
    return {"schema": REPLAY_SCHEMA, **(meta or {}), "steps": steps, "warmup_steps": 1 if steps > 1 else 0,
            "ranks": [r.to_json() for r in replays]}  # fmt: skip
