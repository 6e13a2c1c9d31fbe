"""The one gate every plan passes (docs/model.md sections 2, 3 and 9): :func:`validate_plan`.

A plan is checked before it is simulated, searched from, written or executed; every error names
the stage or rank, the action and the rule, in one line with the fix. Violations are invalid plans,
never deadlocks (those are :mod:`umsearch.core.deps`'s).
"""

from __future__ import annotations

from umsearch.core.actions import Action, rank_order_problem
from umsearch.core.cluster import LAYOUTS
from umsearch.core.errors import PlanError
from umsearch.core.fields import integer
from umsearch.core.plan import MAX_ACTIONS, MAX_PLAN_STAGES, MAX_RANKS, Plan
from umsearch.core.samples import spans


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
        for k in range(len(st.forward)):
            if Action(j, "F", k) not in where:
                raise PlanError(f"rank {r} never runs {Action(j, 'F', k)}: every forward microbatch runs once")
        for k in range(len(st.backward)):
            b, i, w = Action(j, "B", k), Action(j, "I", k), Action(j, "W", k)
            if b not in where and (i not in where or w not in where):
                missing = b if i not in where and w not in where else (w if i in where else i)
                raise PlanError(f"rank {r} never runs {missing}: each backward runs as B, or as I then W")
        holders[j] = spans(st.forward, st.backward)
    problem = rank_order_problem(plan.actions[r], lambda j, k: holders[j][k])
    if problem is not None:
        raise PlanError(f"rank {r}: {problem[1]}")


def _check_replicas(plan: Plan) -> None:
    """docs/model.md section 9: D divides B, a known layout, at least one device per node."""
    D, B = integer(plan.data_parallel, "data_parallel", PlanError, lo=1), plan.global_batch
    if B % D:
        raise PlanError(f"plan field data_parallel = {D} does not divide global_batch = {B}; "
                        "choose a data-parallel degree that divides the batch")  # fmt: skip
    if plan.layout not in LAYOUTS:
        raise PlanError(f"plan field layout = {plan.layout!r} is not a layout; use 'dp_inner' or 'pp_inner'")
    if not isinstance(plan.zero1, bool):
        raise PlanError(f"plan field zero1 must be true or false, got {plan.zero1!r}")
    if plan.cluster is not None and plan.cluster.gpus_per_node < 1:
        raise PlanError(f"plan field cluster.gpus_per_node = {plan.cluster.gpus_per_node} must be at least 1 "
                        "(devices per node)")  # fmt: skip


def validate_plan(plan: Plan, num_layers: int | None = None) -> Plan:
    """Check docs/model.md sections 2-3 and 9; return the plan unchanged or raise :class:`PlanError`.

    ``num_layers`` (from the profile or the model) is checked when given.
    Whether the profile has the I/W split the plan uses is
    :func:`check_profile_fits`'s question.
    """
    integer(plan.global_batch, "global_batch", PlanError, lo=1)
    integer(plan.ranks, "ranks", PlanError, lo=1)
    check_size(ranks=plan.ranks, stages=plan.num_stages, actions=sum(map(len, plan.actions)))
    _check_replicas(plan)
    _check_stages(plan)
    if len(plan.actions) != plan.ranks:
        raise PlanError(f"the plan has {len(plan.actions)} action lists for {plan.ranks} ranks; give one per rank")
    for r in range(plan.ranks):
        _check_rank_actions(plan, r)
    if num_layers is not None and plan.num_layers != num_layers:
        raise PlanError(
            f"plan covers layers [0, {plan.num_layers}) but the model has {num_layers} layers; "
            "the last stage must end at the last layer"
        )
    return plan
