"""``python -m benchmarks.evaluator``: plans per second of the batch evaluator, before and after issue 37.

Issue 37 item 4 asks for at least 50k plans/s on plans of about 1,500
actions. The contenders, side by side in one process, rounds rotated, each
round timing ``pack`` + ``evaluate`` of the whole population:

- ``new``: :func:`umsearch.sim.population.pack` and :func:`umsearch.sim.population.evaluate` as they are,
- ``old``: the evaluator as of commit ca48f1c, kept here verbatim (``_old_evaluate_all`` and
  ``_old_one``, compiled without a disk cache so no stale code can be served; the kernels
  of :mod:`umsearch.sim.kernels` it calls and ``pack`` are unchanged since),

both with one numba thread (the issue's "one core") and with every thread, and each also
timing ``evaluate`` alone on the population packed before the round (``*_evaluate_*``: ``pack``
is the same code for both, it copies about 20 KB a plan of 1,500 actions, and the search's
cluster candidates reach the evaluator packed by the generator, not by ``pack``).
Workloads (synthetic simnet profile with the I/W split, B = 256, every stage
its own random partition, half the backwards split, a looped-BFS order,
deadlock-free): ``r8_v2`` R = 8 ranks x 2 stages, 32 layers, 8..64 microbatches
per stage (about 1,450 actions, the workload of ``benchmarks/simulator.py``);
``r4_v4`` R = 4 x 4 stages (interleaved), 32 layers, 12..64 microbatches (about 1,500);
``gpt_cpu``: the search's own plans, 96 random genomes of the bundled gpt_cpu space at R = 4,
B = 64 (the workload of ``benchmarks/search.py``'s scoring rate) with the action lists the order
generator gives them, the 96 plans 10 times over in each round (about 140 actions a plan).
The old and new results are checked equal before timing. Ratios pair the two
contenders of one round; the drift is the old contender's first against its
last rounds.

``gpt_cpu_generator``: the search's scoring of genomes, the order generator old and new. The same
96 genomes (10 times over, 960 a round), each round timing ``pack_genomes`` + ``generate`` (what
:meth:`umsearch.search.scoring.Scorer.genomes` runs), that followed by the generated lists' array
plans, ``pack`` and ``evaluate`` (generate + evaluate per genome), and ``generate`` alone on genomes
packed before the round (the compiled generator), with
:func:`umsearch.search.orders.generate` as it is (``new``) and as of c4f7f15 with the fixed stash in its
memory budget (``old``, kept here verbatim but for names as ``old_generate`` and its ``_old_*``
kernels, compiled without a disk cache), one numba thread and every thread. Both generators are
checked bit-identical (lists, times, memory, relaxations) at the space's limit and without one
before timing. ``--workloads`` runs some of them and keeps the others' results in the file.
Writes ``results/bench/evaluator.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numba
import numpy as np
import numpy.typing as npt
from numba import get_num_threads, prange

from benchmarks.stats import environment, ratio, summary
from umsearch.core.actions import BACKWARD_START, FEEDS, FORWARD_LIST, SPLIT, Action, F, W
from umsearch.core.bundled import data_dir
from umsearch.core.cost import CostModel, CostTables
from umsearch.core.plan import Plan, Stage
from umsearch.core.profile import load_profile
from umsearch.measure.synthetic import simnet_profile
from umsearch.search.genome import Genome, Rules
from umsearch.search.orders import (
    B_NEXT,
    BACKWARDED,
    BUDGET,
    DECIDE_AT,
    F_NEXT,
    FORCE,
    FORWARDED,
    LAST_END,
    LEVEL,
    LOCAL,
    NEXT_ROW,
    PENDING_W,
    RANK_FLOAT_ROWS,
    W_NEXT,
    WAITED_AT,
    WAITING,
    WRITTEN,
    Generated,
    PackedGenomes,
    generate,
    pack_genomes,
)
from umsearch.sim import kernels, population
from umsearch.sim.kernels import (
    code_kind,
    code_mb,
    code_stage,
    ends_backward,
    finish,
    first_missing,
    link_producers,
    memory_step,
    needed_ms,
    on_forward_list,
    ready_at,
    received_boundary,
    source_stage,
)
from umsearch.sim.population import (
    ArrayPlan,
    BatchResult,
    PackedPlans,
    allreduce_links,
    encode,
    evaluate,
    pack,
    stage_memory,
)
from umsearch.storage.jsonio import write_json

L, B = 32, 256

# Version 2.2's whole-stage all-reduce, as the old loop timed it (the evaluator now times buckets).


def allreduce_times(packed: PackedPlans, tables: CostTables) -> npt.NDArray[np.float64]:
    """Per stage (all candidates), its whole ring all-reduce over the candidate's replicas (version 2.2, one
    bucket per stage; 0 with one replica): ``2 (D-1)/D * P_j * ms_per_byte + 2 (D-1) * latency`` on its
    link. The old loop's; the evaluator now times buckets."""
    counts = np.diff(packed.stage_ptr)
    d = np.repeat(packed.replicas, counts).astype(np.float64)
    lat, per_byte = allreduce_links(packed, tables)
    params = tables.param_prefix[packed.hi] - tables.param_prefix[packed.lo]
    out: npt.NDArray[np.float64] = 2 * (d - 1) / d * params * per_byte + 2 * (d - 1) * lat
    return out


@numba.njit(cache=False)
def _allreduce_end(s0, S, rank, ready, ar_ms, order, free, spans):  # type: ignore[no-untyped-def]
    """docs/model.md section 9: the stages' all-reduces (``ar_ms``), each ready at ``ready[j]``, run one at a
    time per rank in ready order (lower stage first on ties); writes each one's ready time, start and
    end to ``spans[s0 + j]`` and returns the latest end. ``order`` and ``free`` (per rank) are scratch."""
    for j in range(S):  # stable insertion sort by ready time: ties keep the lower stage first
        i = j
        while i > 0 and ready[order[i - 1]] > ready[j]:
            order[i] = order[i - 1]
            i -= 1
        order[i] = j
    for j in range(S):
        free[rank[s0 + j]] = 0.0
    last = 0.0
    for i in range(S):
        j = order[i]
        r = rank[s0 + j]
        spans[s0 + j, 0] = ready[j]
        spans[s0 + j, 1] = max(ready[j], free[r])
        free[r] = spans[s0 + j, 2] = spans[s0 + j, 1] + ar_ms[s0 + j]
        last = max(last, free[r])
    return last


