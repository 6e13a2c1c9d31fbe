"""The checks of a plan (docs/model.md sections 2, 3 and 9): :func:`validate_plan`, the one public way to
check a :class:`~umsearch.core.plan.Plan` built in code.

A plan is checked before it is simulated, searched from, written or executed; every error names
the stage or rank, the action and the rule, in one line with the fix. Violations are invalid plans,
never deadlocks (those are :mod:`umsearch.core.deps`'s). A plan file is checked by its gate,
:func:`umsearch.core.loader.load_plan_file`, which calls :func:`validate_plan` once.

Checking a large plan takes seconds, and a plan passes several layers (the gate, the simulator, the
runtime's schedule); each may ask, and a plan object this process has passed already is not checked
again (:func:`validate_plan` remembers it, weakly, by identity: a :class:`Plan` is frozen).
"""

from __future__ import annotations

import weakref
from collections.abc import Container

from umsearch.core.actions import (
    BACKWARD_START,
    FOLLOWS,
    FORWARD_LIST,
    KINDS,
    Action,
    Kind,
    rank_order_problem,
)
from umsearch.core.cluster import LAYOUTS, MAX_BUCKET_MIB
from umsearch.core.field_checks import integer, number
from umsearch.core.plan import MAX_ACTIONS, MAX_PLAN_STAGES, MAX_RANKS, Plan
from umsearch.core.samples import spans
from umsearch.errors import PlanError


def check_size(*, ranks: int | None = None, stages: int | None = None, num_layers: int | None = None,
               microbatches: int | None = None, actions: int | None = None) -> None:  # fmt: skip
    """The size limits of a plan (:data:`~umsearch.core.plan.MAX_RANKS`,
    :data:`~umsearch.core.plan.MAX_PLAN_STAGES`, :data:`~umsearch.core.plan.MAX_ACTIONS`), on the
    counts given: a plan read from JSON is checked on the raw lists' lengths before any of it is
    built, so a huge file is refused in time independent of its size. ``num_layers`` (the model's)
    bounds the stages too; ``microbatches`` is the length of every stage's forward and backward
    list together, each of which needs an action."""
    if ranks is not None and ranks > MAX_RANKS:
        raise PlanError(f"plan has {ranks} ranks; at most {MAX_RANKS} are supported (the most a search plans for): "
                        "plan a shorter pipeline, with data-parallel replicas for the other devices")  # fmt: skip
    if stages is not None and stages > MAX_PLAN_STAGES:
        raise PlanError(f"plan has {stages} stages; at most {MAX_PLAN_STAGES} are supported ({MAX_RANKS} ranks of "
                        f"{MAX_PLAN_STAGES // MAX_RANKS} stages): give each stage more layers")  # fmt: skip
    if stages is not None and num_layers is not None and stages > num_layers:
        raise PlanError(f"plan has {stages} stages but the model has {num_layers} layers; a stage holds at least "
                        "one layer: give each stage more layers")  # fmt: skip
    if microbatches is not None and microbatches > MAX_ACTIONS:
        raise PlanError(f"plan's stages list {microbatches} forward and backward microbatches in all, each of which "
                        f"needs an action; at most {MAX_ACTIONS} actions are supported: use fewer, larger "
                        "microbatches")  # fmt: skip
    if actions is not None and actions > MAX_ACTIONS:
        raise PlanError(f"plan lists {actions} actions over its ranks; at most {MAX_ACTIONS} are supported: use "
                        "fewer, larger microbatches")  # fmt: skip


