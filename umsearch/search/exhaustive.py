"""The exact optimum of tiny instances: the ground truth the search is tested against.

Every structure (chunks per rank and placement, layer cuts, each stage's
microbatch list (forward = backward, no recompute), whether each stage splits
its backwards) and, for each, every valid action order of every rank, found
by branch and bound:

- A partial schedule commits each rank to its next action in simulated-time
  order (the rank that is free first commits next). An action whose
  producers have not run yet blocks its rank until they do; when every rank
  with actions left is blocked, that branch deadlocks and is dropped. So
  every deadlock-free combination of rank lists is reached exactly once.
- A branch is cut when its time so far plus each rank's remaining work
  cannot beat the best plan found; structures whose lower bound (critical
  path and busiest rank) cannot beat it are skipped whole.

Exponential, on purpose: for instances of 2 ranks, a few stages and B of a
few samples. Durations and memory come from the reference simulator.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator

from umsearch.core.actions import Action
from umsearch.core.cost import CostModel
from umsearch.core.deps import Dependencies
from umsearch.core.plan import Plan, Stage
from umsearch.core.samples import spans
from umsearch.errors import SearchSpaceError
from umsearch.search.genome import Rules
from umsearch.search.partition import all_cuts
from umsearch.sim.reference import ActionTiming, hand_offs, simulate

MAX_STRUCTURES = 20_000
"""Most structures :func:`exhaustive_optimum` enumerates."""


def compositions(batch: int, max_parts: int) -> Iterator[tuple[int, ...]]:
    """Every ordered way to write ``batch`` as a sum of at most ``max_parts`` positive sizes."""
    for k in range(1, min(batch, max_parts) + 1):
        for cut in itertools.combinations(range(1, batch), k - 1):
            bounds = (0, *cut, batch)
            yield tuple(b - a for a, b in itertools.pairwise(bounds))


def structures(rules: Rules, max_parts: int) -> Iterator[Plan]:
    """Every structure as a plan with empty action lists."""
    lists = [c for c in compositions(rules.batch, max_parts) if all(v in rules.allowed for v in c[:-1])]
    for v in rules.stages_per_rank:
        kinds = rules.placements if v > 1 else ("loop",)
        for kind in kinds:
            ranks = rules.placement_of(v, kind)
            S = len(ranks)
            for cuts in all_cuts(rules.num_layers, S):
                for combo in itertools.product(lists, repeat=S):
                    yield Plan(global_batch=rules.batch, ranks=rules.ranks, actions=((),) * rules.ranks,
                               stages=tuple(Stage(layers=(cuts[j], cuts[j + 1]), rank=ranks[j], forward=combo[j],
                                                  backward=combo[j]) for j in range(S)))  # fmt: skip


class _Search:
    """Branch and bound over the action orders of one structure with fixed splits."""

    def __init__(self, plan: Plan, split: tuple[bool, ...], cost: CostModel, best: float,
                 memory_limit: float = math.inf) -> None:  # fmt: skip
        self.plan, self.cost, self.best = plan, cost, best
        self.best_lists: tuple[tuple[Action, ...], ...] | None = None
        acts: list[list[Action]] = [[] for _ in range(plan.ranks)]
        for j, st in enumerate(plan.stages):
            acts[st.rank] += [Action(j, "F", k) for k in range(len(st.forward))]
            for k in range(len(st.backward)):
                acts[st.rank] += [Action(j, "I", k), Action(j, "W", k)] if split[j] else [Action(j, "B", k)]
        self.todo = acts
        self.full = Plan(global_batch=plan.global_batch, ranks=plan.ranks, stages=plan.stages,
                         actions=tuple(tuple(a) for a in acts))  # fmt: skip
        self.deps = Dependencies(self.full)
        self.timing = ActionTiming(self.full, cost, self.deps)
        self.dur = {a: self.timing.duration(a) for r in acts for a in r}
        # Memory depends on each rank's list order alone: tracked as actions are committed.
        self.room = [memory_limit - cost.state_factor * cost.rank_param_bytes([(plan.stages[j].lo, plan.stages[j].hi)
                                                                               for j in plan.stages_of(r)])
                     for r in range(plan.ranks)]  # fmt: skip
        self.handed = hand_offs(plan)
        self.delta = {a: self._delta(a) for r in acts for a in r}
        held = [spans(st.forward, st.backward) for st in plan.stages]
        # What must precede an action in its own list (docs/model.md 3).
        self.own = {a: a.must_follow(lambda j, k: held[j][k]) for r in acts for a in r}

    def _delta(self, a: Action) -> tuple[float, float]:
        """(added before the peak, released after) by ``a``: docs/model.md section 5, with its microbatch's
        sizes (:meth:`~umsearch.core.cost.CostModel.microbatch_memory`: hand-offs and the fixed stash included)."""
        j, st = a.stage, self.plan.stages[a.stage]
        n = a.size(st.forward, st.backward)
        hand_in = j > 0 and self.handed[j - 1]
        return a.memory(st.recompute, *self.cost.microbatch_memory(st.lo, st.hi, st.recompute, hand_in,
                                                                    self.handed[j], n))  # fmt: skip

    def run(self) -> tuple[float, tuple[tuple[Action, ...], ...] | None]:
        R = self.plan.ranks
        left = [sum(self.dur[a] for a in self.todo[r]) for r in range(R)]
        self._dfs([[] for _ in range(R)], [0.0] * R, [None] * R, {}, left, [0.0] * R)
        return self.best, self.best_lists

    def _start(self, r: int, a: Action, free: list[float], deliv: dict[Action, float], left: list[float]) -> None:
        start = max([free[r], *(deliv[p] for p in self.deps.producers(a))])
        stop = start + self.dur[a]
        self._deliver(a, r, stop, deliv)
        free[r], left[r] = stop, left[r] - self.dur[a]

    def _dfs(self, lists: list[list[Action]], free: list[float], blocked: list[Action | None],
             deliv: dict[Action, float], left: list[float], level: list[float]) -> None:  # fmt: skip
        R = self.plan.ranks
        free, blocked, deliv, left = list(free), list(blocked), dict(deliv), list(left)
        moved = True
        while moved:  # start every committed action whose inputs have now been sent
            moved = False
            for r in range(R):
                a = blocked[r]
                if a is not None and all(p in deliv for p in self.deps.producers(a)):
                    self._start(r, a, free, deliv, left)
                    blocked[r], moved = None, True
        if max(free[r] + left[r] for r in range(R)) >= self.best * (1 - 1e-12):
            return
        open_ = [r for r in range(R) if blocked[r] is None and len(lists[r]) < len(self.todo[r])]
        if not open_:
            if any(b is not None for b in blocked):
                return  # every rank with work left waits on another: a deadlock
            self.best, self.best_lists = max(free), tuple(tuple(x) for x in lists)
            return
        r = min(open_, key=lambda q: (free[q], q))  # the rank free first commits to its next action
        done = set(lists[r])
        for a in self.todo[r]:
            if a in done or not all(p in done for p in self.own.get(a, ())):
                continue
            add, rel = self.delta[a]
            if level[r] + add > self.room[r]:
                continue  # over the memory limit
            lv = list(level)
            lv[r] += add - rel
            lists[r].append(a)
            if all(p in deliv for p in self.deps.producers(a)):
                f2, d2, l2 = list(free), dict(deliv), list(left)
                self._start(r, a, f2, d2, l2)
                self._dfs(lists, f2, blocked, d2, l2, lv)
            else:
                b2 = list(blocked)
                b2[r] = a
                self._dfs(lists, free, b2, deliv, left, lv)
            lists[r].pop()

    def _deliver(self, a: Action, r: int, stop: float, deliv: dict[Action, float]) -> None:
        to = self.timing.consumer(a)
        if to is None:
            return
        if not self.timing.cross_rank(a, to):
            deliv[a] = stop
            return
        link = (r, self.plan.stages[to].rank)
        # Messages on a link leave in the sender's order: after the link's last arrival.
        last = max((t for b, t in deliv.items() if self._link(b) == link), default=0.0)
        deliv[a] = max(stop, last) + self.timing.transfer(a)

    def _link(self, b: Action) -> tuple[int, int] | None:
        to = self.timing.consumer(b)
        if to is None or not self.timing.cross_rank(b, to):
            return None
        return self.plan.stages[b.stage].rank, self.plan.stages[to].rank


def _structure_bound(plan: Plan, split: tuple[bool, ...], cost: CostModel) -> float:
    """A quick lower bound of any order of this structure: the busiest rank, and sample 0's round trip."""
    t = _Search(plan, split, cost, math.inf)
    busy = max(sum(t.dur[a] for a in t.todo[r]) for r in range(plan.ranks))
    first = sum(t.dur[Action(j, "F", 0)] for j in range(plan.num_stages))
    return max(busy, first)