WORKLOADS = {"r8_v2": (8, 2, 8, 64), "r4_v4": (4, 4, 12, 64)}
"""name: (ranks, stages per rank, fewest and most microbatches per stage)."""
SEARCH_WORKLOAD = "gpt_cpu"
"""The search's own plans: the bundled space's random genomes, generated (:func:`search_plans`)."""
SEARCH_RANKS, SEARCH_BATCH, SEARCH_GENOMES, SEARCH_REPEATS = 4, 64, 96, 10


def random_plan(rng: random.Random, ranks: int, per_rank: int, m_lo: int, m_hi: int) -> Plan:
    """Looped placement, per-stage random partitions, half the backwards split, every forward of a
    rank's stages then their backwards, deepest first: deadlock-free."""
    S = ranks * per_rank
    cuts = [0, *sorted(rng.sample(range(1, L), S - 1)), L]
    stages = []
    for j in range(S):
        inner = sorted(rng.sample(range(1, B), rng.randint(m_lo, m_hi) - 1))
        sizes = tuple(b - a for a, b in zip([0, *inner], [*inner, B], strict=True))
        stages.append(Stage(layers=(cuts[j], cuts[j + 1]), rank=j % ranks, forward=sizes, backward=sizes))
    actions = []
    for r in range(ranks):
        mine = [j for j in range(S) if j % ranks == r]
        acts = [Action(j, "F", k) for j in mine for k in range(len(stages[j].forward))]
        for j in reversed(mine):
            for k in range(len(stages[j].backward)):
                acts += [Action(j, "I", k), Action(j, "W", k)] if rng.random() < 0.5 else [Action(j, "B", k)]
        actions.append(tuple(acts))
    return Plan(global_batch=B, ranks=ranks, stages=tuple(stages), actions=tuple(actions))


def search_genomes() -> tuple[list[Genome], Rules, CostTables, float]:
    """The gpt_cpu space at R = 4, B = 64: 96 random genomes (seed 0), its rules, the cost tables the
    search scores them with and its memory limit."""
    from umsearch.search.operators import random_genome
    from umsearch.search.partition import stage_cuts
    from umsearch.search.space import load_space

    space = load_space(data_dir() / f"{SEARCH_WORKLOAD}.toml", {"ranks": SEARCH_RANKS, "global_batch": SEARCH_BATCH})
    profile = load_profile(space.profile)
    rules = Rules.of(space, profile)
    tables = CostModel(profile, state_factor=space.state_factor).tables(rules.largest)
    anchors = {v: [stage_cuts(tables, b, SEARCH_RANKS * v) for b in (1, 8, rules.largest)] for v in rules.stages_per_rank}
    rng = random.Random(0)
    return [random_genome(rules, anchors, rng) for _ in range(SEARCH_GENOMES)], rules, tables, space.memory_limit


def search_plans() -> tuple[list[ArrayPlan], CostTables]:
    """:func:`search_genomes` with their generated action lists, repeated 10 times, and the cost tables."""
    from umsearch.search.scoring import Scorer

    genomes, rules, tables, limit = search_genomes()
    gen = Scorer(rules, tables, limit).genomes(genomes)
    return [gen.array_plan(g, rules, c) for c, g in enumerate(genomes)] * SEARCH_REPEATS, tables


def old_evaluate(packed: PackedPlans, tables: CostTables) -> BatchResult:
    """:func:`umsearch.sim.population.evaluate` as of ca48f1c (same wrapper, the old compiled loop)."""
    n = packed.size
    n_ranks = int(packed.rank_ptr[-1])
    it, top, comp, ar_end = np.empty(n), np.empty(n), np.empty(n), np.empty(n)
    dead = np.zeros(n, dtype=np.bool_)
    mem, busy, ends = np.zeros(n_ranks), np.zeros(n_ranks), np.zeros(n_ranks)
    spans = np.full((packed.lo.shape[0], 3), np.nan)
    t = tables
    _old_evaluate_all(
        packed.stage_ptr, packed.lo, packed.hi, packed.rank, packed.recompute, t.stage_scale(packed.lo, packed.hi),
        packed.fwd, packed.fwd_ptr, packed.bwd, packed.bwd_ptr, packed.rank_ptr, packed.act, packed.act_ptr,
        t.times, t.out_bytes, t.stash_prefix, t.param_prefix, t.input_bytes,
        t.latency_ms, t.ms_per_byte, t.op_overhead_ms, t.message_overhead_ms, t.message_overhead_ms_per_byte,
        t.state_factor, packed.replicas, packed.zero1, packed.links, packed.run_ptr, packed.node_ptr,
        packed.run_node, allreduce_times(packed, tables),
        it, dead, top, comp, ar_end, spans, mem, busy, ends, min(n, 4 * get_num_threads()),
    )  # fmt: skip
    return BatchResult(iteration_ms=it, compute_end_ms=comp, allreduce_end_ms=ar_end, allreduce_span_ms=spans,
                       deadlock=dead, max_memory_bytes=top, peak_memory_bytes=mem, busy_ms=busy, rank_end_ms=ends,
                       rank_ptr=packed.rank_ptr, stage_ptr=packed.stage_ptr)  # fmt: skip