def _check_stages(plan: Plan) -> None:
    B, R = plan.replica_batch, plan.ranks
    D = plan.data_parallel
    total = "global_batch" if D == 1 else f"global_batch / data_parallel = {plan.global_batch} / {D}"
    if not plan.stages:
        raise PlanError("plan has no stages; give at least one in 'stages'")
    expect_lo = 0
    for j, st in enumerate(plan.stages):
        lo, hi = st.layers
        if lo != expect_lo:
            raise PlanError(
                f"plan stages[{j}].layers starts at {lo} but the previous stage ends at {expect_lo}; "
                "stages must tile the layers in order"
            )
        if hi <= lo:
            raise PlanError(f"plan stages[{j}].layers = [{lo}, {hi}] is empty; every stage needs a layer")
        expect_lo = hi
        if not 0 <= st.rank < R:
            raise PlanError(f"plan stages[{j}].rank = {st.rank} but the plan has {R} ranks (0..{R - 1})")
        for name, seq in (("forward", st.forward), ("backward", st.backward)):
            if sum(seq) != B:
                raise PlanError(
                    f"plan stages[{j}].{name} sums to {sum(seq)} but {total} is {B}; "
                    "the microbatches of every stage must cover the batch exactly"
                )
        if not st.recompute and st.backward != st.forward:
            raise PlanError(
                f"plan stages[{j}].backward differs from its forward but the stage does not recompute; "
                "set recompute: true or make them equal (autograd back-propagates whole forward microbatches)"
            )
    empty = sorted(set(range(R)) - {st.rank for st in plan.stages})
    if empty:
        raise PlanError(f"rank {empty[0]} holds no stage; every rank needs at least one (or lower 'ranks')")


def _runs(forward_list: int) -> tuple[tuple[Kind, ...], ...]:
    """The ways of :data:`RUNS` for the forward (1) or backward (0) list."""
    codes = [c for c in range(len(KINDS)) if FORWARD_LIST[c] == forward_list]

    def chain(c: int) -> tuple[int, ...]:
        before = FOLLOWS[c]
        return (*chain(before), c) if before >= 0 and FORWARD_LIST[before] == forward_list else (c,)

    return tuple(tuple(KINDS[k] for k in chain(c)) for c in codes if not any(FOLLOWS[o] == c for o in codes))


RUNS: dict[bool, tuple[tuple[Kind, ...], ...]] = {True: _runs(1), False: _runs(0)}
"""How one microbatch of a stage's forward list (True) or backward list (False) runs, read from the rules of
:mod:`umsearch.core.actions` (:data:`~umsearch.core.actions.FORWARD_LIST`,
:data:`~umsearch.core.actions.FOLLOWS`): each kind of the list that no other kind of the list follows, after
the kinds of the list it follows. A forward runs once as ``F``; a backward whole as ``B``, or split as ``I``
then ``W``."""

def gradient_kind(split: bool) -> Kind:
    """The kind that runs a backward microbatch's input-gradient part and sends the gradient: the first of
    its way, whole (``B``) or split (``I``): :data:`~umsearch.core.actions.BACKWARD_START`."""
    return KINDS[BACKWARD_START[int(split)]]


_RUNS_TEXT = {True: "every forward microbatch runs once",
              False: "each backward runs as " + ", or as ".join(" then ".join(way) for way in RUNS[False])}  # fmt: skip


def unrun(listed: Container[Action], stage: int, mb: int, forward: bool) -> Action | None:
    """The action that microbatch ``mb`` of ``stage``'s forward (or backward) list lacks among ``listed`` to
    run in one of its ways (:data:`RUNS`), or None when one way is listed whole. Of several ways, the one
    most listed names it (the first on a tie)."""
    ways = RUNS[forward]
    for way in ways:
        for kind in way:
            if Action(stage, kind, mb) not in listed:
                break
        else:
            return None
    # None runs whole: name the first action missing from the way most listed.
    best: tuple[int, Action] | None = None
    for way in ways:
        missing = [a for a in (Action(stage, kind, mb) for kind in way) if a not in listed]
        if best is None or len(way) - len(missing) > best[0]:
            best = (len(way) - len(missing), missing[0])
    assert best is not None
    return best[1]


