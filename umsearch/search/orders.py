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
timed with the shared kernels of :mod:`umsearch.sim.kernels`, so the times,
busy times and memory this returns equal what :func:`umsearch.sim.population.evaluate`
computes for the generated lists (tested). Memory follows docs/model.md
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
from umsearch.sim import kernels
from umsearch.sim.jit import njit
from umsearch.sim.population import ArrayPlan, FloatArray, IntArray, offsets, stage_memory

POLICIES = {
    0: "backwards first (deepest stage first), then forwards, deepest stage first",
    1: "backwards first (deepest stage first), then forwards, shallowest stage first",
    2: "stage by stage from the deepest: its backward, else its forward",
    3: "forwards first (shallowest stage first) while the caps allow, then backwards, deepest first",
    4: "forwards first (deepest stage first) while the caps allow, then backwards, deepest first",
}
"""How a rank picks among its ready actions (the genome's per-rank ``policy``)."""

"""By the stage's split flag, the kind code that starts a backward (the kind after a forward, whole or
split): read off :mod:`umsearch.core.actions`' tables."""


# The generator's state, one row per quantity (numba reads these as compile-time constants).
F_NEXT, B_NEXT, W_NEXT, FORWARDED, BACKWARDED, FORCE = range(6)
"""``ints[row, j]``, per local stage j: its next forward, backward and ``W`` index; samples forwarded
and back-propagated; 1 while its next forward may pass the caps (a relaxation)."""
STAGE_ROWS = 6
NEXT_ROW = (F_NEXT, B_NEXT, B_NEXT, W_NEXT)
"""By kind code, the row of ``ints`` counting the stage's actions of that kind run so far (a ``B``
and an ``I`` both run the stage's next backward)."""
WRITTEN, PENDING_W, WAITING, LOCAL = range(4)
"""``rint[row, r]``, per rank r: actions written; ``I`` whose ``W`` waits; 1 while it waits for a
delivery; where its local stages start in ``local`` (``LOCAL`` has R + 1 entries)."""
RANK_INT_ROWS = 4
DECIDE_AT, LAST_END, LEVEL, BUDGET, WAITED_AT = range(5)
"""``rflt[row, r]``, per rank r: when it decides next; when its last action ended; its activation
level; its activation budget under the memory limit; when it began to wait."""
RANK_FLOAT_ROWS = 5


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
    ranks = [np.asarray(rules.placement_of(g.v, g.placement), dtype=np.int64) for g in genomes]
    fwd_len = np.fromiter((len(f) for g in genomes for f in g.forward), dtype=np.int64)
    bwd_len = np.fromiter((len(b) for g in genomes for b in g.backward), dtype=np.int64)
    split = np.fromiter((s for g in genomes for s in g.split), dtype=np.bool_)
    rank = np.concatenate(ranks)
    # Actions per rank: every forward, and every backward as B or as I and W.
    per_stage = fwd_len + bwd_len * (1 + split)
    stage_ptr = offsets([len(r) for r in ranks])
    R = rules.ranks
    per_rank = np.zeros(len(genomes) * R, dtype=np.int64)
    cand = np.repeat(np.arange(len(genomes)), [len(r) for r in ranks])
    np.add.at(per_rank, cand * R + rank, per_stage)
    cuts = [np.asarray(g.cuts, dtype=np.int64) for g in genomes]
    chain = itertools.chain.from_iterable
    fwd = np.fromiter(chain(chain(g.forward for g in genomes)), dtype=np.int64, count=int(fwd_len.sum()))
    bwd = np.fromiter(chain(chain(g.backward for g in genomes)), dtype=np.int64, count=int(bwd_len.sum()))
    return PackedGenomes(
        stage_ptr=stage_ptr, lo=np.concatenate([c[:-1] for c in cuts]), hi=np.concatenate([c[1:] for c in cuts]),
        rank=rank, recompute=np.fromiter((r for g in genomes for r in g.recompute), dtype=np.bool_),
        split=split, cap=np.fromiter((c for g in genomes for c in g.cap), dtype=np.int64),
        fwd=fwd, fwd_ptr=offsets(fwd_len), bwd=bwd, bwd_ptr=offsets(bwd_len),
        rank_ptr=np.arange(len(genomes) + 1, dtype=np.int64) * R,
        rank_cap=np.fromiter((c for g in genomes for c in g.rank_cap), dtype=np.int64),
        w_cap=np.fromiter((c for g in genomes for c in g.w_cap), dtype=np.int64),
        policy=np.fromiter((d for g in genomes for d in g.policy), dtype=np.int64),
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
    _generate_all(
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


@njit(cache=True, parallel=True)
def _generate_all(  # type: ignore[no-untyped-def]
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
        ints = np.empty((STAGE_ROWS, max_g), np.int64)
        dep_lo = np.empty(max_s, np.int64)
        dep_hi = np.empty(max_s, np.int64)
        deliv = np.empty(max_s)
        link = np.empty((max_r, max_r, 3))  # per directed rank pair: last arrival, latency, ms per byte
        rint = np.empty((RANK_INT_ROWS, max_r + 1), np.int64)
        rflt = np.empty((RANK_FLOAT_ROWS, max_r))
        local = np.empty(max_g, np.int64)
        for c in range(blk * n // blocks, (blk + 1) * n // blocks):
            ok = _generate_one(c, stage_ptr, lo, hi, rank, recompute, scale, split, cap, fwd, fwd_ptr, bwd, bwd_ptr,
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


@njit(cache=True)
def _backward_at(g, kind, s0, S, ints, bwd, bwd_ptr, dep_lo, dep_hi, deliv, n_f, b_base):  # type: ignore[no-untyped-def]
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


@njit(cache=True)
def _forward_at(g, s0, S, ints, fwd_ptr, dep_lo, dep_hi, deliv, f_base):  # type: ignore[no-untyped-def]
    """When stage g's next forward can start (as :func:`_backward_at`; caps not applied)."""
    k = ints[F_NEXT, g]
    if k >= fwd_ptr[s0 + g + 1] - fwd_ptr[s0 + g]:
        return -2.0
    p = kernels.source_stage(F, g, S)
    if p < 0:
        return 0.0
    slot = fwd_ptr[s0 + g] - f_base + k
    return kernels.ready_at(deliv, fwd_ptr[s0 + p] - f_base, dep_lo[slot], dep_hi[slot])


@njit(cache=True)
def _pending_w(first, last, local, ints, split, s0):  # type: ignore[no-untyped-def]
    """The deepest local stage with a weight gradient waiting, or -1."""
    for i in range(last - 1, first - 1, -1):
        g = local[i]
        if ints[W_NEXT, g] < ints[B_NEXT, g] and split[s0 + g]:
            return g
    return -1


@njit(cache=True)
def _candidate(c, s0, S, r, rint, local, ints, split, fwd, fwd_ptr, bwd, bwd_ptr, dep_lo, dep_hi, deliv,  # type: ignore[no-untyped-def]
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
        return _pending_w(first, last, local, ints, split, s0), W, now
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
                d = _backward_at(g, kind, s0, S, ints, bwd, bwd_ptr, dep_lo, dep_hi, deliv, n_f, b_base)
                if 0.0 <= d <= now:
                    return g, kind, now
                if d > now:
                    wake = min(wake, d)
            if forward:
                d = _forward_at(g, s0, S, ints, fwd_ptr, dep_lo, dep_hi, deliv, f_base)
                if d > now:
                    wake = min(wake, d)
                elif d >= 0.0:
                    size = fwd[fwd_ptr[s0 + g] + ints[F_NEXT, g]]
                    if ints[FORCE, g] or held == 0 or (ints[FORWARDED, g] - ints[BACKWARDED, g] < cap[s0 + g] and held < rank_cap
                                                   and level + stash_in[g] * size <= budget):  # fmt: skip
                        return g, F, now
    g = _pending_w(first, last, local, ints, split, s0)  # weight gradients fill the gap
    if g >= 0:
        return g, W, now
    return -1, -1, wake


@njit(cache=True)
def _setup(s0, S, R, r0, lo, hi, rank, recompute, stage_mem, param_prefix, state_factor,  # type: ignore[no-untyped-def]
           memory_limit, n_slots, deliv, local, ints, rint, rflt, stash_in, mem, busy, link):  # fmt: skip
    """Reset the state for one candidate: nothing delivered, every rank's local stages (ascending,
    ``local[rint[LOCAL, r] : rint[LOCAL, r + 1]]``), its budget under the memory limit, and what a
    forward of each stage adds per sample (from ``stage_mem``, :func:`stage_memory`)."""
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
        stash_in[g] = kernels.memory_delta(F, recompute[gg], stage_mem[gg, 0], stage_mem[gg, 1], stage_mem[gg, 2],
                                           stage_mem[gg, 3])[0]  # fmt: skip
        ints[:, g] = 0


@njit(cache=True)
def _generate_one(  # type: ignore[no-untyped-def]
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
    stash_in = np.empty(S)  # bytes a forward adds per sample (docs/model.md 5)
    _setup(s0, S, R, r0, lo, hi, rank, recompute, stage_mem, param_prefix, state_factor, memory_limit,
           n_f + bwd_ptr[s1] - b_base, deliv, local, ints, rint, rflt, stash_in, mem, busy, link)  # fmt: skip
    link[:R, :R, 1], link[:R, :R, 2] = latency, ms_per_byte  # one link between any two ranks
    remaining = act_ptr[r1] - act_ptr[r0]
    while remaining > 0:
        r = _next_rank(rint, rflt, act_ptr, r0, R)
        if r < 0:  # every rank waits on a cap and nothing is on its way
            r, g = _relax(s0, S, R, rint, rflt, local, ints, fwd_ptr, dep_lo, dep_hi, deliv, f_base, act_ptr, r0)
            if r < 0:
                return False
            relaxed[c] += 1
            ints[FORCE, g] = 1
            rint[WAITING, r] = 0
            rflt[DECIDE_AT, r] = rflt[WAITED_AT, r]
            continue
        now = rflt[DECIDE_AT, r]
        g, kind, wake = _candidate(c, s0, S, r, rint, local, ints, split, fwd, fwd_ptr, bwd, bwd_ptr, dep_lo, dep_hi,
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
        _advance(ints, rint, g, r, kind, size)
    for r in range(R):
        for i in range(rint[LOCAL, r], rint[LOCAL, r + 1]):
            g = local[i]
            mem[r0 + r] += state_factor * stage_mem[s0 + g, 5]
    return True


@njit(cache=True)
def _next_rank(rint, rflt, act_ptr, r0, R):  # type: ignore[no-untyped-def]
    """The unfinished rank that decides earliest (-1: every rank waits with nothing on its way)."""
    r = -1
    best = np.inf
    for q in range(R):
        if rint[WRITTEN, q] < act_ptr[r0 + q + 1] - act_ptr[r0 + q] and rflt[DECIDE_AT, q] < best:
            best = rflt[DECIDE_AT, q]
            r = q
    return r


@njit(cache=True)
def _advance(ints, rint, g, r, kind, size):  # type: ignore[no-untyped-def]
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


@njit(cache=True)
def _relax(s0, S, R, rint, rflt, local, ints, fwd_ptr, dep_lo, dep_hi, deliv, f_base, act_ptr, r0):  # type: ignore[no-untyped-def]
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