@numba.njit(cache=False, parallel=True)
def _old_evaluate_all(  # type: ignore[no-untyped-def]
    stage_ptr, lo, hi, rank, recompute, scale, fwd, fwd_ptr, bwd, bwd_ptr, rank_ptr, act, act_ptr,
    times, out_bytes, stash_prefix, param_prefix, input_bytes,
    latency, ms_per_byte, op_oh, msg_oh, msg_per_byte, state_factor,
    replicas, zero1, links, run_ptr, node_ptr, run_node, ar_ms,
    it, dead, top, comp, ar_end, spans, mem, busy, ends, blocks,
):  # fmt: skip
    n = stage_ptr.shape[0] - 1
    max_s = max_r = max_g = 1  # scratch sizes: the largest candidate's
    for c in range(n):
        s0, s1 = stage_ptr[c], stage_ptr[c + 1]
        max_r = max(max_r, rank_ptr[c + 1] - rank_ptr[c])
        max_g = max(max_g, s1 - s0)
        max_s = max(max_s, fwd_ptr[s1] - fwd_ptr[s0] + bwd_ptr[s1] - bwd_ptr[s0] + s1 - s0)
    # Candidates are independent: blocks of them run on numba's threads, each with its own
    # scratch, and every result lands in the candidate's own slots (deterministic).
    for blk in prange(blocks):
        dep_lo = np.empty(max_s, np.int64)  # per forward, then per backward: producer range
        dep_hi = np.empty(max_s, np.int64)
        # Delivery of each forward's output / each B/I's gradient (-1: not yet), then per stage its last B/W end.
        deliv = np.empty(max_s)
        waiter = np.empty(max_s, np.int64)  # the rank waiting for that delivery (-1: none)
        link = np.empty((max_r, max_r, 3))  # link[src, dst]: arrival of its last message, latency, ms/byte
        pos = np.empty(max_r, np.int64)
        clock = np.empty(max_r)
        level = np.empty(max_r)
        stack = np.empty(max_r, np.int64)
        last_end = np.empty(max_r)  # per rank, over the runs
        ready = np.empty(max_g)  # per stage, its all-reduce's ready time over the runs
        order = np.empty(max_g, np.int64)
        for c in range(blk * n // blocks, (blk + 1) * n // blocks):
            r0, R = rank_ptr[c], rank_ptr[c + 1] - rank_ptr[c]
            s0, S = stage_ptr[c], stage_ptr[c + 1] - stage_ptr[c]
            n_slots = fwd_ptr[s0 + S] - fwd_ptr[s0] + bwd_ptr[s0 + S] - bwd_ptr[s0]
            D = replicas[c]
            factor = 2.0 + (state_factor - 2.0) / D if zero1[c] else state_factor
            last_end[:R] = 0.0
            ready[:S] = 0.0
            for u in range(run_ptr[c], run_ptr[c + 1]):
                population._set_links(link, R, run_node, node_ptr[u], node_ptr[u + 1], links, c, latency, ms_per_byte)
                dead[c] = _old_one(c, stage_ptr, lo, hi, rank, recompute, scale, fwd, fwd_ptr, bwd, bwd_ptr, rank_ptr,
                               act, act_ptr, times, out_bytes, stash_prefix, param_prefix, input_bytes,
                               op_oh, msg_oh, msg_per_byte, factor,
                               dep_lo, dep_hi, deliv, waiter, link, pos, clock, level, stack, mem, busy,
                               ends)  # fmt: skip
                if dead[c]:  # links change times, never what waits for what
                    break
                for r in range(R):
                    last_end[r] = max(last_end[r], ends[r0 + r])
                for j in range(S):
                    ready[j] = max(ready[j], deliv[n_slots + j])
            peak = 0.0
            for r in range(R):
                peak = max(peak, mem[r0 + r])
            if dead[c]:
                it[c] = top[c] = comp[c] = ar_end[c] = np.inf
                continue
            last = 0.0
            for r in range(R):
                ends[r0 + r] = last_end[r]
                last = max(last, last_end[r])
            done = _allreduce_end(s0, S, rank, ready, ar_ms, order, clock, spans) if D > 1 else 0.0
            comp[c], ar_end[c] = last, done
            it[c] = max(last, done)
            top[c] = peak



@numba.njit(cache=False)
def _old_one(  # type: ignore[no-untyped-def]
    c, stage_ptr, lo, hi, rank, recompute, scale, fwd, fwd_ptr, bwd, bwd_ptr, rank_ptr, act, act_ptr,
    times, out_bytes, stash_prefix, param_prefix, input_bytes,
    op_oh, msg_oh, msg_per_byte, state_factor,
    dep_lo, dep_hi, deliv, waiter, link, pos, clock, level, stack, mem, busy, ends,
):  # fmt: skip
    """Run candidate c (one replica, its links in ``link``, see :func:`_set_links`) to the end or to a
    deadlock; returns True on deadlock. ``deliv[n_slots + j]`` is left at stage j's last B/W end.

    Slots: forward k of stage g is slot ``fwd_ptr[g] - f_base + k``; backward k
    is ``n_f + bwd_ptr[g] - b_base + k``. ``dep_*`` of a slot is the range of
    producer slots it reads (forwards of g-1, or backwards of g+1), relative
    to that producer stage's first slot.
    """
    s0, s1 = stage_ptr[c], stage_ptr[c + 1]
    S = s1 - s0
    r0, r1 = rank_ptr[c], rank_ptr[c + 1]
    R = r1 - r0
    f_base, b_base = fwd_ptr[s0], bwd_ptr[s0]
    n_f = fwd_ptr[s1] - f_base
    n_slots = n_f + bwd_ptr[s1] - b_base
    link_producers(fwd, fwd_ptr, bwd, bwd_ptr, s0, s1, dep_lo, dep_hi)
    _old_reset(n_slots, S, R, deliv, waiter, pos, clock, level, stack, mem[r0:r1], busy[r0:r1])
    top_of_stack = R
    remaining = act_ptr[r1] - act_ptr[r0]
    while top_of_stack > 0:
        top_of_stack -= 1
        r = stack[top_of_stack]
        a0 = act_ptr[r0 + r]
        n_act = act_ptr[r0 + r + 1] - a0
        while pos[r] < n_act:
            code = act[a0 + pos[r]]
            kind = code_kind(code)
            j = code_stage(code)
            k = code_mb(code)
            g = s0 + j
            l_lo, l_hi = lo[g], hi[g]
            start = clock[r]
            need = 0.0
            # Inline on purpose: a shared kernel taking these arrays costs ~20% of the loop (ARCHITECTURE.md).
            p = source_stage(kind, j, S)  # the stage it reads from (-1: none), its producers on the same list
            pg = s0 + p if p >= 0 else g
            if on_forward_list(kind):
                size = fwd[fwd_ptr[g] + k]
                slot = fwd_ptr[g] - f_base + k
                producers = fwd_ptr[pg] - f_base if p >= 0 else -1
                sizes, size_base = fwd, fwd_ptr[pg]
            else:
                size = bwd[bwd_ptr[g] + k]
                slot = n_f + bwd_ptr[g] - b_base + k
                producers = n_f + bwd_ptr[pg] - b_base if p >= 0 else -1
                sizes, size_base = bwd, bwd_ptr[pg]
            cross = rank[pg] != rank[g]
            edge = received_boundary(kind, l_lo, l_hi)
            if producers >= 0:
                d = ready_at(deliv, producers, dep_lo[slot], dep_hi[slot])
                if d < 0.0:  # wait on the first producer that has not run; it resumes this rank
                    waiter[first_missing(deliv, producers, dep_lo[slot], dep_hi[slot])] = r
                    break
                start = max(start, d)
                if cross:
                    need = needed_ms(sizes, size_base, dep_lo[slot], dep_hi[slot], out_bytes[edge], msg_oh,
                                     msg_per_byte)  # fmt: skip
            end, to, arrival = finish(kind, j, g, S, r, start, size, l_lo, l_hi, recompute[g], scale[g], need, rank,
                                         link, times, out_bytes, op_oh, msg_oh, msg_per_byte)  # fmt: skip
            if ends_backward(kind):  # the stage's latest backward end so far (its rank runs in order)
                deliv[n_slots + j] = end
            if to >= 0:
                deliv[slot] = arrival
                w = waiter[slot]
                if w >= 0:
                    waiter[slot] = -1
                    stack[top_of_stack] = w
                    top_of_stack += 1
            # Memory (docs/model.md 5): additions, the peak, then releases.
            add, rel = memory_step(kind, recompute[g], size, l_lo, l_hi, input_bytes, out_bytes, stash_prefix)
            level[r] += add
            mem[r0 + r] = max(mem[r0 + r], level[r])
            level[r] -= rel
            busy[r0 + r] += end - start
            clock[r] = end
            pos[r] += 1
            remaining -= 1
    ends[r0:r1] = clock[:R]
    for g in range(s0, s1):
        mem[r0 + rank[g]] += state_factor * (param_prefix[hi[g]] - param_prefix[lo[g]])
    return remaining > 0




@numba.njit(cache=False)
def _old_reset(n_slots, S, R, deliv, waiter, pos, clock, level, stack, mem, busy):  # type: ignore[no-untyped-def]
    """The old loop's start of a candidate (``population._reset`` as of ca48f1c)."""
    deliv[:n_slots] = -1.0
    waiter[:n_slots] = -1
    deliv[n_slots : n_slots + S] = 0.0
    for r in range(R):
        pos[r], clock[r], level[r], mem[r], busy[r] = 0, 0.0, 0.0, 0.0, 0.0
        stack[r] = R - 1 - r


# The order generator as of c4f7f15 with the fixed stash in its memory budget (before its tables), kept
# verbatim but for names: its state's rows are umsearch.search.orders' first ones (same values), fewer of them.
_OLD_STAGE_ROWS, _OLD_RANK_INT_ROWS = 6, 4


def old_generate(packed: PackedGenomes, tables: CostTables, memory_limit: float) -> Generated:
    """:func:`umsearch.search.orders.generate` before issue 37's tables (same wrapper, the old compiled loop)."""
    n = packed.size
    n_ranks = int(packed.rank_ptr[-1])
    act = np.zeros(int(packed.act_ptr[-1]), dtype=np.int64)
    it, top = np.empty(n), np.empty(n)
    relaxed = np.zeros(n, dtype=np.int64)
    mem, busy = np.zeros(n_ranks), np.zeros(n_ranks)
    t = tables
    _old_generate_all(
        packed.stage_ptr, packed.lo, packed.hi, packed.rank, packed.recompute, t.stage_scale(packed.lo, packed.hi),
        packed.split, packed.cap,
        packed.fwd, packed.fwd_ptr, packed.bwd, packed.bwd_ptr, packed.rank_ptr, packed.rank_cap, packed.w_cap,
        packed.policy, packed.act_ptr, t.times, t.out_bytes, stage_memory(packed, tables), t.param_prefix,
        t.latency_ms, t.ms_per_byte, t.op_overhead_ms, t.message_overhead_ms,
        t.message_overhead_ms_per_byte, t.state_factor,
        memory_limit, act, it, top, mem, busy, relaxed, min(n, 4 * get_num_threads()),
    )  # fmt: skip
    return Generated(act=act, iteration_ms=it, max_memory_bytes=top, peak_memory_bytes=mem, busy_ms=busy,
                     relaxed=relaxed, packed=packed)  # fmt: skip


@numba.njit(cache=False, parallel=True)
def _old_generate_all(  # type: ignore[no-untyped-def]
    stage_ptr, lo, hi, rank, recompute, scale, split, cap, fwd, fwd_ptr, bwd, bwd_ptr, rank_ptr, rank_cap, w_cap,
    policy, act_ptr, times, out_bytes, stage_mem, param_prefix, latency, ms_per_byte, op_oh, msg_oh,
    msg_per_byte, state_factor, memory_limit, act, it, top, mem, busy, relaxed, blocks,
):  # fmt: skip
    n = stage_ptr.shape[0] - 1
    max_s = max_r = max_g = 1
    for c in range(n):
        s0, s1 = stage_ptr[c], stage_ptr[c + 1]
        max_g = max(max_g, s1 - s0)
        max_r = max(max_r, rank_ptr[c + 1] - rank_ptr[c])
        max_s = max(max_s, fwd_ptr[s1] - fwd_ptr[s0] + bwd_ptr[s1] - bwd_ptr[s0])
    for blk in prange(blocks):
        ints = np.empty((_OLD_STAGE_ROWS, max_g), np.int64)
        dep_lo = np.empty(max_s, np.int64)
        dep_hi = np.empty(max_s, np.int64)
        deliv = np.empty(max_s)
        link = np.empty((max_r, max_r, 3))  # per directed rank pair: last arrival, latency, ms per byte
        rint = np.empty((_OLD_RANK_INT_ROWS, max_r + 1), np.int64)
        rflt = np.empty((RANK_FLOAT_ROWS, max_r))
        local = np.empty(max_g, np.int64)
        for c in range(blk * n // blocks, (blk + 1) * n // blocks):
            ok = _old_generate_one(c, stage_ptr, lo, hi, rank, recompute, scale, split, cap, fwd, fwd_ptr, bwd, bwd_ptr,
                               rank_ptr, rank_cap, w_cap, policy, act_ptr, times, out_bytes, stage_mem,
                               param_prefix, latency, ms_per_byte, op_oh, msg_oh, msg_per_byte,
                               state_factor,
                               memory_limit, act, mem, busy, relaxed, ints, dep_lo, dep_hi, deliv, link, rint,
                               rflt, local)  # fmt: skip
            last = peak = 0.0
            for q in range(rank_ptr[c], rank_ptr[c + 1]):
                last = max(last, rflt[LAST_END, q - rank_ptr[c]])
                peak = max(peak, mem[q])
            it[c] = last if ok else np.inf
            top[c] = peak if ok else np.inf


@numba.njit(cache=False)
def _old_backward_at(g, kind, s0, S, ints, bwd, bwd_ptr, dep_lo, dep_hi, deliv, n_f, b_base):  # type: ignore[no-untyped-def]
    """When stage g's next backward (as kind code ``kind``, B or I) can start: its inputs' arrival, -1
    while they are not all sent, -2 if it is no candidate (none left, or its forwards have not all run)."""
    k = ints[B_NEXT, g]
    if k >= bwd_ptr[s0 + g + 1] - bwd_ptr[s0 + g] or ints[FORWARDED, g] < ints[BACKWARDED, g] + bwd[bwd_ptr[s0 + g] + k]:
        return -2.0
    p = kernels.source_stage(kind, g, S)
    if p < 0:
        return 0.0
    slot = n_f + bwd_ptr[s0 + g] - b_base + k
    return kernels.ready_at(deliv, n_f + bwd_ptr[s0 + p] - b_base, dep_lo[slot], dep_hi[slot])


@numba.njit(cache=False)
def _old_forward_at(g, s0, S, ints, fwd_ptr, dep_lo, dep_hi, deliv, f_base):  # type: ignore[no-untyped-def]
    """When stage g's next forward can start (as :func:`_backward_at`; caps not applied)."""
    k = ints[F_NEXT, g]
    if k >= fwd_ptr[s0 + g + 1] - fwd_ptr[s0 + g]:
        return -2.0
    p = kernels.source_stage(F, g, S)
    if p < 0:
        return 0.0
    slot = fwd_ptr[s0 + g] - f_base + k
    return kernels.ready_at(deliv, fwd_ptr[s0 + p] - f_base, dep_lo[slot], dep_hi[slot])


@numba.njit(cache=False)
def _old_pending_w(first, last, local, ints, split, s0):  # type: ignore[no-untyped-def]
    """The deepest local stage with a weight gradient waiting, or -1."""
    for i in range(last - 1, first - 1, -1):
        g = local[i]
        if ints[W_NEXT, g] < ints[B_NEXT, g] and split[s0 + g]:
            return g
    return -1


@numba.njit(cache=False)
def _old_candidate(c, s0, S, r, rint, local, ints, split, fwd, fwd_ptr, bwd, bwd_ptr, dep_lo, dep_hi, deliv,  # type: ignore[no-untyped-def]
               n_f, f_base, b_base, now, rank_cap, w_cap, policy, cap, level, budget, stash_in):  # fmt: skip
    """Rank r's choice at ``now`` by its policy (see :data:`POLICIES`): ``(stage, kind, _)``, or
    ``(-1, -1, t)`` with t the ready time of the earliest candidate only waiting for an input (inf:
    none known yet)."""
    first, last = rint[LOCAL, r], rint[LOCAL, r + 1]
    wake = np.inf
    held = 0
    for i in range(first, last):
        held += ints[FORWARDED, local[i]] - ints[BACKWARDED, local[i]]
    if rint[PENDING_W, r] >= w_cap and rint[PENDING_W, r] > 0:  # too many weight gradients wait
        return _old_pending_w(first, last, local, ints, split, s0), W, now
    n = last - first
    # Policies 0/1 sweep backwards then forwards, 3/4 forwards then backwards, 2 both per stage.
    sweeps = 1 if policy == 2 else 2
    for sweep in range(sweeps):
        backward = policy == 2 or (sweep == 0) == (policy < 2)
        forward = policy == 2 or not backward
        shallow_first = forward and (policy == 1 or policy == 3)
        for step in range(n):
            i = first + step if shallow_first else last - 1 - step
            g = local[i]
            if backward:
                kind = BACKWARD_START[int(split[s0 + g])]
                d = _old_backward_at(g, kind, s0, S, ints, bwd, bwd_ptr, dep_lo, dep_hi, deliv, n_f, b_base)
                if 0.0 <= d <= now:
                    return g, kind, now
                if d > now:
                    wake = min(wake, d)
            if forward:
                d = _old_forward_at(g, s0, S, ints, fwd_ptr, dep_lo, dep_hi, deliv, f_base)
                if d > now:
                    wake = min(wake, d)
                elif d >= 0.0:
                    size = fwd[fwd_ptr[s0 + g] + ints[F_NEXT, g]]
                    if ints[FORCE, g] or held == 0 or (ints[FORWARDED, g] - ints[BACKWARDED, g] < cap[s0 + g] and held < rank_cap
                                                   and level + stash_in[0, g] * size + stash_in[1, g] <= budget):  # fmt: skip
                        return g, F, now
    g = _old_pending_w(first, last, local, ints, split, s0)  # weight gradients fill the gap
    if g >= 0:
        return g, W, now
    return -1, -1, wake


@numba.njit(cache=False)
def _old_setup(s0, S, R, r0, lo, hi, rank, recompute, stage_mem, param_prefix, state_factor,  # type: ignore[no-untyped-def]
           memory_limit, n_slots, deliv, local, ints, rint, rflt, stash_in, mem, busy, link):  # fmt: skip
    """Reset the state for one candidate: nothing delivered, every rank's local stages (ascending,
    ``local[rint[LOCAL, r] : rint[LOCAL, r + 1]]``), its budget under the memory limit, and what a
    forward of each stage adds per sample and per microbatch, its fixed stash (from ``stage_mem``,
    :func:`stage_memory`)."""
    deliv[:n_slots] = -1.0
    n_loc = 0
    for r in range(R):
        rint[LOCAL, r] = n_loc
        state = 0.0
        for g in range(S):
            if rank[s0 + g] == r:
                local[n_loc] = g
                n_loc += 1
                state += state_factor * stage_mem[s0 + g, 5]  # its parameters, a tied weight once per rank
        rint[WRITTEN, r], rint[PENDING_W, r], rint[WAITING, r] = 0, 0, 0
        rflt[DECIDE_AT, r], rflt[LAST_END, r], rflt[LEVEL, r], rflt[WAITED_AT, r] = 0.0, 0.0, 0.0, 0.0
        rflt[BUDGET, r] = memory_limit - state
        mem[r0 + r], busy[r0 + r] = 0.0, 0.0
    rint[LOCAL, R] = n_loc
    link[:R, :R, 0] = 0.0
    for g in range(S):
        gg = s0 + g
        stash_in[0, g] = kernels.memory_delta(F, recompute[gg], stage_mem[gg, 0], stage_mem[gg, 1], stage_mem[gg, 2],
                                              stage_mem[gg, 3])[0]  # fmt: skip
        stash_in[1, g] = kernels.memory_delta(F, recompute[gg], stage_mem[gg, 4], 0.0, 0.0, 0.0)[0]  # the fixed stash
        ints[:, g] = 0


@numba.njit(cache=False)
def _old_generate_one(  # type: ignore[no-untyped-def]
    c, stage_ptr, lo, hi, rank, recompute, scale, split, cap, fwd, fwd_ptr, bwd, bwd_ptr, rank_ptr, rank_cap, w_cap,
    policy, act_ptr, times, out_bytes, stage_mem, param_prefix, latency, ms_per_byte, op_oh, msg_oh,
    msg_per_byte, state_factor, memory_limit, act, mem, busy, relaxed, ints, dep_lo, dep_hi, deliv, link, rint, rflt, local,
):  # fmt: skip
    """Generate candidate c's lists; returns False only if no rank could go on (a bug, never expected)."""
    s0, s1 = stage_ptr[c], stage_ptr[c + 1]
    S = s1 - s0
    r0, r1 = rank_ptr[c], rank_ptr[c + 1]
    R = r1 - r0
    f_base, b_base = fwd_ptr[s0], bwd_ptr[s0]
    n_f = fwd_ptr[s1] - f_base
    kernels.link_producers(fwd, fwd_ptr, bwd, bwd_ptr, s0, s1, dep_lo, dep_hi)
    stash_in = np.empty((2, S))  # bytes a forward adds per sample, and per microbatch (docs/model.md 5)
    _old_setup(s0, S, R, r0, lo, hi, rank, recompute, stage_mem, param_prefix, state_factor, memory_limit,
           n_f + bwd_ptr[s1] - b_base, deliv, local, ints, rint, rflt, stash_in, mem, busy, link)  # fmt: skip
    link[:R, :R, 1], link[:R, :R, 2] = latency, ms_per_byte  # one link between any two ranks
    remaining = act_ptr[r1] - act_ptr[r0]
    while remaining > 0:
        r = _old_next_rank(rint, rflt, act_ptr, r0, R)
        if r < 0:  # every rank waits on a cap and nothing is on its way
            r, g = _old_relax(s0, S, R, rint, rflt, local, ints, fwd_ptr, dep_lo, dep_hi, deliv, f_base, act_ptr, r0)
            if r < 0:
                return False
            relaxed[c] += 1
            ints[FORCE, g] = 1
            rint[WAITING, r] = 0
            rflt[DECIDE_AT, r] = rflt[WAITED_AT, r]
            continue
        now = rflt[DECIDE_AT, r]
        g, kind, wake = _old_candidate(c, s0, S, r, rint, local, ints, split, fwd, fwd_ptr, bwd, bwd_ptr, dep_lo, dep_hi,
                             deliv, n_f, f_base, b_base, now, rank_cap[r0 + r], w_cap[r0 + r], policy[r0 + r], cap,
                             rflt[LEVEL, r], rflt[BUDGET, r], stash_in)  # fmt: skip
        if g < 0:
            rint[WAITING, r] = 1  # waiting: a delivery to this rank wakes it
            rflt[WAITED_AT, r] = now
            rflt[DECIDE_AT, r] = wake
            continue
        # Run the chosen action: the timing of docs/model.md section 4, as in the evaluator.
        gg = s0 + g
        # Inline on purpose: a shared kernel taking these arrays costs ~20% of the loop (ARCHITECTURE.md).
        k = ints[NEXT_ROW[kind], g]
        p = kernels.source_stage(kind, g, S)  # the stage it reads from (-1: none), its producers on the same list
        pg = s0 + p if p >= 0 else gg
        if kernels.on_forward_list(kind):
            size = fwd[fwd_ptr[gg] + k]
            slot = fwd_ptr[gg] - f_base + k
            producers = fwd_ptr[pg] - f_base if p >= 0 else -1
            sizes, size_base = fwd, fwd_ptr[pg]
        else:
            size = bwd[bwd_ptr[gg] + k]
            slot = n_f + bwd_ptr[gg] - b_base + k
            producers = n_f + bwd_ptr[pg] - b_base if p >= 0 else -1
            sizes, size_base = bwd, bwd_ptr[pg]
        cross = rank[pg] != rank[gg]
        edge = kernels.received_boundary(kind, lo[gg], hi[gg])
        start = rflt[LAST_END, r]
        need = 0.0
        if producers >= 0:
            start = max(start, kernels.ready_at(deliv, producers, dep_lo[slot], dep_hi[slot]))
            if cross:
                need = kernels.needed_ms(sizes, size_base, dep_lo[slot], dep_hi[slot], out_bytes[edge], msg_oh, msg_per_byte)
        l_lo, l_hi = lo[gg], hi[gg]
        end, to, arrival = kernels.finish(kind, g, gg, S, r, start, size, l_lo, l_hi, recompute[gg], scale[gg], need, rank,
                                  link, times, out_bytes, op_oh, msg_oh, msg_per_byte)  # fmt: skip
        if to >= 0:
            deliv[slot] = arrival
            dst = rank[to]
            if rint[WAITING, dst]:  # wake a waiting consumer, no earlier than its own last end
                rflt[DECIDE_AT, dst] = min(rflt[DECIDE_AT, dst], max(arrival, rflt[LAST_END, dst]))
        # Memory (docs/model.md 5): the stage's terms per sample, times the microbatch's size (the stash plus its
        # fixed part).
        add, rel = kernels.memory_delta(kind, recompute[gg], stage_mem[gg, 0] * size + stage_mem[gg, 4],
                                        stage_mem[gg, 1] * size, stage_mem[gg, 2] * size, stage_mem[gg, 3] * size)  # fmt: skip
        rflt[LEVEL, r] += add
        mem[r0 + r] = max(mem[r0 + r], rflt[LEVEL, r])
        rflt[LEVEL, r] -= rel
        busy[r0 + r] += end - start
        rflt[DECIDE_AT, r] = rflt[LAST_END, r] = end
        rint[WAITING, r] = 0
        act[act_ptr[r0 + r] + rint[WRITTEN, r]] = kernels.action_code(g, kind, k)
        rint[WRITTEN, r] += 1
        remaining -= 1
        _old_advance(ints, rint, g, r, kind, size)
    for r in range(R):
        for i in range(rint[LOCAL, r], rint[LOCAL, r + 1]):
            g = local[i]
            mem[r0 + r] += state_factor * stage_mem[s0 + g, 5]
    return True


@numba.njit(cache=False)
def _old_next_rank(rint, rflt, act_ptr, r0, R):  # type: ignore[no-untyped-def]
    """The unfinished rank that decides earliest (-1: every rank waits with nothing on its way)."""
    r = -1
    best = np.inf
    for q in range(R):
        if rint[WRITTEN, q] < act_ptr[r0 + q + 1] - act_ptr[r0 + q] and rflt[DECIDE_AT, q] < best:
            best = rflt[DECIDE_AT, q]
            r = q
    return r


@numba.njit(cache=False)
def _old_advance(ints, rint, g, r, kind, size):  # type: ignore[no-untyped-def]
    """The counters after rank r ran a ``kind`` of local stage g on ``size`` samples (the generator's
    own bookkeeping of the kinds it chose, see :data:`NEXT_ROW`)."""
    ints[NEXT_ROW[kind], g] += 1
    if FORWARD_LIST[kind]:
        ints[FORWARDED, g] += size
        ints[FORCE, g] = 0
    elif FEEDS[kind] == 0:  # a backward's weight half: its I's wait is over
        rint[PENDING_W, r] -= 1
    else:
        ints[BACKWARDED, g] += size
        if SPLIT[kind]:  # an input half: its W now waits
            rint[PENDING_W, r] += 1


@numba.njit(cache=False)
def _old_relax(s0, S, R, rint, rflt, local, ints, fwd_ptr, dep_lo, dep_hi, deliv, f_base, act_ptr, r0):  # type: ignore[no-untyped-def]
    """Every rank waits and nothing is on its way: the (rank, stage) whose next forward has its inputs
    and is held back only by its cap or the memory budget, earliest first; (-1, -1) if none."""
    best_r = best_g = -1
    best_t = np.inf
    for r in range(R):
        if rint[WRITTEN, r] >= act_ptr[r0 + r + 1] - act_ptr[r0 + r]:
            continue
        for i in range(rint[LOCAL, r], rint[LOCAL, r + 1]):
            g = local[i]
            k = ints[F_NEXT, g]
            if k >= fwd_ptr[s0 + g + 1] - fwd_ptr[s0 + g]:
                continue
            d = 0.0
            p = kernels.source_stage(F, g, S)
            if p >= 0:
                slot = fwd_ptr[s0 + g] - f_base + k
                d = kernels.ready_at(deliv, fwd_ptr[s0 + p] - f_base, dep_lo[slot], dep_hi[slot])
            if d >= 0.0 and max(d, rflt[LAST_END, r]) < best_t:
                best_t, best_r, best_g = max(d, rflt[LAST_END, r]), r, g
    if best_r >= 0:
        rflt[WAITED_AT, best_r] = best_t
    return best_r, best_g


Scorer = Callable[[PackedPlans, CostTables], BatchResult]


def same(a: BatchResult, b: BatchResult) -> bool:
    """Whether two evaluations agree on everything the search reads."""
    return all(np.array_equal(getattr(a, f), getattr(b, f), equal_nan=True)
               for f in ("iteration_ms", "deadlock", "max_memory_bytes", "peak_memory_bytes", "busy_ms",
                         "rank_end_ms", "compute_end_ms"))  # fmt: skip


def rate(score: Scorer, arrays: list[ArrayPlan], tables: CostTables, threads: int,
         packed: PackedPlans | None = None) -> tuple[float, float]:  # fmt: skip
    """Plans per second of one pack + evaluate of the population on ``threads`` numba threads (with
    ``packed``, the population packed before: ``evaluate`` alone): per second of wall time, and per second
    of this process's CPU time (every thread's: on a shared machine, the time the work took where the wall
    time also counts the others' turns)."""
    before = numba.get_num_threads()
    numba.set_num_threads(threads)
    try:
        t, cpu = time.perf_counter(), time.process_time()
        score(pack(arrays) if packed is None else packed, tables)
        return len(arrays) / (time.perf_counter() - t), len(arrays) / (time.process_time() - cpu)
    finally:
        numba.set_num_threads(before)


def run_workload(name: str, plans: int, rounds: int) -> dict[str, Any]:
    """Rotated rounds of every contender on one workload; rates, paired ratios and drift."""
    if name == SEARCH_WORKLOAD:
        arrays, tables = search_plans()
        shape: dict[str, Any] = {"ranks": SEARCH_RANKS, "global_batch": SEARCH_BATCH, "genomes": SEARCH_GENOMES,
                                 "repeats": SEARCH_REPEATS}  # fmt: skip
    else:
        ranks, per_rank, m_lo, m_hi = WORKLOADS[name]
        rng = random.Random(0)
        tables = CostModel(simnet_profile(layers=L, seed=0)).tables(B)
        arrays = [encode(random_plan(rng, ranks, per_rank, m_lo, m_hi)) for _ in range(plans)]
        shape = {"ranks": ranks, "stages_per_rank": per_rank, "layers": L, "global_batch": B,
                 "microbatches_per_stage": [m_lo, m_hi], "split_share": 0.5}  # fmt: skip
    if not same(old_evaluate(pack(arrays), tables), evaluate(pack(arrays), tables)):
        raise SystemExit(f"{name}: the new evaluator disagrees with the old one")
    threads = numba.get_num_threads()
    # "_evaluate": the population packed before the round, so only the evaluator is timed (pack is the same
    # code for both contenders, and the search's cluster candidates reach evaluate packed by the generator).
    contenders = {f"{who}{alone}_{n}thread": (score, n, bool(alone))
                  for who, score in (("old", old_evaluate), ("new", evaluate))
                  for alone in ("", "_evaluate") for n in sorted({1, threads})}  # fmt: skip
    rates: dict[str, list[float]] = {k: [] for k in contenders}
    cpu_rates: dict[str, list[float]] = {k: [] for k in contenders}
    names = list(contenders)
    packed = pack(arrays)
    for i in range(rounds):
        for k in names[i % len(names) :] + names[: i % len(names)]:  # rotate who goes first
            score, n, alone = contenders[k]
            wall, cpu = rate(score, arrays, tables, n, packed if alone else None)
            rates[k].append(wall)
            cpu_rates[k].append(cpu)
    ratios = {f"new_over_old{alone}_{n}thread": summary([x / y for x, y in zip(rates[f"new{alone}_{n}thread"],
                                                                               rates[f"old{alone}_{n}thread"], strict=True)])
              for alone in ("", "_evaluate") for n in sorted({1, threads})}  # fmt: skip
    old1 = rates["old_1thread"]
    quarter = max(1, rounds // 4)
    return {
        **shape, "plans_per_round": len(arrays), "loadavg_1m_after": os.getloadavg()[0],
        "actions_per_plan_mean": statistics.fmean(int(a.act.shape[0]) for a in arrays),
        "plans_per_s": {k_: summary(v) for k_, v in rates.items()},
        "plans_per_cpu_s": {k_: summary(v) for k_, v in cpu_rates.items()},
        "ratios": ratios,
        "drift_old_1thread_last_over_first": statistics.median(old1[-quarter:]) / statistics.median(old1[:quarter]),
    }  # fmt: skip


GENERATOR_WORKLOAD = "gpt_cpu_generator"
"""The search's scoring of genomes, old generator against new (:func:`run_generator`)."""
GENERATED = ("act", "iteration_ms", "max_memory_bytes", "peak_memory_bytes", "busy_ms", "relaxed")
"""What the two generators must agree on, bit for bit."""


def same_generated(a: Generated, b: Generated) -> bool:
    """Whether two generators wrote the same lists, times, memory and relaxations."""
    return all(np.array_equal(getattr(a, f), getattr(b, f)) for f in GENERATED)


Generator = Callable[[PackedGenomes, CostTables, float], Generated]


STEPS = ("generate", "generate_evaluate", "generate_prepacked")
"""What a round times: pack and generate the genomes; that, then evaluate their lists; generate genomes
packed before the round (the compiled generator alone)."""


def scoring(make: Generator, genomes: list[Genome], rules: Rules, tables: CostTables, limit: float,
            step: str) -> Callable[[], object]:  # fmt: skip
    """One round's work, by its step (:data:`STEPS`)."""
    packed = pack_genomes(genomes, rules)

    def work() -> object:
        gen = make(packed if step == "generate_prepacked" else pack_genomes(genomes, rules), tables, limit)
        if step != "generate_evaluate":
            return gen
        return evaluate(pack([gen.array_plan(g, rules, c) for c, g in enumerate(genomes)]), tables)

    return work


def timed(work: Callable[[], object], items: int, threads: int) -> tuple[float, float]:
    """Items per second of one ``work()`` on ``threads`` numba threads, per second of wall time and of
    this process's CPU time (as :func:`rate`)."""
    before = numba.get_num_threads()
    numba.set_num_threads(threads)
    try:
        t, cpu = time.perf_counter(), time.process_time()
        work()
        return items / (time.perf_counter() - t), items / (time.process_time() - cpu)
    finally:
        numba.set_num_threads(before)


def run_generator(rounds: int) -> dict[str, Any]:
    """Rotated rounds of the old and new generator, alone and followed by the evaluator; rates, paired
    ratios and drift."""
    base, rules, tables, limit = search_genomes()
    for lim in (limit, np.inf):
        packed = pack_genomes(base, rules)
        if not same_generated(old_generate(packed, tables, lim), generate(packed, tables, lim)):
            raise SystemExit(f"{GENERATOR_WORKLOAD}: the new generator disagrees with the old one (limit {lim})")
    genomes = base * SEARCH_REPEATS
    threads = numba.get_num_threads()
    contenders = {f"{who}_{step}_{n}thread": (scoring(make, genomes, rules, tables, limit, step), n)
                  for step in STEPS for who, make in (("old", old_generate), ("new", generate))
                  for n in sorted({1, threads})}  # fmt: skip
    start_load = os.getloadavg()[0]
    rates: dict[str, list[float]] = {k: [] for k in contenders}
    cpu_rates: dict[str, list[float]] = {k: [] for k in contenders}
    names = list(contenders)
    for i in range(rounds):
        for k in names[i % len(names) :] + names[: i % len(names)]:  # rotate who goes first
            work, n = contenders[k]
            wall, cpu = timed(work, len(genomes), n)
            rates[k].append(wall)
            cpu_rates[k].append(cpu)
    ratios = {f"new_over_old_{per}{step}_{n}thread": ratio(got[f"new_{step}_{n}thread"], got[f"old_{step}_{n}thread"])
              for per, got in (("", rates), ("cpu_", cpu_rates)) for step in STEPS for n in sorted({1, threads})}  # fmt: skip
    old1 = rates["old_generate_1thread"]
    quarter = max(1, rounds // 4)
    return {
        "environment": environment(), "space": SEARCH_WORKLOAD, "ranks": SEARCH_RANKS, "global_batch": SEARCH_BATCH,
        "genomes": SEARCH_GENOMES, "repeats": SEARCH_REPEATS, "genomes_per_round": len(genomes),
        "memory_limit_bytes": limit, "old": "c4f7f15 + the fixed stash in its memory budget, copied into this file",
        "loadavg_1m_at_start": start_load, "loadavg_1m_after": os.getloadavg()[0],
        "genomes_per_s": {k_: summary(v) for k_, v in rates.items()},
        "genomes_per_cpu_s": {k_: summary(v) for k_, v in cpu_rates.items()},
        "ratios": ratios,
        "drift_old_generate_1thread_last_over_first": statistics.median(old1[-quarter:]) / statistics.median(old1[:quarter]),
    }  # fmt: skip


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--plans", type=int, default=1000, help="candidates per round")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--out", default="results/bench/evaluator.json")
    every = [*WORKLOADS, SEARCH_WORKLOAD, GENERATOR_WORKLOAD]
    ap.add_argument("--workloads", nargs="+", choices=every, default=every,
                    help="the workloads to run; the others' results in --out are kept")  # fmt: skip
    a = ap.parse_args(argv)
    out = Path(a.out)
    doc: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {"workloads": {}}
    if set(a.workloads) & {*WORKLOADS, SEARCH_WORKLOAD}:  # the evaluator's own run: its environment at the top
        doc |= {"schema": "umsearch.bench.evaluator/1", "environment": environment(),
                "numba_threads": numba.get_num_threads(), "old": "ca48f1c, copied into this file",
                "note": "rates per round (pack + evaluate; *_evaluate_*: evaluate alone on the population packed "
                        "before the round); ratios pair contenders of one round"}  # fmt: skip
    for w in a.workloads:
        doc["workloads"][w] = run_generator(a.rounds) if w == GENERATOR_WORKLOAD else run_workload(w, a.plans, a.rounds)
    write_json(out, doc)
    for w in a.workloads:
        res = doc["workloads"][w]
        if w == GENERATOR_WORKLOAD:
            for k, v in res["genomes_per_s"].items():
                print(f"{w} {k:32s} {v['median']:9.0f} genomes/s (95% CI {v['ci95'][0]:.0f}-{v['ci95'][1]:.0f}), "
                      f"{res['genomes_per_cpu_s'][k]['median']:.0f} per CPU second")
            for k, v in res["ratios"].items():
                print(f"{w} {k:44s} {v['median']:.2f}x (95% CI {v['ci95'][0]:.2f}-{v['ci95'][1]:.2f})")
            continue
        for k, v in res["plans_per_s"].items():
            cpu = res["plans_per_cpu_s"][k]["median"]
            print(f"{w} {k:24s} {v['median']:9.0f} plans/s (95% CI {v['ci95'][0]:.0f}-{v['ci95'][1]:.0f}), "
                  f"{cpu:.0f} per CPU second")
        for k, v in res["ratios"].items():
            print(f"{w} {k:32s} {v['median']:.2f}x (95% CI {v['ci95'][0]:.2f}-{v['ci95'][1]:.2f})")
    return doc


if __name__ == "__main__":
    main()