def _check_rank_actions(plan: Plan, r: int) -> None:
    """docs/model.md section 3 for rank ``r``: the right actions, each once, then the order within the rank
    (:func:`~umsearch.core.actions.rank_order_problem`: I before W, B/I after their forwards)."""
    where: dict[Action, int] = {}
    for pos, a in enumerate(plan.actions[r]):
        if not 0 <= a.stage < plan.num_stages:
            raise PlanError(f"rank {r} lists {a} but the plan has only {plan.num_stages} stages")
        st = plan.stages[a.stage]
        if st.rank != r:
            raise PlanError(f"rank {r} lists {a} but stage {a.stage} is on rank {st.rank}")
        count = len(a.sizes(st.forward, st.backward))
        if a.mb >= count:
            which = "forward" if a.is_forward else "backward"
            raise PlanError(f"rank {r} lists {a} but stage {a.stage} has {count} {which} microbatches (0..{count - 1})")
        if a in where:
            raise PlanError(f"rank {r} lists {a} twice")
        where[a] = pos
    holders: dict[int, list[range]] = {}
    for j in plan.stages_of(r):
        st = plan.stages[j]
        for forward, count in ((True, len(st.forward)), (False, len(st.backward))):
            for k in range(count):
                missing = unrun(where, j, k, forward)
                if missing is not None:
                    raise PlanError(f"rank {r} never runs {missing}: {_RUNS_TEXT[forward]}")
        holders[j] = spans(st.forward, st.backward)
    problem = rank_order_problem(plan.actions[r], lambda j, k: holders[j][k])
    if problem is not None:
        raise PlanError(f"rank {r}: {problem[1]}")


def _check_replicas(plan: Plan) -> None:
    """docs/model.md section 9: D divides B, a known layout, a bucket cap that is a positive number, at least
    one device per node."""
    D, B = integer(plan.data_parallel, "data_parallel", PlanError, lo=1), plan.global_batch
    if B % D:
        raise PlanError(f"plan field data_parallel = {D} does not divide global_batch = {B}; "
                        "choose a data-parallel degree that divides the batch")  # fmt: skip
    if plan.layout not in LAYOUTS:
        raise PlanError(f"plan field layout = {plan.layout!r} is not a layout; use 'dp_inner' or 'pp_inner'")
    if not isinstance(plan.zero1, bool):
        raise PlanError(f"plan field zero1 must be true or false, got {plan.zero1!r}")
    if plan.bucket_mib is not None:
        number(plan.bucket_mib, "bucket_mib", PlanError, positive=True, limit=MAX_BUCKET_MIB)
    if plan.cluster is not None and plan.cluster.gpus_per_node < 1:
        raise PlanError(f"plan field cluster.gpus_per_node = {plan.cluster.gpus_per_node} must be at least 1 "
                        "(devices per node)")  # fmt: skip


_PASSED: dict[int, weakref.ref[Plan]] = {}
"""The plans this process has passed, by ``id``: a weak reference each, dropped with its plan."""


def _passed(plan: Plan) -> bool:
    ref = _PASSED.get(id(plan))
    return ref is not None and ref() is plan


def _remember(plan: Plan) -> None:
    key = id(plan)
    _PASSED[key] = weakref.ref(plan, lambda _: _PASSED.pop(key, None))


def validate_plan(plan: Plan, num_layers: int | None = None) -> Plan:
    """Check docs/model.md sections 2-3 and 9; return the plan unchanged or raise :class:`PlanError`.

    ``num_layers`` (from the profile or the model) is checked when given.
    Whether the profile has the I/W split the plan uses is
    :meth:`umsearch.core.cost.CostModel.check`'s question. A plan this process
    has passed already (the same object) is not checked again: only
    ``num_layers`` is, so a plan is checked once per process however many
    layers ask.
    """
    if not _passed(plan):
        _check(plan)
        _remember(plan)
    if num_layers is not None and plan.num_layers != num_layers:
        raise PlanError(
            f"plan covers layers [0, {plan.num_layers}) but the model has {num_layers} layers; "
            "the last stage must end at the last layer"
        )
    return plan


def _check(plan: Plan) -> None:
    """Every check of :func:`validate_plan` but the layer count: the expensive part, run once per plan."""
    integer(plan.global_batch, "global_batch", PlanError, lo=1)
    integer(plan.ranks, "ranks", PlanError, lo=1)
    check_size(ranks=plan.ranks, stages=plan.num_stages, actions=sum(map(len, plan.actions)))
    _check_replicas(plan)
    _check_stages(plan)
    if len(plan.actions) != plan.ranks:
        raise PlanError(f"the plan has {len(plan.actions)} action lists for {plan.ranks} ranks; give one per rank")
    for r in range(plan.ranks):
        _check_rank_actions(plan, r)
