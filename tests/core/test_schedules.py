"""The schedule generators of docs/model.md section 6: closed forms, the section 8 examples, section 3's rules.

Equality with torch.distributed.pipelining's own orders is checked in
``test_schedules_torch.py``; everything here is pure Python.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from itertools import accumulate

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from umsearch.core import samples
from umsearch.core.actions import Action, format_actions, parse_actions
from umsearch.core.schedules import (
    PEER_SCHEDULES,
    PeerSchedule,
    gpipe,
    interleaved_1f1b,
    interleaved_zero_bubble,
    looped_bfs,
    one_f_one_b,
    placement,
    warmup_rule,
    zbv_zero_bubble,
)

RankLists = Sequence[Sequence[Action]]


# ---------------------------------------------------------------------------
# Checkers shared by the tests
# ---------------------------------------------------------------------------


def check_section3(actions: RankLists, stage_ranks: Sequence[int], microbatches: int) -> None:
    """docs/model.md section 3 for equal microbatches (forward k holds exactly backward k's samples).

    Every rank lists only its own stages; every stage: each forward once,
    each backward as B alone or as I then W, each once, B/I after the
    forward of its microbatch; nothing else.
    """
    assert len(actions) == max(stage_ranks) + 1
    for r, row in enumerate(actions):
        assert len(set(row)) == len(row), f"rank {r} repeats an action"
        mine = {s for s, owner in enumerate(stage_ranks) if owner == r}
        assert {a.stage for a in row} == mine, f"rank {r} runs stages it does not hold"
        pos = {a: i for i, a in enumerate(row)}
        for s in mine:
            for k in range(microbatches):
                f = pos[Action(s, "F", k)]
                b, i, w = Action(s, "B", k), Action(s, "I", k), Action(s, "W", k)
                if b in pos:
                    assert i not in pos and w not in pos, f"{b} and a split backward"
                    assert f < pos[b], f"{b} before its forward on rank {r}"
                else:
                    assert f < pos[i] < pos[w], (
                        f"rank {r}: F, I, W of stage {s} mb {k} out of order"
                    )
        expected = sum(1 for s in mine for _ in range(microbatches))
        kinds = {"F": 0, "B": 0, "I": 0, "W": 0}
        for a in row:
            assert 0 <= a.mb < microbatches
            kinds[a.kind] += 1
        assert kinds["F"] == expected and kinds["B"] + kinds["I"] == expected
        assert kinds["I"] == kinds["W"]


def deadlocks(actions: RankLists, num_stages: int) -> bool:
    """Whether the rank lists deadlock under docs/model.md section 4's dependencies (times ignored).

    ``jFk`` needs ``(j-1)Fk``; ``jBk``/``jIk`` need ``(j+1)Bk`` or ``(j+1)Ik`` (the
    last stage's only its forward, which list order already guarantees);
    ``jWk`` needs ``jIk``, before it on the same list.
    """
    done: set[tuple[int, str, int]] = set()
    nxt = [0] * len(actions)

    def ready(a: Action) -> bool:
        if a.kind == "F":
            return a.stage == 0 or (a.stage - 1, "F", a.mb) in done
        if a.kind in ("B", "I"):
            return a.stage == num_stages - 1 or (a.stage + 1, "G", a.mb) in done
        return True

    progress = True
    while progress:
        progress = False
        for r, row in enumerate(actions):
            while nxt[r] < len(row) and ready(row[nxt[r]]):
                a = row[nxt[r]]
                done.add((a.stage, a.kind, a.mb))
                if a.kind in ("B", "I"):
                    done.add((a.stage, "G", a.mb))  # its input gradient is sent
                nxt[r] += 1
                progress = True
    return any(n < len(row) for n, row in zip(nxt, actions, strict=True))


def lists(text: str) -> tuple[tuple[Action, ...], ...]:
    return tuple(parse_actions(line) for line in text.strip().splitlines())


# ---------------------------------------------------------------------------
# docs/model.md section 8's rank lists
# ---------------------------------------------------------------------------


def test_model_md_example_3_interleaved_1f1b() -> None:
    assert interleaved_1f1b(2, 2, 4) == lists("""
        0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 2B2 2B3 0B2 0B3
        1F0 1F1 3F0 3B0 3F1 3B1 1F2 1B0 1F3 1B1 3F2 3B2 3F3 3B3 1B2 1B3
    """)


def test_model_md_example_4_zbv() -> None:
    assert zbv_zero_bubble(2, 4) == lists("""
        0F0 0F1 0F2 3F0 3I0 3W0 3F1 3I1 3W1 0F3 0I0 0W0 3F2 3I2 3W2 0I1 0W1 3F3 3I3 3W3 0I2 0W2 0I3 0W3
        1F0 2F0 1F1 2F1 2I0 2W0 1F2 1I0 1W0 2F2 2I1 2W1 1F3 1I1 1W1 2F3 2I2 2W2 1I2 2I3 1I3 1W2 2W3 1W3
    """)


def test_interleaved_zero_bubble_two_ranks() -> None:
    # torch 2.13's order (also checked against torch itself): rank r lags each W by r backwards.
    assert interleaved_zero_bubble(2, 2, 4) == lists("""
        0F0 0F1 2F0 2F1 2I0 2W0 0F2 2I1 2W1 0F3 0I0 0W0 2F2 0I1 0W1 2F3 2I2 2W2 2I3 2W3 0I2 0W2 0I3 0W3
        1F0 1F1 3F0 3I0 3F1 3I1 3W0 1F2 1I0 3W1 1F3 1I1 1W0 3F2 3I2 1W1 3F3 3I3 3W2 1I2 3W3 1I3 1W2 1W3
    """)


def test_looped_bfs_two_ranks() -> None:
    # Breadth first: each stage forwards everything; backwards last stage first, last microbatch first.
    assert looped_bfs(2, 2, 2) == lists("""
        0F0 0F1 2F0 2F1 2B1 2B0 0B1 0B0
        1F0 1F1 3F0 3F1 3B1 3B0 1B1 1B0
    """)


# ---------------------------------------------------------------------------
# Closed forms
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(("ranks", "microbatches"), [(1, 1), (1, 5), (2, 1), (4, 8), (3, 7)])
def test_gpipe_closed_form(ranks: int, microbatches: int) -> None:
    m = microbatches
    expected = tuple(
        tuple([Action(r, "F", k) for k in range(m)] + [Action(r, "B", k) for k in range(m)])
        for r in range(ranks)
    )
    assert gpipe(ranks, microbatches) == expected
    # docs/model.md 6.1: GPipe is the warmup rule with warmup = len(forward).
    assert expected == tuple(warmup_rule(r, [1] * m, [1] * m, m) for r in range(ranks))


@pytest.mark.parametrize(
    ("ranks", "microbatches"), [(1, 1), (1, 4), (2, 2), (2, 5), (4, 4), (4, 9)]
)
def test_1f1b_closed_form(ranks: int, microbatches: int) -> None:
    m = microbatches
    expected = []
    for r in range(ranks):
        w = min(ranks - r, m)  # forwards in flight before the first backward
        row = [Action(r, "F", k) for k in range(w)]
        for k in range(m):
            row.append(Action(r, "B", k))
            if k + w < m:
                row.append(Action(r, "F", k + w))
        expected.append(tuple(row))
    assert one_f_one_b(ranks, microbatches) == tuple(expected)
    # docs/model.md 6.1: 1F1B is the warmup rule with warmup = R - j.
    assert tuple(expected) == tuple(
        warmup_rule(r, [1] * m, [1] * m, ranks - r) for r in range(ranks)
    )


def test_model_md_example_1_orders() -> None:
    # Example 1's 1F1B on four ranks: rank r keeps R - r samples in flight (440..410 bytes).
    for r, row in enumerate(one_f_one_b(4, 8)):
        inflight = peak = 0
        for a in row:
            inflight += 1 if a.kind == "F" else -1
            peak = max(peak, inflight)
        assert peak == 4 - r


def test_looped_bfs_closed_form() -> None:
    ranks, v, m = 3, 3, 4
    for r, row in enumerate(looped_bfs(ranks, v, m)):
        mine = [r, r + 3, r + 6]
        assert row[: v * m] == tuple(Action(s, "F", k) for s in mine for k in range(m))
        assert row[v * m :] == tuple(Action(s, "B", k) for s in mine[::-1] for k in range(m)[::-1])


def test_interleaved_warmup_counts() -> None:
    # Warmup forwards: (v-1)*per_round + hop*(R-1-r), capped at v*M, hop 2 for
    # Interleaved1F1B and 1 for InterleavedZeroBubble; the steady state then
    # opens with one more forward before the first backward (if any is left).
    def before_first_backward(row: Sequence[Action]) -> int:
        return next(i for i, a in enumerate(row) if a.kind != "F")

    # R=4, v=2, M=8: two rounds of 4.
    assert [before_first_backward(row) for row in interleaved_1f1b(4, 2, 8)] == [11, 9, 7, 5]
    assert [before_first_backward(row) for row in interleaved_zero_bubble(4, 2, 8)] == [8, 7, 6, 5]
    # M < R: one round of M microbatches; R=4, v=3, M=2: warmup min(2*2 + 2*(3-r), 6).
    assert [before_first_backward(row) for row in interleaved_1f1b(4, 3, 2)] == [6, 6, 6, 5]


def test_zero_bubble_weight_lag() -> None:
    # Rank r runs each W right after the I that comes r backwards later (ZB1P), the rest at the end.
    for r, row in enumerate(interleaved_zero_bubble(4, 2, 8)):
        backwards = [a for a in row if a.kind == "I"]
        weights = [a for a in row if a.kind == "W"]
        assert [(a.stage, a.mb) for a in weights] == [(a.stage, a.mb) for a in backwards]
        for q, i_act in enumerate(backwards[r:]):
            assert row[row.index(i_act) + 1] == weights[q]


# ---------------------------------------------------------------------------
# Placement and registry
# ---------------------------------------------------------------------------


def test_placement() -> None:
    assert placement("loop", 2, 2) == (0, 1, 0, 1)
    assert placement("loop", 3, 1) == (0, 1, 2)
    assert placement("vshape", 2, 2) == (0, 1, 1, 0)
    for ranks in range(1, 6):
        # docs/model.md section 2: stage j on rank j for j < R, else 2R-1-j.
        assert placement("vshape", ranks, 2) == tuple(
            j if j < ranks else 2 * ranks - 1 - j for j in range(2 * ranks)
        )
    assert placement("vshape", 2, 3) == (0, 1, 1, 0, 0, 1)
    with pytest.raises(ValueError, match="'ring' is unknown"):
        placement("ring", 2, 2)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="ranks = 0"):
        placement("loop", 0, 2)


def test_registry() -> None:
    assert list(PEER_SCHEDULES) == [
        "GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble",
    ]  # fmt: skip
    for name, sched in PEER_SCHEDULES.items():
        assert sched.name == name
        assert sched.torch_class.startswith("Schedule")
        with pytest.raises(dataclasses.FrozenInstanceError):
            sched.name = "x"  # type: ignore[misc]
    with pytest.raises(TypeError):
        PeerSchedule("x")  # type: ignore[call-arg]  # keyword-only
    assert PEER_SCHEDULES["ZBVZeroBubble"].placement == "vshape"
    assert [s.name for s in PEER_SCHEDULES.values() if s.split_backward] == [
        "InterleavedZeroBubble", "ZBVZeroBubble",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("call", "words"),
    [
        (lambda: gpipe(0, 4), ["ranks = 0", ">= 1"]),
        (lambda: gpipe(2, 0), ["microbatches = 0"]),
        (lambda: one_f_one_b(4, 3), ["microbatches = 3", "ranks = 4", "microbatches >= ranks"]),
        (lambda: interleaved_1f1b(2, 2, 5), ["microbatches = 5", "rounds", "= 2", "4 or 6"]),
        (lambda: interleaved_zero_bubble(3, 2, 10), ["microbatches = 10", "= 3", "9 or 12"]),
        (lambda: interleaved_1f1b(2, 0, 4), ["stages_per_rank = 0"]),
        (
            lambda: PEER_SCHEDULES["ZBVZeroBubble"].generate(2, 3, 4),
            ["stages_per_rank = 3", "exactly 2"],
        ),
        (
            lambda: PEER_SCHEDULES["GPipe"].generate(2, 2, 4),
            ["stages_per_rank = 2", "exactly 1 stage "],
        ),
        (lambda: looped_bfs(2, True, 4), ["stages_per_rank = True"]),
    ],
)
def test_refused_shapes_name_value_and_rule(call: object, words: list[str]) -> None:
    with pytest.raises(ValueError) as err:
        call()  # type: ignore[operator]
    for w in words:
        assert w in str(err.value)


# ---------------------------------------------------------------------------
# Properties over shapes
# ---------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(
    name=st.sampled_from(sorted(PEER_SCHEDULES)),
    ranks=st.integers(1, 6),
    stages_per_rank=st.integers(1, 4),
    microbatches=st.integers(1, 24),
)
def test_peer_schedules_are_valid_plans(
    name: str, ranks: int, stages_per_rank: int, microbatches: int
) -> None:
    sched = PEER_SCHEDULES[name]
    reason = sched.accepts(ranks, stages_per_rank, microbatches)
    if reason is not None:
        with pytest.raises(ValueError, match="^" + name):
            sched.generate(ranks, stages_per_rank, microbatches)
        return
    actions = sched.generate(ranks, stages_per_rank, microbatches)
    stage_ranks = sched.stage_ranks(ranks, stages_per_rank)
    check_section3(actions, stage_ranks, microbatches)
    assert not deadlocks(actions, len(stage_ranks))
    kinds = {a.kind for row in actions for a in row}
    assert kinds == ({"F", "I", "W"} if sched.split_backward else {"F", "B"})
    # Pure: the same shape gives the same lists.
    assert sched.generate(ranks, stages_per_rank, microbatches) == actions


def test_accepted_microbatch_counts() -> None:
    # The rules in closed form, over a grid.
    for ranks in range(1, 6):
        for m in range(1, 30):
            rounds = max(1, m // ranks)
            ok = m % rounds == 0
            assert (PEER_SCHEDULES["Interleaved1F1B"].accepts(ranks, 2, m) is None) == ok
            assert (PEER_SCHEDULES["InterleavedZeroBubble"].accepts(ranks, 3, m) is None) == ok
            assert (PEER_SCHEDULES["1F1B"].accepts(ranks, 1, m) is None) == (m >= ranks)
            for name in ("GPipe", "LoopedBFS", "ZBVZeroBubble"):
                v = 2 if name == "ZBVZeroBubble" else 1
                assert PEER_SCHEDULES[name].accepts(ranks, v, m) is None


# ---------------------------------------------------------------------------
# The warmup rule (docs/model.md 6.1)
# ---------------------------------------------------------------------------


def naive_warmup_rule(
    stage: int, forward: Sequence[int], backward: Sequence[int], warmup: int
) -> list[Action]:
    """docs/model.md 6.1 spelled out literally: need(k) by search, forwards up to the max."""
    cf = [0, *accumulate(forward)]
    cb = [0, *accumulate(backward)]
    out: list[Action] = []
    ran = 0
    for k in range(len(backward)):
        need = min(n for n in range(len(forward) + 1) if cf[n] >= cb[k + 1])
        goal = max(need, min(k + warmup, len(forward)))
        while ran < goal:
            out.append(Action(stage, "F", ran))
            ran += 1
        out.append(Action(stage, "B", k))
    return out


@st.composite
def partitions(draw: st.DrawFn) -> tuple[list[int], list[int]]:
    total = draw(st.integers(1, 40))

    def cut() -> list[int]:
        points = sorted(
            draw(st.sets(st.integers(1, total - 1), max_size=total - 1)) if total > 1 else set()
        )
        bounds = [0, *points, total]
        return [b - a for a, b in zip(bounds, bounds[1:], strict=False)]

    return cut(), cut()


@settings(max_examples=300, deadline=None)
@given(parts=partitions(), warmup=st.integers(1, 45), stage=st.integers(0, 7))
def test_warmup_rule_matches_its_definition(
    parts: tuple[list[int], list[int]], warmup: int, stage: int
) -> None:
    forward, backward = parts
    got = warmup_rule(stage, forward, backward, warmup)
    assert list(got) == naive_warmup_rule(stage, forward, backward, warmup)
    # Section 3: every forward and backward once, in order, each B after the forwards of its samples.
    assert [a.mb for a in got if a.kind == "F"] == list(range(len(forward)))
    assert [a.mb for a in got if a.kind == "B"] == list(range(len(backward)))
    assert {a.stage for a in got} == {stage}
    cf, cb = samples.cumulative(forward), samples.cumulative(backward)
    ran = 0
    for a in got:
        if a.kind == "F":
            ran += 1
        else:
            assert cf[ran] >= cb[a.mb + 1]


def test_warmup_rule_unequal_example() -> None:
    # docs/model.md example 2's stage 0: forward [1, 3, 4], backward [2, 6], warmup 1:
    # B0 needs samples 0..1, so two forwards; B1 needs all 8.
    assert format_actions(warmup_rule(0, [1, 3, 4], [2, 6], 1)) == "0F0 0F1 0B0 0F2 0B1"
    # Its stage 1: forward [4, 4], backward [8], warmup 2.
    assert format_actions(warmup_rule(1, [4, 4], [8], 2)) == "1F0 1F1 1B0"


@pytest.mark.parametrize(
    ("forward", "backward", "warmup", "words"),
    [
        ([], [1], 1, "forward is empty"),
        ([1, 0], [1], 1, "forward[1] = 0"),
        ([2], [1], 1, "forward sums to 2 samples but backward to 1"),
        ([1], [1], 0, "warmup = 0"),
        ([1], [1.5], 1, "backward[0] = 1.5"),
    ],
)
def test_warmup_rule_refuses(
    forward: list[int], backward: list[int], warmup: int, words: str
) -> None:
    with pytest.raises(ValueError, match=words.replace("[", r"\[").replace("]", r"\]")):
        warmup_rule(0, forward, backward, warmup)


def test_warmup_rule_is_linear() -> None:
    # A plan may hold 100,000 microbatches per stage.
    n = 100_000
    got = warmup_rule(3, [1] * n, [2] * (n // 2), 7)
    assert len(got) == n + n // 2 and got[-1] == Action(3, "B", n // 2 - 1)
