"""The lowered program: every send meets exactly one receive, slices build each microbatch, the window covers."""

from __future__ import annotations

import pickle

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.strategies import plans
from umsearch.core.plan import Plan, Stage
from umsearch.core.plan_rules import validate_plan
from umsearch.core.program import (
    RECV_WINDOW,
    Handoff,
    RankProgram,
    Send,
    lower,
    lower_rank,
    tag,
    untag,
)
from umsearch.core.samples import cumulative
from umsearch.core.schedules import warmup_rule

PLANS = given(plans(num_layers=6, max_batch=8, max_ranks=3), st.booleans())
SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _sizes(plan: Plan, stage: int, gradient: bool) -> tuple[int, ...]:
    st_ = plan.stages[stage]
    return st_.backward if gradient else st_.forward


@SETTINGS
@PLANS
def test_every_send_meets_one_receive_with_its_tag_and_size(plan: Plan, forward_only: bool) -> None:
    programs = lower(validate_plan(plan), forward_only=forward_only)
    S = plan.num_stages
    sends = {(p.rank, s.peer, s.tag) for p in programs for s in p.sends}
    assert len(sends) == sum(len(p.sends) for p in programs)  # tags are unique per link
    receives = [(r.peer, p.rank, r.tag) for p in programs for r in p.receives]
    assert sorted(receives) == sorted(sends)
    for p in programs:
        for r in p.receives:
            ch = p.channels[r.channel]
            assert untag(r.tag, S) == (ch.sender, ch.gradient, r.message)
            assert ch.sender_rank == r.peer != p.rank and not ch.local
            assert ch.sizes == _sizes(plan, ch.sender, ch.gradient)


@SETTINGS
@PLANS
def test_receives_follow_the_senders_order_per_link(plan: Plan, forward_only: bool) -> None:
    programs = lower(validate_plan(plan), forward_only=forward_only)
    for p in programs:
        for src in range(plan.ranks):
            got = [r.tag for r in p.receives if r.peer == src]
            want = [s.tag for s in programs[src].sends if s.peer == p.rank]
            assert got == want


@SETTINGS
@PLANS
def test_pieces_build_each_microbatch_and_every_read_message_is_released_once(plan: Plan, forward_only: bool) -> None:
    programs = lower(validate_plan(plan), forward_only=forward_only)
    for p in programs:
        released: dict[int, list[int]] = {}
        read: dict[int, set[int]] = {}
        for step in p.steps:
            a = step.action
            if step.input is None:
                continue
            ch = p.channels[step.input.channel]
            assert ch.stage == a.stage and ch.gradient == (not a.is_forward)
            cs, mine = cumulative(ch.sizes), cumulative(a.sizes(plan.stages[a.stage].forward, plan.stages[a.stage].backward))
            lo, hi = mine[a.mb], mine[a.mb + 1]
            at = lo
            for m, offset, count in step.input.pieces:  # contiguous, in sample order, inside their message
                assert cs[m] + offset == at and 0 < count and offset + count <= ch.sizes[m]
                at += count
            assert at == hi
            read.setdefault(step.input.channel, set()).update(m for m, _, _ in step.input.pieces)
            released.setdefault(step.input.channel, []).extend(step.input.release)
        for c, msgs in read.items():
            assert sorted(released[c]) == sorted(msgs)


@SETTINGS
@PLANS
def test_every_input_is_posted_before_it_is_taken_within_the_window(plan: Plan, forward_only: bool) -> None:
    for p in lower(validate_plan(plan), forward_only=forward_only):
        posted = {(r.channel, r.message) for r in p.prelude}
        for step in p.steps:
            if step.input is not None and not p.channels[step.input.channel].local:
                assert all((step.input.channel, m) in posted for m, _, _ in step.input.pieces)
            posted |= {(r.channel, r.message) for r in step.posts}
        assert len(posted) == len(p.receives)  # each receive posted once


@SETTINGS
@PLANS
def test_outputs_go_where_the_rules_say(plan: Plan, forward_only: bool) -> None:
    programs = lower(validate_plan(plan), forward_only=forward_only)
    S = plan.num_stages
    for p in programs:
        assert p.actions == tuple(a for a in plan.actions[p.rank] if a.is_forward or not forward_only)
        for step in p.steps:
            a, out = step.action, step.output
            to = a.consumer(S)
            if to is None:
                assert out is None
            elif plan.stages[to].rank == p.rank:
                assert isinstance(out, Handoff) and out.message == a.mb
                ch = p.channels[out.channel]
                assert (ch.stage, ch.sender, ch.gradient, ch.local) == (to, a.stage, not a.is_forward, True)
            else:
                assert isinstance(out, Send)
                assert (out.peer, out.tag) == (plan.stages[to].rank, tag(a.stage, not a.is_forward, a.mb, S))


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@PLANS
def test_one_rank_alone_and_pickled_is_the_same_program(plan: Plan, forward_only: bool) -> None:
    programs = lower(validate_plan(plan), forward_only=forward_only)
    for p in programs:
        assert lower_rank(plan, p.rank, forward_only=forward_only) == p
        assert pickle.loads(pickle.dumps(p)) == p


def test_the_window_holds_at_most_its_readers_messages() -> None:
    """GPipe of one-sample microbatches on two ranks: RECV_WINDOW receives ahead, never more."""
    n = 8
    stages = tuple(Stage(layers=(j, j + 1), rank=j, forward=(1,) * n, backward=(1,) * n) for j in range(2))
    actions = tuple(warmup_rule(j, s.forward, s.backward, n) for j, s in enumerate(stages))
    programs: tuple[RankProgram, ...] = lower(validate_plan(Plan(global_batch=n, ranks=2, stages=stages,
                                                                 actions=actions)))  # fmt: skip
    for p in programs:
        assert len(p.prelude) == RECV_WINDOW
        assert all(len(s.posts) <= 1 for s in p.steps)


def test_tags_invert() -> None:
    for S in (1, 2, 5):
        for stage in range(S):
            for mb in (-1, 0, 7, 99_999):
                for gradient in (False, True):
                    assert untag(tag(stage, gradient, mb, S), S) == (stage, gradient, mb)
