"""``umsearch tune``: search, measure, refit, search again; hand over only the plan that measured fastest.

One round of the loop:

1. **propose**: search on the current (calibrated) profile; take the K best
   distinct plans (different cuts, placement or lists, not a reordering of a
   few actions) and every torch schedule at its best microbatch count and
   partition (torch's schedule classes run those), and the predicted-fastest
   peer's own plan once more through ``PlanSchedule``; the previous round's
   measured fastest contender defends its place;
2. **measure** them all on the machine in rotated rounds, every contender on
   torch's ``PipelineStage`` objects (shared where partitions agree): a plan
   through umsearch's ``PlanSchedule``, a peer through torch's own schedule
   class (:mod:`umsearch.orchestrate.contenders`);
3. **refit** the calibration on everything that ran through ``PlanSchedule`` so
   far (torch's schedules give no per-action times: their medians are compared
   against, never fitted), and predict every contender again;
4. **fit the memory limit**: under ``memory_limit`` a contender whose measured
   peak (one warm-up iteration per rank: the tally on CPU, the allocator's on
   CUDA, :mod:`umsearch.orchestrate.contenders`) exceeds it on any rank is
   dropped from the round (the fastest and the champion are picked among the
   rest), and the report says which, on which rank, measured against what: the
   search only predicts that its plans fit, and this is where torch's schedules
   meet the limit at all. No contender left is an error.

It stops when the same contender measured fastest in two consecutive rounds,
when the rounds are spent or when the next round would overrun the budget.
The answer is the contender that measured fastest in the last round, with its
95% interval, whichever runtime ran it. Ctrl-C keeps the rounds already
measured. Proposing and measuring are functions, so the same seed and the
same measurements give the same result, and the decisions can be tested with
a stand-in for the machine.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import signal
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from umsearch.core.cost import CostModel
from umsearch.core.options import check_bounds, option
from umsearch.core.plan import Plan
from umsearch.core.profile import Profile
from umsearch.errors import NoFeasiblePlanError, SearchSpaceError
from umsearch.orchestrate.contenders import ContenderMeasurement, Entry, MeasureFn, Runtime
from umsearch.orchestrate.fit import MeasuredPlan, Scales, fit_report

STOP_REPEAT = "the same contender measured fastest in two consecutive rounds"
STOP_ROUNDS = "the rounds were spent"
STOP_BUDGET = "the time budget was spent"
STOP_INTERRUPTED = "interrupted (Ctrl-C); the rounds measured before are kept"


def stopped_by(signum: int) -> str:
    """Why the loop ended when signal ``signum`` stopped it (Ctrl-C: :data:`STOP_INTERRUPTED`)."""
    if signum == signal.SIGINT:
        return STOP_INTERRUPTED
    return f"terminated by {signal.Signals(signum).name}; the rounds measured before are kept"


@dataclass(frozen=True, kw_only=True)
class TuneConfig:
    """How long and how hard to tune (``umsearch tune``'s own settings; the search and run ones it shares
    with ``search`` and ``run`` come from theirs)."""

    k: int = field(default=4, metadata=option(
        "Distinct searched plans measured per round.", kind="int", bounds=(1, 32)))  # fmt: skip
    """Distinct searched plans per round."""
    max_rounds: int = field(default=4, metadata=option(
        "Most rounds of search, measure and refit.", kind="int", bounds=(1, 100), aliases=("--rounds",)))  # fmt: skip
    """Most rounds of the loop."""
    measure_rounds: int = field(default=10, metadata=option(
        "Rotated measured rounds of every contender per round.", kind="int", bounds=(2, 10_000)))  # fmt: skip
    """Rotated measured rounds of every contender per loop round."""
    budget_min: float = field(default=30.0, metadata=option(
        "Wall-clock budget in minutes: no round starts that would end past it.", kind="float",
        bounds=(0, 7 * 24 * 60)))  # fmt: skip
    """Wall-clock budget: no round starts that would, at the last round's pace, end past it."""
    scales: Scales = field(default="stage_scale", metadata=option(
        "How the refit models layers run together in a stage.", kind="choice",
        choices=("stage_scale", "ranges", "none")))  # fmt: skip
    """How the refit models layers run together (:mod:`umsearch.orchestrate.fit`)."""
    state_factor: float = 4.0
    """Bytes of training state per parameter byte (the predictions' memory term; the search space's)."""
    memory_limit: float | None = None
    """Bytes a contender's measured peak may reach on every rank (the search space's); None: no check."""

    def __post_init__(self) -> None:
        check_bounds(self, SearchSpaceError)
        if not self.budget_min > 0:
            raise SearchSpaceError(f"--budget-min {self.budget_min}: give a positive number of minutes")


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """A contender: a plan and the runtime that runs it."""

    name: str
    plan: Plan
    runtime: Runtime
    schedule: str | None = None
    """torch's schedule name (``runtime == "torch"``)."""

    @property
    def key(self) -> str:
        """Identity across rounds: the runtime, the schedule and the exact plan."""
        text = json.dumps([self.runtime, self.schedule, self.plan.to_json()], sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


ProposeFn = Callable[[Profile], list[Candidate]]
"""``propose(profile)``: this round's contenders searched on ``profile`` (plans first, then peers)."""


@dataclass(frozen=True, kw_only=True)
class ContenderResult:
    """One contender of one round: predicted and measured."""

    candidate: Candidate
    predicted_before_ms: float | None
    """Under the profile the round searched on (None: the plan deadlocks under it)."""
    predicted_after_ms: float | None
    """Under the profile refitted after the round."""
    measured: ContenderMeasurement
    median_ms: float
    """Median of the measured rounds (barrier to the end of the optimizer step)."""
    ci95_ms: tuple[float, float]
    """Bootstrap 95% interval of that median (seeded: the same rounds give the same interval)."""

    @property
    def iteration_ms(self) -> float | None:
        """Median measured iteration (latest action end), PlanSchedule contenders only."""
        steps = self.measured.steps
        return statistics.median(s.iteration_ms for s in steps) if steps else None

    def to_json(self) -> dict[str, Any]:
        from umsearch.runtime.fidelity import drift

        c = self.candidate
        return {"name": c.name, "key": c.key, "runtime": c.runtime, "schedule": c.schedule,
                "predicted_before_ms": self.predicted_before_ms, "predicted_after_ms": self.predicted_after_ms,
                "measured_median_ms": self.median_ms, "measured_ci95_ms": list(self.ci95_ms),
                "measured_ms": list(self.measured.step_ms), "drift": drift(self.measured.step_ms),
                "measured_iteration_ms": self.iteration_ms, "measured_peak_bytes": list(self.measured.peak_bytes),
                "plan": c.plan.to_json()}  # fmt: skip

    def worst_rank(self) -> int | None:
        """The rank with the largest measured peak (the first of equals; None: no peak was measured)."""
        peaks = self.measured.peak_bytes
        return max(range(len(peaks)), key=lambda r: (peaks[r], -r)) if peaks else None


@dataclass(frozen=True, kw_only=True)
class OverLimit:
    """A contender dropped from its round: its measured peak exceeded the memory limit on ``rank``."""

    result: ContenderResult
    rank: int
    """Its rank with the largest measured peak."""
    peak_bytes: int
    limit_bytes: float

    def describe(self) -> str:
        c = self.result.candidate
        return (f"{c.name} ({c.runtime}) measured a peak of {self.peak_bytes / 2**20:.2f} MiB ({self.peak_bytes} "
                f"bytes) on rank {self.rank}, over the memory limit of {self.limit_bytes / 2**20:.2f} MiB")  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        c = self.result.candidate
        return {"name": c.name, "key": c.key, "runtime": c.runtime, "schedule": c.schedule, "rank": self.rank,
                "measured_peak_bytes": self.peak_bytes, "limit_bytes": self.limit_bytes,
                "measured_median_ms": self.result.median_ms}  # fmt: skip


def over_limit(result: ContenderResult, limit: float | None) -> OverLimit | None:
    """Why ``result`` does not fit ``limit`` (None: it fits, no limit is set or no peak was measured)."""
    rank = result.worst_rank()
    if limit is None or rank is None or result.measured.peak_bytes[rank] <= limit:
        return None
    return OverLimit(result=result, rank=rank, peak_bytes=result.measured.peak_bytes[rank], limit_bytes=limit)


def fit_limit(results: Sequence[ContenderResult], limit: float | None) -> tuple[tuple[ContenderResult, ...],
                                                                               tuple[OverLimit, ...]]:  # fmt: skip
    """``results`` split into those that fit ``limit`` on every rank and those dropped (order kept).

    Raises :class:`NoFeasiblePlanError` when none fits, naming the smallest measured peak.
    """
    over = {id(r): o for r in results if (o := over_limit(r, limit)) is not None}
    kept = tuple(r for r in results if id(r) not in over)
    if results and not kept:
        least = min(over.values(), key=lambda o: o.peak_bytes)
        raise NoFeasiblePlanError(
            f"no contender fits --memory-limit {limit:.0f} bytes as measured: the smallest measured peak was "
            f"{least.peak_bytes} bytes ({least.result.candidate.name}, rank {least.rank}); raise --memory-limit to at "
            "least that, or spread the model over more ranks (--ranks) so that each holds less")
    return kept, tuple(over.values())


@dataclass(frozen=True, kw_only=True)
class RoundResult:
    """One round of the loop."""

    index: int
    contenders: tuple[ContenderResult, ...]
    """The contenders that fit the memory limit (all of them without one): the round's field."""
    refit: dict[str, Any] | None
    """The refit's report (None when nothing ran through PlanSchedule)."""
    wall_s: float
    over_limit: tuple[OverLimit, ...] = ()
    """The contenders dropped because their measured peak exceeded the memory limit."""

    @property
    def fastest(self) -> ContenderResult:
        """The contender with the lowest measured median (ties: the first proposed)."""
        return min(self.contenders, key=lambda r: r.median_ms)


@dataclass(frozen=True, kw_only=True)
class TuneResult:
    """What the loop measured and decided."""

    rounds: tuple[RoundResult, ...]
    profile: Profile
    """The profile refitted on everything measured through PlanSchedule."""
    stopped: str
    """Why the loop ended."""
    interrupted: bool
    wall_s: float

    @property
    def winner(self) -> ContenderResult | None:
        """The contender that measured fastest in the last round (None: nothing was measured)."""
        return self.rounds[-1].fastest if self.rounds else None


@dataclass(frozen=True, kw_only=True)
class TuneProgress:
    """Where the loop is: round ``round`` (1-based) of at most ``rounds``, step ``done`` of ``total``."""

    round: int
    rounds: int
    phase: str
    done: int
    total: int


def predict_ms(plan: Plan, profile: Profile, state_factor: float = 4.0) -> float | None:
    """The reference simulator's iteration time (None on deadlock)."""
    from umsearch.sim.reference import simulate

    return simulate(plan, CostModel(profile, state_factor=state_factor)).iteration_ms


def _result(c: Candidate, before: float | None, after: float | None, m: ContenderMeasurement) -> ContenderResult:
    from umsearch.runtime.fidelity import bootstrap_median_ci

    return ContenderResult(candidate=c, predicted_before_ms=before, predicted_after_ms=after, measured=m,
                           median_ms=statistics.median(m.step_ms), ci95_ms=bootstrap_median_ci(m.step_ms))  # fmt: skip


class _Loop:
    """The loop's state across rounds."""

    def __init__(self, base: Profile, propose: ProposeFn, measure: MeasureFn, cfg: TuneConfig,
                 on_progress: Callable[[TuneProgress], None] | None) -> None:  # fmt: skip
        self.base, self.propose, self.measure, self.cfg, self.on_progress = base, propose, measure, cfg, on_progress
        self.current = base
        self.fitted: list[MeasuredPlan] = []
        self.rounds: list[RoundResult] = []
        self.names: dict[str, str] = {}

    def report(self, phase: str, done: int) -> None:
        if self.on_progress is not None:
            self.on_progress(TuneProgress(round=len(self.rounds) + 1, rounds=self.cfg.max_rounds, phase=phase,
                                          done=done, total=3))  # fmt: skip

    def named(self, c: Candidate) -> Candidate:
        """``c`` under one name for all rounds: the name it first had; a new contender whose proposed name
        an earlier one holds gets the first free ``plan N`` (umsearch's plans) or ``NAME #N`` (torch's)."""
        if c.key not in self.names:
            taken = set(self.names.values())
            name, n = c.name, 1
            while name in taken:
                n += 1
                name = f"plan {n}" if c.runtime == "umsearch" and c.name.startswith("plan ") else f"{c.name} #{n}"
            self.names[c.key] = name
        return dataclasses.replace(c, name=self.names[c.key])

    def contenders(self) -> list[Candidate]:
        """This round's proposal, and the last round's fastest when the proposal lacks it; and the plan of the
        torch schedule that measured fastest last round through PlanSchedule (the model check's other side,
        :func:`umsearch.orchestrate.tune_output.model_check`)."""
        cands = list(self.propose(self.current))
        if self.rounds:
            last = self.rounds[-1]
            cands.append(last.fastest.candidate)
            peers = [c for c in last.contenders if c.candidate.runtime == "torch"]
            if peers:
                best = min(peers, key=lambda c: c.median_ms).candidate
                cands.append(Candidate(name=f"{best.schedule} via PlanSchedule", plan=best.plan, runtime="umsearch"))
        return list({c.key: self.named(c) for c in cands}.values())

    def refit(self, index: int, cands: Sequence[Candidate], got: Sequence[ContenderMeasurement]) -> dict[str, Any] | None:
        from umsearch.orchestrate.calibration import measured_plan

        for c, m in zip(cands, got, strict=True):
            if c.runtime == "umsearch" and m.steps:
                self.fitted.append(measured_plan(f"round {index + 1}: {c.name}", c.plan, self.base, m.steps))
        if not self.fitted:
            return None
        how = {"source": "umsearch tune: the contenders that ran through PlanSchedule, every round so far",
               "measure_rounds": self.cfg.measure_rounds}  # fmt: skip
        self.current, report = fit_report(self.base, self.fitted, scales=self.cfg.scales, how=how)
        return report

    def round(self) -> RoundResult:
        start = time.monotonic()
        index = len(self.rounds)
        self.report("search", 0)
        cands = self.contenders()
        before = [predict_ms(c.plan, self.current, self.cfg.state_factor) for c in cands]
        self.report("measure", 1)
        got = self.measure([Entry(name=c.name, plan=c.plan, runtime=c.runtime, schedule=c.schedule) for c in cands],
                           self.cfg.measure_rounds)  # fmt: skip
        self.report("refit", 2)
        refit = self.refit(index, cands, got)
        after = [predict_ms(c.plan, self.current, self.cfg.state_factor) for c in cands]
        results = tuple(_result(c, b, a, m) for c, b, a, m in zip(cands, before, after, got, strict=True))
        kept, over = fit_limit(results, self.cfg.memory_limit)
        self.report("done", 3)
        return RoundResult(index=index, contenders=kept, refit=refit, wall_s=time.monotonic() - start,
                           over_limit=over)  # fmt: skip

    def stop(self, elapsed_s: float) -> str | None:
        """Why the loop ends after the last round, or None to go on."""
        r = self.rounds
        if len(r) >= 2 and r[-1].fastest.candidate.key == r[-2].fastest.candidate.key:
            return STOP_REPEAT
        if len(r) >= self.cfg.max_rounds:
            return STOP_ROUNDS
        if elapsed_s + r[-1].wall_s > self.cfg.budget_min * 60:
            return STOP_BUDGET
        return None


def tune(profile: Profile, propose: ProposeFn, measure: MeasureFn, cfg: TuneConfig | None = None, *,
         on_progress: Callable[[TuneProgress], None] | None = None) -> TuneResult:  # fmt: skip
    """Run the loop (module docstring) from ``profile``; Ctrl-C returns what was measured before it."""
    cfg = cfg or TuneConfig()
    loop = _Loop(profile, propose, measure, cfg, on_progress)
    start = time.monotonic()
    stopped, interrupted = STOP_ROUNDS, False
    try:
        while True:
            loop.rounds.append(loop.round())
            why = loop.stop(time.monotonic() - start)
            if why is not None:
                stopped = why
                break
    except KeyboardInterrupt as exc:
        stopped, interrupted = stopped_by(getattr(exc, "signum", signal.SIGINT)), True
    return TuneResult(rounds=tuple(loop.rounds), profile=loop.current, stopped=stopped, interrupted=interrupted,
                      wall_s=time.monotonic() - start)  # fmt: skip


# ------------------------------------------------------------------------------------ the default proposer
def structure(plan: Plan) -> tuple[Any, ...]:
    """What makes two plans distinct: cuts, placement, lists, recompute and split; not the action order."""
    return (tuple((st.lo, st.hi, st.rank, st.forward, st.backward, st.recompute) for st in plan.stages),
            tuple(plan.uses_split))  # fmt: skip


def distinct(plans: Sequence[tuple[float, Plan]], k: int) -> list[Plan]:
    """The ``k`` fastest of ``(predicted ms, plan)`` with distinct :func:`structure`, fastest first (stable)."""
    out: dict[tuple[Any, ...], Plan] = {}
    for _, plan in sorted(plans, key=lambda tp: tp[0]):
        out.setdefault(structure(plan), plan)
        if len(out) == k:
            break
    return list(out.values())


def search_proposer(space: Any, k: int) -> ProposeFn:
    """Search ``space`` on the profile given: its front, and when that holds fewer than ``k`` distinct
    plans, the best of a search per structure (chunks per rank, placement); plus every torch schedule's
    best plan (the search's peer baselines)."""
    from umsearch.core.schedules import PEER_SCHEDULES
    from umsearch.search.driver import run_search

    def propose(profile: Profile) -> list[Candidate]:
        result = run_search(space, profile)
        if result.interrupted:  # the search keeps Ctrl-C to itself; the loop must stop too
            raise KeyboardInterrupt
        pool = [(s.iteration_ms, s.plan) for s in result.pareto]
        if len(distinct(pool, k)) < k:
            structs = [(v, p) for v in space.schedule.stages_per_rank for p in (space.schedule.placements if v > 1 else ("loop",))]
            for v, p in structs:
                sub = dataclasses.replace(
                    space, schedule=dataclasses.replace(space.schedule, stages_per_rank=(v,), placement=p, peers=()),
                    search=dataclasses.replace(space.search, time_budget_s=space.search.time_budget_s / len(structs)))
                pool += [(s.iteration_ms, s.plan) for s in run_search(sub, profile).pareto]
        plans = [Candidate(name=f"plan {i + 1}", plan=p, runtime="umsearch") for i, p in enumerate(distinct(pool, k))]
        baselines = {n: b for n, b in result.baselines.items() if n in PEER_SCHEDULES and b is not None}
        peers = [Candidate(name=f"torch {n}", plan=b.plan, runtime="torch", schedule=n) for n, b in baselines.items()]
        # The predicted-fastest peer's own plan through PlanSchedule: the model's ratio is checked on the runtime
        # it describes (tune_output.model_check); torch's class on the same stages is compared against.
        own = [Candidate(name=f"{n} via PlanSchedule", plan=b.plan, runtime="umsearch")
               for n, b in sorted(baselines.items(), key=lambda nb: nb[1].iteration_ms)[:1]]  # fmt: skip
        return plans + own + peers

    return propose


def tune_on_machine(profile: Profile, space: Any, factory: Any, cfg: TuneConfig, run_cfg: Any, *,
                    on_progress: Callable[[TuneProgress], None] | None = None) -> TuneResult:  # fmt: skip
    """:func:`tune` with the search of ``space`` proposing and this machine measuring (``factory`` builds
    the model in every rank; ``run_cfg`` is a :class:`~umsearch.runtime.config.RunConfig`)."""
    from umsearch.orchestrate.calibration import require_this_machine
    from umsearch.orchestrate.contenders import machine
    from umsearch.runtime.preflight import backend_device_type

    require_this_machine(profile, "tune", device_type=backend_device_type(run_cfg.launch.backend),
                         gpus_needed=space.cluster.devices if space.cluster is not None else space.ranks)  # fmt: skip
    return tune(profile, search_proposer(space, cfg.k), machine(factory, run_cfg), cfg, on_progress=on_progress)


def tune_meta(space: Any, cfg: TuneConfig, run_cfg: Any, profile_path: str) -> dict[str, Any]:
    """The settings ``tune.json`` records (what to rerun it with)."""
    from umsearch.core.profile import file_sha256

    return {"profile": profile_path, "profile_sha256": file_sha256(profile_path), "ranks": space.ranks,
            "global_batch": space.global_batch, "seed": space.search.seed, "state_factor": space.state_factor,
            "search_time_budget_s": space.search.time_budget_s, "search_space": space.to_json(),
            "config": dataclasses.asdict(cfg), "backend": run_cfg.launch.backend, "threads": run_cfg.launch.threads,
            "warmup_steps": run_cfg.warmup_steps}  # fmt: skip
