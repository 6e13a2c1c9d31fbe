"""The order generator: every rank's action list from a genome, by list scheduling in simulated time.

Fixed orders (GPipe, 1F1B, the interleaved and zero-bubble families) are
written for equal microbatches on balanced stages. Unequal microbatches and
uneven stages shift every arrival, so here the order is made while the
iteration is simulated (docs/model.md section 4): whenever a rank is free it takes,
among its actions whose inputs have arrived,

1. a weight gradient ``W``, if at least ``w_cap[r]`` are waiting;
2. by its policy (:data:`POLICIES`), a backward (``B``, or ``I`` on a split
   stage: it frees memory and unblocks the ranks upstream) or a forward; a
   forward only while its stage holds fewer than ``cap[j]`` samples forwarded
   but not back-propagated, the rank fewer than ``rank_cap[r]`` over all its
   stages, and the rank's activations stay under the memory limit;
3. any waiting ``W``: weight gradients fill what would be idle time (the
   zero-bubble idea).

Otherwise the rank waits for its next input. If every rank waits on a cap
and nothing is on its way, the earliest such forward goes ahead anyway (a
relaxation), so generation never deadlocks. Each action starts at
``max(end of the rank's previous action, arrival of its inputs)`` and is
timed as the evaluator's loop times it, on the evaluator's own per-candidate
tables (``action_rows.prepare``: the rules of :mod:`umsearch.core.actions`
worked out once per stage and kind as slots and 0/1 factors, so no decision
branches on an action's kind), so the times, busy times and memory this
returns equal what :func:`umsearch.sim.population.evaluate` computes for the
generated lists (tested, bit for bit). Memory follows docs/model.md
section 5 whole: each stage's terms (:func:`stage_memory`) are fixed before
generation, as its rank, recompute flag and forward list, which decide its
hand-offs, are genes.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from numba import get_num_threads, prange

from umsearch.core.actions import BACKWARD_START, FEEDS, FORWARD_LIST, SPLIT, F, W
from umsearch.core.cost import CostTables
from umsearch.search.genome import Genome, Rules
from umsearch.sim.jit import njit
from umsearch.sim.kernels import action_code, memory_delta
from umsearch.sim.population import (
    ADD,
    ADD_FIXED,
    CROSS,
    DST,
    F_HI,
    F_LO,
    FLOAT_COLS,
    INT_COLS,
    READ_AT,
    READ_STEP,
    RECV_BYTES,
    REL,
    REL_FIXED,
    RERUN,
    SCALE,
    SEND_AT,
    SEND_BYTES,
    SEND_STEP,
    SENDS,
    SLOT,
    T_HI,
    T_LO,
    ArrayPlan,
    FloatArray,
    IntArray,
    PackedPlans,
    alike_replica_fields,
    offsets,
    prepare,
    scratch_sizes,
    stage_memory,
)

POLICIES = {
    0: "backwards first (deepest stage first), then forwards, deepest stage first",
    1: "backwards first (deepest stage first), then forwards, shallowest stage first",
    2: "stage by stage from the deepest: its backward, else its forward",
    3: "forwards first (shallowest stage first) while the caps allow, then backwards, deepest first",
    4: "forwards first (deepest stage first) while the caps allow, then backwards, deepest first",
}
"""How a rank picks among its ready actions (the genome's per-rank ``policy``)."""


# The generator's state, one row per quantity (numba reads these as compile-time constants).
F_NEXT, B_NEXT, W_NEXT, FORWARDED, BACKWARDED, FORCE = range(6)
"""``ints[row, j]``, per stage j of the candidate: its next forward, backward and ``W`` index; samples
forwarded and back-propagated; 1 while its next forward may pass the caps (a relaxation)."""
N_FWD, N_BWD, STARTS, CAP = range(6, 10)
"""Then what stays fixed while it is generated: its forward and backward list lengths, the kind code
its backwards start with (:data:`~umsearch.core.actions.BACKWARD_START` by its split flag), its cap."""
STAGE_ROWS = 10
NEXT_ROW = (F_NEXT, B_NEXT, B_NEXT, W_NEXT)
"""By kind code, the row of ``ints`` counting the stage's actions of that kind run so far (a ``B``
and an ``I`` both run the stage's next backward)."""
FORWARDS = tuple(int(FORWARD_LIST[k] != 0) for k in range(4))
"""By kind code, 1 where it forwards its samples (they are then held until back-propagated)."""
BACKWARDS = tuple(int(FORWARD_LIST[k] == 0 and FEEDS[k] != 0) for k in range(4))
"""By kind code, 1 where it back-propagates its samples (a ``B``, or an ``I``: it feeds a stage)."""
WAITS = tuple(BACKWARDS[k] * SPLIT[k] - int(FORWARD_LIST[k] == 0 and FEEDS[k] == 0) for k in range(4))
"""By kind code, the change of its rank's waiting weight gradients: +1 an ``I`` (its ``W`` now waits),
-1 a ``W`` (a backward's weight half, which feeds no stage)."""
WRITTEN, PENDING_W, WAITING, LOCAL, HELD, TOTAL = range(6)
"""``rint[row, r]``, per rank r: actions written; ``I`` whose ``W`` waits; 1 while it waits for a
delivery; where its local stages start in ``local`` (``LOCAL`` has R + 1 entries); samples its stages
hold forwarded but not back-propagated; its actions in all."""
RANK_INT_ROWS = 6
DECIDE_AT, LAST_END, LEVEL, BUDGET, WAITED_AT = range(5)
"""``rflt[row, r]``, per rank r: when it decides next; when its last action ended; its activation
level; its activation budget under the memory limit; when it began to wait."""
RANK_FLOAT_ROWS = 5
_u = np.uint64  # an index known not to be negative: no wraparound code


@dataclass(frozen=True, kw_only=True)
class PackedGenomes:
    """N genomes flattened for the compiled generator (CSR like :class:`umsearch.sim.population.PackedPlans`)."""

    stage_ptr: IntArray
    lo: IntArray
    hi: IntArray
    rank: IntArray
    recompute: npt.NDArray[np.bool_]
    split: npt.NDArray[np.bool_]
    cap: IntArray
    fwd: IntArray
    fwd_ptr: IntArray
    bwd: IntArray
    bwd_ptr: IntArray
    rank_ptr: IntArray
    rank_cap: IntArray
    w_cap: IntArray
    policy: IntArray
    act_ptr: IntArray
    """(total ranks + 1,) where each rank's generated actions go in the output array."""

    @property
    def size(self) -> int:
        return int(self.stage_ptr.shape[0]) - 1


def pack_genomes(genomes: Sequence[Genome], rules: Rules) -> PackedGenomes:
    """Flatten (valid) genomes for :func:`generate`."""
    chain = itertools.chain.from_iterable
    places = [rules.placement_of(g.v, g.placement) for g in genomes]
    n_stages = np.fromiter(map(len, places), dtype=np.int64, count=len(genomes))
    S = int(n_stages.sum())
    stage_ptr = offsets(n_stages)
    rank = np.fromiter(chain(places), dtype=np.int64, count=S)
    # Every genome's S + 1 cuts in a row: its stages' lo are all but its last, their hi all but its first.
    cuts = np.fromiter(chain(g.cuts for g in genomes), dtype=np.int64, count=S + len(genomes))
    cut_ptr = stage_ptr + np.arange(len(genomes) + 1)
    lo, hi = np.delete(cuts, cut_ptr[1:] - 1), np.delete(cuts, cut_ptr[:-1])
    fwd_len = np.fromiter(map(len, chain(g.forward for g in genomes)), dtype=np.int64, count=S)
    bwd_len = np.fromiter(map(len, chain(g.backward for g in genomes)), dtype=np.int64, count=S)
    split = np.fromiter(chain(g.split for g in genomes), dtype=np.bool_, count=S)
    # Actions per rank: every forward, and every backward as B or as I and W.
    per_stage = fwd_len + bwd_len * (1 + split)
    R = rules.ranks
    per_rank = np.zeros(len(genomes) * R, dtype=np.int64)
    np.add.at(per_rank, np.repeat(np.arange(len(genomes)), n_stages) * R + rank, per_stage)
    fwd = np.fromiter(chain(chain(g.forward for g in genomes)), dtype=np.int64, count=int(fwd_len.sum()))
    bwd = np.fromiter(chain(chain(g.backward for g in genomes)), dtype=np.int64, count=int(bwd_len.sum()))
    return PackedGenomes(
        stage_ptr=stage_ptr, lo=lo, hi=hi, rank=rank,
        recompute=np.fromiter(chain(g.recompute for g in genomes), dtype=np.bool_, count=S),
        split=split, cap=np.fromiter(chain(g.cap for g in genomes), dtype=np.int64, count=S),
        fwd=fwd, fwd_ptr=offsets(fwd_len), bwd=bwd, bwd_ptr=offsets(bwd_len),
        rank_ptr=np.arange(len(genomes) + 1, dtype=np.int64) * R,
        rank_cap=np.fromiter(chain(g.rank_cap for g in genomes), dtype=np.int64, count=len(genomes) * R),
        w_cap=np.fromiter(chain(g.w_cap for g in genomes), dtype=np.int64, count=len(genomes) * R),
        policy=np.fromiter(chain(g.policy for g in genomes), dtype=np.int64, count=len(genomes) * R),
        act_ptr=offsets(per_rank),
    )  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class Generated:
    """The generator's output: every rank's actions and what the iteration costs."""

    act: IntArray
    """Flat action codes (:func:`umsearch.core.actions.action_code`); rank g's are ``act[act_ptr[g]:act_ptr[g+1]]``."""
    iteration_ms: FloatArray
    """(N,) iteration time (``inf`` if generation failed, which it never should)."""
    max_memory_bytes: FloatArray
    """(N,) peak memory of the fullest rank."""
    peak_memory_bytes: FloatArray
    """Flat per-rank peak memory."""
    busy_ms: FloatArray
    """Flat per-rank busy time."""
    relaxed: IntArray
    """(N,) forwards that went past their stage's cap because every rank was waiting."""
    packed: PackedGenomes
    """What was generated from (for reading a candidate's lists back out)."""

    def array_plan(self, g: Genome, rules: Rules, c: int, **replicas: Any) -> ArrayPlan:
        """Candidate ``c`` (genome ``g``) with its generated lists, as an array plan; ``replicas``:
        the data-parallel fields (docs/model.md 9; ``batch`` then the global batch), if any."""
        p = self.packed
        r0, r1 = p.rank_ptr[c], p.rank_ptr[c + 1]
        return ArrayPlan(
            batch=replicas.pop("batch", rules.batch), ranks=rules.ranks, cuts=np.asarray(g.cuts, dtype=np.int64),
            rank=p.rank[p.stage_ptr[c] : p.stage_ptr[c + 1]].copy(),
            recompute=np.asarray(g.recompute, dtype=np.bool_),
            fwd=p.fwd[p.fwd_ptr[p.stage_ptr[c]] : p.fwd_ptr[p.stage_ptr[c + 1]]].copy(),
            fwd_len=np.diff(p.fwd_ptr[p.stage_ptr[c] : p.stage_ptr[c + 1] + 1]),
            bwd=p.bwd[p.bwd_ptr[p.stage_ptr[c]] : p.bwd_ptr[p.stage_ptr[c + 1]]].copy(),
            bwd_len=np.diff(p.bwd_ptr[p.stage_ptr[c] : p.stage_ptr[c + 1] + 1]),
            act=self.act[p.act_ptr[r0] : p.act_ptr[r1]].copy(), act_len=np.diff(p.act_ptr[r0 : r1 + 1]), **replicas,
        )  # fmt: skip

    def packed_plans(self, ranks: int, **replicas: Any) -> PackedPlans:
        """Every candidate with its generated lists, packed for :func:`~umsearch.sim.population.evaluate`: what
        :func:`~umsearch.sim.population.pack` makes of their :meth:`array_plan` (the same ``replicas`` for all;
        ``batch`` is not packed), without building and copying one plan per candidate."""
        p = self.packed
        replicas.pop("batch", None)
        return PackedPlans(stage_ptr=p.stage_ptr, lo=p.lo, hi=p.hi, rank=p.rank, recompute=p.recompute, fwd=p.fwd,
                           fwd_ptr=p.fwd_ptr, bwd=p.bwd, bwd_ptr=p.bwd_ptr, rank_ptr=p.rank_ptr, act=self.act,
                           act_ptr=p.act_ptr,
                           **alike_replica_fields(p.size, ranks, p.rank, **replicas))  # type: ignore[arg-type]  # fmt: skip

    def ranks_of(self, c: int, values: FloatArray) -> FloatArray:
        """Candidate ``c``'s slice of a per-rank array."""
        return values[self.packed.rank_ptr[c] : self.packed.rank_ptr[c + 1]]


def generate(packed: PackedGenomes, tables: CostTables, memory_limit: float) -> Generated:
    """Generate and time every genome's action lists (one compiled call for the population)."""
    n = packed.size
    n_ranks = int(packed.rank_ptr[-1])
    act = np.zeros(int(packed.act_ptr[-1]), dtype=np.int64)
    it, top = np.empty(n), np.empty(n)
    relaxed = np.zeros(n, dtype=np.int64)
    mem, busy = np.zeros(n_ranks), np.zeros(n_ranks)
    t = tables
    times = np.ascontiguousarray(t.times)
    _generate_all(
        packed.stage_ptr, packed.lo, packed.hi, packed.rank, packed.recompute, t.stage_scale(packed.lo, packed.hi),
        packed.split, packed.cap,
        packed.fwd, packed.fwd_ptr, packed.bwd, packed.bwd_ptr, packed.rank_ptr, packed.rank_cap, packed.w_cap,
        packed.policy, packed.act_ptr, times.reshape(-1), times.shape[1], times.shape[2], t.out_bytes,
        stage_memory(packed, tables), t.latency_ms, t.ms_per_byte, t.op_overhead_ms, t.message_overhead_ms,
        t.message_overhead_ms_per_byte, t.state_factor,
        memory_limit, act, it, top, mem, busy, relaxed, min(n, 4 * get_num_threads()),
    )  # fmt: skip
    return Generated(act=act, iteration_ms=it, max_memory_bytes=top, peak_memory_bytes=mem, busy_ms=busy,
                     relaxed=relaxed, packed=packed)  # fmt: skip


@njit(cache=True, parallel=True)
def _generate_all(  # type: ignore[no-untyped-def]
    stage_ptr, lo, hi, rank, recompute, scale, split, cap, fwd, fwd_ptr, bwd, bwd_ptr, rank_ptr, rank_cap, w_cap,
    policy, act_ptr, times, sizes, layers, out_bytes, stage_mem, latency, ms_per_byte, op_oh, msg_oh,
    msg_per_byte, state_factor, memory_limit, act, it, top, mem, busy, relaxed, blocks,
):  # fmt: skip
    n = stage_ptr.shape[0] - 1
    max_s, max_r, max_g, _, max_b = scratch_sizes(stage_ptr, rank_ptr, lo, hi, fwd, fwd_ptr, bwd, bwd_ptr)
    # Candidates are independent: blocks of them run on numba's threads, each with its own scratch.
    for blk in prange(blocks):
        # Per slot (the evaluator's, see action_rows.prepare): its size, the producer slots it reads and
        # their samples, and its delivery (-1: not yet).
        slot_size = np.empty(max_s, np.int64)
        offset = np.empty(max_s, np.int64)
        first = np.empty(max_s, np.int64)
        last = np.empty(max_s, np.int64)
        samples = np.empty(max_s, np.int64)
        owner = np.empty(max_b, np.int64)
        deliv = np.empty(max_s)
        row_int = np.empty((4 * max_g, INT_COLS), np.int64)  # per (stage, kind): see action_rows.prepare
        row_float = np.empty((4 * max_g, FLOAT_COLS))
        ints = np.empty((STAGE_ROWS, max_g), np.int64)
        stash_in = np.empty((2, max_g))  # per stage, bytes a forward adds per sample and per microbatch (docs/model.md 5)
        link = np.empty((max_r, max_r, 3))  # per directed rank pair: last arrival, latency, ms per byte
        rint = np.empty((RANK_INT_ROWS, max_r + 1), np.int64)
        rflt = np.empty((RANK_FLOAT_ROWS, max_r))
        local = np.empty(max_g, np.int64)
        for c in range(blk * n // blocks, (blk + 1) * n // blocks):
            s0, S = stage_ptr[c], stage_ptr[c + 1] - stage_ptr[c]
            r0, R = rank_ptr[c], rank_ptr[c + 1] - rank_ptr[c]
            prepare(s0, S, lo, hi, rank, recompute, scale, fwd, fwd_ptr, bwd, bwd_ptr, sizes, layers, out_bytes,
                     stage_mem, slot_size, offset, owner, first, last, samples, row_int, row_float)  # fmt: skip
            _setup(s0, S, R, r0, rank, recompute, split, cap, fwd_ptr, bwd_ptr, act_ptr, stage_mem, state_factor,
                   memory_limit, latency, ms_per_byte, deliv, local, ints, rint, rflt, stash_in, mem, busy,
                   link)  # fmt: skip
            ok = _generate_one(c, r0, R, rank_cap, w_cap, policy, act_ptr, times, layers, op_oh, msg_oh,
                               msg_per_byte, act, mem, busy, relaxed, slot_size, first, last, samples, deliv,
                               row_int, row_float, ints, stash_in, link, rint, rflt, local)  # fmt: skip
            last_t = peak = 0.0
            for r in range(R):
                for i in range(rint[LOCAL, r], rint[LOCAL, r + 1]):
                    mem[r0 + r] += state_factor * stage_mem[s0 + local[i], 5]
                last_t = max(last_t, rflt[LAST_END, r])
                peak = max(peak, mem[r0 + r])
            it[c] = last_t if ok else np.inf
            top[c] = peak if ok else np.inf


@njit(cache=True)
def _setup(s0, S, R, r0, rank, recompute, split, cap, fwd_ptr, bwd_ptr, act_ptr, stage_mem,  # type: ignore[no-untyped-def]
           state_factor, memory_limit, latency, ms_per_byte, deliv, local, ints, rint, rflt, stash_in, mem, busy,
           link):  # fmt: skip
    """Reset the state for one candidate: nothing delivered (but the slots that read no producer,
    action_rows.prepare's: delivered at 0), every stage's counters and fixed facts, every rank's local
    stages (ascending, ``local[rint[LOCAL, r] : rint[LOCAL, r + 1]]``), its actions in all, its budget
    under the memory limit, its links (to itself: free), and what a forward of each stage adds per
    sample and per microbatch, its fixed stash (from ``stage_mem``, :func:`stage_memory`)."""
    n_slots = fwd_ptr[s0 + S] - fwd_ptr[s0] + bwd_ptr[s0 + S] - bwd_ptr[s0]
    for q in range(n_slots):
        deliv[_u(q)] = -1.0
    for q in range(n_slots, n_slots + 2 * S + 2):
        deliv[_u(q)] = 0.0
    n_loc = 0
    for r in range(R):
        rint[LOCAL, r] = n_loc
        state = 0.0
        for g in range(S):
            if rank[s0 + g] == r:
                local[n_loc] = g
                n_loc += 1
                state += state_factor * stage_mem[s0 + g, 5]  # its parameters, a tied weight once per rank
        rint[WRITTEN, r], rint[PENDING_W, r], rint[WAITING, r], rint[HELD, r] = 0, 0, 0, 0
        rint[TOTAL, r] = act_ptr[r0 + r + 1] - act_ptr[r0 + r]
        rflt[DECIDE_AT, r], rflt[LAST_END, r], rflt[LEVEL, r], rflt[WAITED_AT, r] = 0.0, 0.0, 0.0, 0.0
        rflt[BUDGET, r] = memory_limit - state
        mem[r0 + r], busy[r0 + r] = 0.0, 0.0
        for q in range(R):
            free = q == r
            link[r, q, 0] = 0.0
            link[r, q, 1] = 0.0 if free else latency  # one link between any two ranks
            link[r, q, 2] = 0.0 if free else ms_per_byte
    rint[LOCAL, R] = n_loc
    for g in range(S):
        gg = s0 + g
        stash_in[0, g] = memory_delta(F, recompute[gg], stage_mem[gg, 0], stage_mem[gg, 1], stage_mem[gg, 2],
                                      stage_mem[gg, 3])[0]  # fmt: skip
        stash_in[1, g] = memory_delta(F, recompute[gg], stage_mem[gg, 4], 0.0, 0.0, 0.0)[0]  # the fixed stash
        for row in range(CAP):
            ints[row, g] = 0
        ints[N_FWD, g] = fwd_ptr[gg + 1] - fwd_ptr[gg]
        ints[N_BWD, g] = bwd_ptr[gg + 1] - bwd_ptr[gg]
        ints[STARTS, g] = BACKWARD_START[int(split[gg])]
        ints[CAP, g] = cap[gg]


@njit(cache=True)
def _generate_one(  # type: ignore[no-untyped-def]
    c, r0, R, rank_cap, w_cap, policy, act_ptr, times, layers, op_oh, msg_oh, msg_per_byte, act, mem, busy,
    relaxed, slot_size, first, last, samples, deliv, row_int, row_float, ints, stash_in, link, rint, rflt, local,
):  # fmt: skip
    """Generate candidate c's lists (its state from :func:`_setup`, its tables from action_rows.prepare);
    returns False only if no rank could go on (a bug, never expected).

    The rank that decides earliest takes its policy's choice (:data:`POLICIES`) and runs it: the timing of
    docs/model.md section 4 and the memory of section 5, spelled out as in the evaluator's loop
    (population._one) on the same tables; with nothing ready it waits for its next input. All inline on
    purpose, on this function's own arguments: a call passing arrays costs their reference counts on
    every decision (ARCHITECTURE.md), and a branch on an action's kind its mispredictions.
    """
    remaining = act_ptr[r0 + R] - act_ptr[r0]
    while remaining > 0:
        r = -1  # the unfinished rank that decides earliest
        now = np.inf
        for q in range(R):
            if rint[WRITTEN, _u(q)] < rint[TOTAL, _u(q)] and rflt[DECIDE_AT, _u(q)] < now:
                now = rflt[DECIDE_AT, _u(q)]
                r = q
        if r < 0:  # every rank waits on a cap and nothing is on its way
            r, g = _relax(R, rint, rflt, local, ints, row_int, first, last, deliv)
            if r < 0:
                return False
            relaxed[c] += 1
            ints[FORCE, g] = 1
            rint[WAITING, r] = 0
            rflt[DECIDE_AT, r] = rflt[WAITED_AT, r]
            continue
        ur = _u(r)
        # Its choice by its policy: the stage g, the kind, and when its inputs arrived (``ready``).
        first_i, last_i = rint[LOCAL, ur], rint[LOCAL, ur + 1]
        pending = -1  # the deepest local stage with a weight gradient waiting
        if rint[PENDING_W, ur] > 0:
            for i in range(last_i - 1, first_i - 1, -1):
                g = local[_u(i)]
                if ints[W_NEXT, _u(g)] < ints[B_NEXT, _u(g)] and SPLIT[ints[STARTS, _u(g)]]:
                    pending = g
                    break
        g, kind, ready = pending, W, 0.0
        if rint[PENDING_W, ur] < w_cap[r0 + r] or pending < 0:  # else too many weight gradients wait
            g, ready = -1, np.inf  # none chosen yet; ``ready``: the earliest arrival it waits for
            p = policy[r0 + r]
            n = last_i - first_i
            # Policies 0/1 sweep backwards then forwards, 3/4 forwards then backwards, 2 both per stage.
            sweeps, halves = (1, 2) if p == 2 else (2, 1)
            for sweep in range(sweeps):
                for step in range(n):
                    for half in range(halves):
                        backward = half == 0 if p == 2 else (sweep == 0) == (p < 2)
                        shallow_first = not backward and (p == 1 or p == 3)
                        j = local[_u(first_i + step if shallow_first else last_i - 1 - step)]
                        uj = _u(j)
                        kind = ints[STARTS, uj] if backward else F
                        k = ints[B_NEXT, uj] if backward else ints[F_NEXT, uj]
                        row = _u(4 * j + kind)
                        size = slot_size[_u(row_int[row, SLOT] + k)]
                        if k >= ints[N_BWD if backward else N_FWD, uj] or (  # none left, or forwards to run first
                                backward and ints[FORWARDED, uj] < ints[BACKWARDED, uj] + size):  # fmt: skip
                            continue
                        reads = _u(row_int[row, READ_AT] + k * row_int[row, READ_STEP])
                        lo_m, hi_m = first[reads], last[reads]
                        d_lo, d_hi = deliv[_u(lo_m)], deliv[_u(hi_m)]
                        d, low = max(d_lo, d_hi), min(d_lo, d_hi)
                        for m in range(lo_m + 1, hi_m):  # the producers between
                            d = max(d, deliv[_u(m)])
                            low = min(low, deliv[_u(m)])
                        if low < 0.0:  # a producer has not run
                            continue
                        if d > now:
                            ready = min(ready, d)
                            continue
                        held = rint[HELD, ur]
                        if backward or ints[FORCE, uj] or held == 0 or (
                                ints[FORWARDED, uj] - ints[BACKWARDED, uj] < ints[CAP, uj] and held < rank_cap[r0 + r]
                                and rflt[LEVEL, ur] + stash_in[0, uj] * size + stash_in[1, uj] <= rflt[BUDGET, ur]):  # fmt: skip
                            g, ready = j, d
                            break
                    if g >= 0:
                        break
                if g >= 0:
                    break
            if g < 0 and pending >= 0:  # weight gradients fill the gap
                g, kind, ready = pending, W, 0.0
        if g < 0:
            rint[WAITING, ur] = 1  # waiting: a delivery to this rank wakes it
            rflt[WAITED_AT, ur] = now
            rflt[DECIDE_AT, ur] = ready
            continue
        # Run it: docs/model.md section 4's timing, then section 5's memory, then the counters.
        row = _u(4 * g + kind)
        k = ints[NEXT_ROW[kind], _u(g)]
        reads = _u(row_int[row, READ_AT] + k * row_int[row, READ_STEP])
        start = max(rflt[LAST_END, ur], ready)
        size = slot_size[_u(row_int[row, SLOT] + k)]
        at = size * layers
        dur = times[_u(row_int[row, T_HI] + at)] - times[_u(row_int[row, T_LO] + at)]
        dur += row_float[row, RERUN] * (times[_u(row_int[row, F_HI] + at)] - times[_u(row_int[row, F_LO] + at)])
        dur *= row_float[row, SCALE]
        # One message per producer by its full size, and one sent, each only across ranks.
        need = row_float[row, CROSS] * ((last[reads] - first[reads] + 1) * msg_oh + msg_per_byte *
                                         samples[reads] * row_float[row, RECV_BYTES])  # fmt: skip
        sent_ms = row_float[row, SENDS] * (1 * msg_oh + msg_per_byte * size * row_float[row, SEND_BYTES])
        end = start + dur + op_oh + need + sent_ms
        dst = _u(row_int[row, DST])  # its own rank when it sends nothing: a link that costs nothing
        arrival = max(end, link[ur, dst, 0]) + (link[ur, dst, 1] + size * row_float[row, SEND_BYTES] *
                                                link[ur, dst, 2])  # fmt: skip
        link[ur, dst, 0] = arrival
        deliv[_u(row_int[row, SEND_AT] + k * row_int[row, SEND_STEP])] = arrival
        if rint[WAITING, dst]:  # wake a waiting consumer, no earlier than its own last end (its own rank: set below)
            rflt[DECIDE_AT, dst] = min(rflt[DECIDE_AT, dst], max(arrival, rflt[LAST_END, dst]))
        add = (row_float[row, ADD] * size + row_float[row, ADD_FIXED] + row_float[row, ADD + 1] * size +
               row_float[row, ADD + 2] * size + row_float[row, ADD + 3] * size)
        rel = (row_float[row, REL] * size + row_float[row, REL_FIXED] + row_float[row, REL + 1] * size +
               row_float[row, REL + 2] * size + row_float[row, REL + 3] * size)
        level = rflt[LEVEL, ur] + add
        mem[_u(r0 + r)] = max(mem[_u(r0 + r)], level)
        rflt[LEVEL, ur] = level - rel
        busy[_u(r0 + r)] += end - start
        rflt[DECIDE_AT, ur] = rflt[LAST_END, ur] = end
        rint[WAITING, ur] = 0
        act[_u(act_ptr[r0 + r] + rint[WRITTEN, ur])] = action_code(g, kind, k)
        rint[WRITTEN, ur] += 1
        ints[NEXT_ROW[kind], _u(g)] += 1
        ints[FORWARDED, _u(g)] += FORWARDS[kind] * size
        ints[BACKWARDED, _u(g)] += BACKWARDS[kind] * size
        ints[FORCE, _u(g)] *= 1 - FORWARDS[kind]
        rint[HELD, ur] += (FORWARDS[kind] - BACKWARDS[kind]) * size
        rint[PENDING_W, ur] += WAITS[kind]
        remaining -= 1
    return True


@njit(cache=True)
def _ready(reads, first, last, deliv):  # type: ignore[no-untyped-def]
    """When the producers of slot ``reads`` have all delivered (the latest delivery), or -1 while one has
    not (a slot reading none reads the idle slot, delivered at 0)."""
    t = 0.0
    for m in range(first[reads], last[reads] + 1):
        if deliv[m] < 0.0:
            return -1.0
        t = max(t, deliv[m])
    return t


@njit(cache=True)
def _relax(R, rint, rflt, local, ints, row_int, first, last, deliv):  # type: ignore[no-untyped-def]
    """Every rank waits and nothing is on its way: the (rank, stage) whose next forward has its inputs
    and is held back only by its cap or the memory budget, earliest first; (-1, -1) if none."""
    best_r = best_g = -1
    best_t = np.inf
    for r in range(R):
        if rint[WRITTEN, r] >= rint[TOTAL, r]:
            continue
        for i in range(rint[LOCAL, r], rint[LOCAL, r + 1]):
            g = local[i]
            k = ints[F_NEXT, g]
            if k >= ints[N_FWD, g]:
                continue
            d = _ready(row_int[4 * g + F, READ_AT] + k * row_int[4 * g + F, READ_STEP], first, last, deliv)
            if d >= 0.0 and max(d, rflt[LAST_END, r]) < best_t:
                best_t, best_r, best_g = max(d, rflt[LAST_END, r]), r, g
    if best_r >= 0:
        rflt[WAITED_AT, best_r] = best_t
    return best_r, best_g