def exhaustive_optimum(cost: CostModel, rules: Rules, memory_limit: float, *, max_parts: int = 3,
                       incumbent: float = math.inf) -> tuple[Plan, float] | None:  # fmt: skip
    """The fastest plan that fits ``memory_limit`` over every structure and order (module docstring).

    ``incumbent`` (a known plan's time) only speeds the search up; refuses instances of more than
    :data:`MAX_STRUCTURES` structures.
    """
    plans = list(structures(rules, max_parts))
    total = sum(2 ** p.num_stages if rules.split else 1 for p in plans)
    if total > MAX_STRUCTURES:
        raise SearchSpaceError(f"exhaustive search over {total} structures exceeds {MAX_STRUCTURES}; shrink the instance")
    best_t, best_plan = incumbent, None
    for plan in plans:
        for split in itertools.product([False, True] if rules.split else [False], repeat=plan.num_stages):
            if _structure_bound(plan, split, cost) >= best_t:
                continue
            t, lists = _Search(plan, split, cost, best_t, memory_limit).run()
            if lists is not None:
                best_t, best_plan = t, Plan(global_batch=plan.global_batch, ranks=plan.ranks, stages=plan.stages,
                                            actions=lists)  # fmt: skip
    if best_plan is None:
        return None
    res = simulate(best_plan, cost)
    assert res.iteration_ms is not None and math.isclose(res.iteration_ms, best_t, rel_tol=1e-9)
    return best_plan, best_t
