"""The batch evaluator: score a whole population of plans in one compiled call.

Same model as :mod:`umsearch.sim.reference`, reorganised for speed. An
action's start is ``max(end of its rank's previous action, delivery of the
last input it needs)``; those are known as soon as the producers have run, so
ranks are swept round-robin, each advancing while its next action's producers
are done. Messages on one directed link leave in the sender's order, which is
its rank's list order, so the link's state is its last arrival. A sweep
without progress while actions remain is a deadlock. The loop is sequential
per candidate with data-dependent branching, which numpy cannot vectorize, so
it is compiled with numba (nopython, cached on disk).

Candidates travel as :class:`ArrayPlan` (numpy arrays, no Python object per
action), so packing a population is a handful of concatenations:
:func:`encode` turns a :class:`~umsearch.core.plan.Plan` into one and
:func:`decode` turns one back. An action is one int64 code,
``mb << 12 | stage << 2 | kind`` (kinds ``F B I W`` are 0..3).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from numba import njit

from umsearch.core.actions import KIND_CODE, KINDS, Action
from umsearch.core.cost import CostTables
from umsearch.core.plan import Plan, Stage

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

MAX_STAGES = 1024
"""Stages an action code can name (10 bits)."""


def action_code(stage: int, kind: int, mb: int) -> int:
    """The int64 code of one action (``kind`` as in :data:`umsearch.core.actions.KIND_CODE`)."""
    return (mb << 12) | (stage << 2) | kind


@dataclass(frozen=True, eq=False)
class ArrayPlan:
    """One plan as arrays, the form the search edits and the evaluator packs."""

    batch: int
    """Global batch B."""
    ranks: int
    """Ranks R."""
    cuts: IntArray
    """(S+1,) stage boundaries ``0 = c0 < ... < cS = L``."""
    rank: IntArray
    """(S,) rank of each stage."""
    recompute: BoolArray
    """(S,) recompute flag of each stage."""
    forward: tuple[IntArray, ...]
    """Per stage, its forward microbatch sizes."""
    backward: tuple[IntArray, ...]
    """Per stage, its backward microbatch sizes."""
    actions: tuple[IntArray, ...]
    """Per rank, its action codes in order."""

    @property
    def stages(self) -> int:
        return len(self.rank)


def encode(plan: Plan) -> ArrayPlan:
    """The arrays of a (valid) plan."""
    st = plan.stages
    codes = tuple(np.array([action_code(a.stage, KIND_CODE[a.kind], a.mb) for a in acts], dtype=np.int64)
                  for acts in plan.actions)  # fmt: skip
    return ArrayPlan(
        batch=plan.global_batch, ranks=plan.ranks,
        cuts=np.array([s.lo for s in st] + [st[-1].hi], dtype=np.int64),
        rank=np.array([s.rank for s in st], dtype=np.int64),
        recompute=np.array([s.recompute for s in st], dtype=np.bool_),
        forward=tuple(np.array(s.forward, dtype=np.int64) for s in st),
        backward=tuple(np.array(s.backward, dtype=np.int64) for s in st),
        actions=codes,
    )  # fmt: skip


def decode(ap: ArrayPlan) -> Plan:
    """The :class:`~umsearch.core.plan.Plan` of an array plan (not validated here)."""
    stages = tuple(
        Stage(layers=(int(ap.cuts[j]), int(ap.cuts[j + 1])), rank=int(ap.rank[j]),
              forward=tuple(int(v) for v in ap.forward[j]), backward=tuple(int(v) for v in ap.backward[j]),
              recompute=bool(ap.recompute[j]))
        for j in range(ap.stages)
    )  # fmt: skip
    actions = tuple(
        tuple(Action(int(c >> 2) & (MAX_STAGES - 1), KINDS[int(c) & 3], int(c >> 12)) for c in codes.tolist())
        for codes in ap.actions
    )
    return Plan(global_batch=ap.batch, ranks=ap.ranks, stages=stages, actions=actions)


@dataclass(frozen=True, kw_only=True)
class PackedPlans:
    """N array plans flattened CSR-style: candidate c's stages are ``stage_ptr[c]..stage_ptr[c+1]``."""

    stage_ptr: IntArray
    """(N+1,) offsets of each candidate's stages in the stage arrays."""
    lo: IntArray
    """Per stage (all candidates), first layer."""
    hi: IntArray
    """Per stage, one past the last layer."""
    rank: IntArray
    """Per stage, its rank."""
    recompute: BoolArray
    """Per stage, its recompute flag."""
    fwd: IntArray
    """Flat forward sizes; stage g's are ``fwd[fwd_ptr[g]:fwd_ptr[g+1]]``."""
    fwd_ptr: IntArray
    bwd: IntArray
    """Flat backward sizes, likewise."""
    bwd_ptr: IntArray
    rank_ptr: IntArray
    """(N+1,) offsets of each candidate's ranks in ``act_ptr``."""
    act: IntArray
    """Flat action codes; rank g's are ``act[act_ptr[g]:act_ptr[g+1]]``."""
    act_ptr: IntArray

    @property
    def size(self) -> int:
        return int(self.stage_ptr.shape[0]) - 1


def _ptr(lengths: Sequence[int]) -> IntArray:
    out = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=out[1:])
    return out


def _flat(arrays: Sequence[IntArray]) -> tuple[IntArray, IntArray]:
    return (np.concatenate(arrays) if arrays else np.zeros(0, np.int64)), _ptr([len(a) for a in arrays])


def pack(candidates: Sequence[ArrayPlan]) -> PackedPlans:
    """Flatten array plans (any mix of rank and stage counts) for :func:`evaluate`."""
    if not candidates:
        raise ValueError("pack needs at least one candidate")
    fwd, fwd_ptr = _flat([f for c in candidates for f in c.forward])
    bwd, bwd_ptr = _flat([b for c in candidates for b in c.backward])
    act, act_ptr = _flat([a for c in candidates for a in c.actions])
    cuts = [c.cuts for c in candidates]
    return PackedPlans(
        stage_ptr=_ptr([c.stages for c in candidates]),
        lo=np.concatenate([c[:-1] for c in cuts]), hi=np.concatenate([c[1:] for c in cuts]),
        rank=np.concatenate([c.rank for c in candidates]),
        recompute=np.concatenate([c.recompute for c in candidates]),
        fwd=fwd, fwd_ptr=fwd_ptr, bwd=bwd, bwd_ptr=bwd_ptr,
        rank_ptr=_ptr([c.ranks for c in candidates]), act=act, act_ptr=act_ptr,
    )  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class BatchResult:
    """Scores of a packed population, entry c for candidate c."""

    iteration_ms: FloatArray
    """(N,) iteration time; ``inf`` where the candidate deadlocks."""
    deadlock: BoolArray
    """(N,) True where the candidate deadlocks."""
    max_memory_bytes: FloatArray
    """(N,) peak memory of the fullest rank (``inf`` on deadlock)."""
    peak_memory_bytes: FloatArray
    """Flat per-rank peak memory; candidate c's ranks are ``rank_ptr[c]..rank_ptr[c+1]``."""
    busy_ms: FloatArray
    """Flat per-rank busy time, likewise."""
    rank_end_ms: FloatArray
    """Flat per-rank end of the last action that ran, likewise."""
    rank_ptr: IntArray
    """(N+1,) offsets into the per-rank arrays."""

    def ranks_of(self, c: int, values: FloatArray) -> FloatArray:
        """Candidate ``c``'s slice of a per-rank array."""
        return values[self.rank_ptr[c] : self.rank_ptr[c + 1]]


def evaluate(packed: PackedPlans, tables: CostTables) -> BatchResult:
    """Score every candidate; agrees with :func:`umsearch.sim.reference.simulate` to 1e-9 relative.

    Assumes valid candidates that fit the tables (:func:`umsearch.core.plan.validate_plan`,
    :meth:`umsearch.core.cost.CostModel.check`, sizes up to ``tables.b_max``).
    """
    n = packed.size
    n_ranks = int(packed.rank_ptr[-1])
    it = np.empty(n)
    dead = np.zeros(n, dtype=np.bool_)
    top = np.empty(n)
    mem, busy, ends = np.zeros(n_ranks), np.zeros(n_ranks), np.zeros(n_ranks)
    t = tables
    _evaluate_all(
        packed.stage_ptr, packed.lo, packed.hi, packed.rank, packed.recompute, packed.fwd, packed.fwd_ptr,
        packed.bwd, packed.bwd_ptr, packed.rank_ptr, packed.act, packed.act_ptr,
        t.fwd, t.bwd, t.bwd_input, t.bwd_weight, t.out_bytes, t.stash_prefix, t.param_prefix, t.input_bytes,
        t.latency_ms, t.ms_per_byte, t.op_overhead_ms, t.message_overhead_ms, t.state_factor,
        it, dead, top, mem, busy, ends,
    )  # fmt: skip
    return BatchResult(iteration_ms=it, deadlock=dead, max_memory_bytes=top, peak_memory_bytes=mem, busy_ms=busy,
                       rank_end_ms=ends, rank_ptr=packed.rank_ptr)  # fmt: skip


@njit(cache=True)
def _evaluate_all(  # type: ignore[no-untyped-def]
    stage_ptr, lo, hi, rank, recompute, fwd, fwd_ptr, bwd, bwd_ptr, rank_ptr, act, act_ptr,
    t_fwd, t_bwd, t_inp, t_wgt, out_bytes, stash_prefix, param_prefix, input_bytes,
    latency, ms_per_byte, op_oh, msg_oh, state_factor,
    it, dead, top, mem, busy, ends,
):  # fmt: skip
    n = stage_ptr.shape[0] - 1
    # Scratch sized for the largest candidate, reused across candidates.
    max_f = max_b = max_s = max_r = 1
    for c in range(n):
        s0, s1 = stage_ptr[c], stage_ptr[c + 1]
        max_s = max(max_s, s1 - s0)
        max_r = max(max_r, rank_ptr[c + 1] - rank_ptr[c])
        max_f = max(max_f, fwd_ptr[s1] - fwd_ptr[s0])
        max_b = max(max_b, bwd_ptr[s1] - bwd_ptr[s0])
    fdep_lo = np.empty(max_f, np.int64)  # per forward: first/last forward of the previous stage it needs
    fdep_hi = np.empty(max_f, np.int64)
    gdep_lo = np.empty(max_b, np.int64)  # per backward: first/last backward of the next stage it needs
    gdep_hi = np.empty(max_b, np.int64)
    fdeliv = np.empty(max_f)  # delivery time of each forward's output to the next stage (-1: not yet)
    gdeliv = np.empty(max_b)  # delivery time of each B/I's input gradient to the previous stage
    link = np.empty((max_r, max_r))  # link[src, dst]: arrival of its last message
    pos = np.empty(max_r, np.int64)
    clock = np.empty(max_r)
    level = np.empty(max_r)
    for c in range(n):
        dead[c] = _one(c, stage_ptr, lo, hi, rank, recompute, fwd, fwd_ptr, bwd, bwd_ptr, rank_ptr, act, act_ptr,
                       t_fwd, t_bwd, t_inp, t_wgt, out_bytes, stash_prefix, param_prefix, input_bytes,
                       latency, ms_per_byte, op_oh, msg_oh, state_factor,
                       fdep_lo, fdep_hi, gdep_lo, gdep_hi, fdeliv, gdeliv, link, pos, clock, level,
                       mem, busy, ends)  # fmt: skip
        r0, r1 = rank_ptr[c], rank_ptr[c + 1]
        last = 0.0
        peak = 0.0
        for g in range(r0, r1):
            last = max(last, ends[g])
            peak = max(peak, mem[g])
        it[c] = np.inf if dead[c] else last
        top[c] = np.inf if dead[c] else peak


@njit(cache=True)
def _spans(sender, s0, s1, receiver, r0, r1, first, last):  # type: ignore[no-untyped-def]
    """For each receiver microbatch, the first and last sender microbatch holding its samples (one merge)."""
    m = s0
    end = sender[m]
    start = 0
    for k in range(r1 - r0):
        stop = start + receiver[r0 + k]
        first[k] = m - s0
        while end < stop:
            m += 1
            end += sender[m]
        last[k] = m - s0
        start = stop
        if end == stop and m + 1 < s1:
            m += 1
            end += sender[m]


@njit(cache=True)
def _one(  # type: ignore[no-untyped-def]
    c, stage_ptr, lo, hi, rank, recompute, fwd, fwd_ptr, bwd, bwd_ptr, rank_ptr, act, act_ptr,
    t_fwd, t_bwd, t_inp, t_wgt, out_bytes, stash_prefix, param_prefix, input_bytes,
    latency, ms_per_byte, op_oh, msg_oh, state_factor,
    fdep_lo, fdep_hi, gdep_lo, gdep_hi, fdeliv, gdeliv, link, pos, clock, level, mem, busy, ends,
):  # fmt: skip
    """Run candidate c to the end or to a deadlock; returns True on deadlock."""
    s0, s1 = stage_ptr[c], stage_ptr[c + 1]
    S = s1 - s0
    r0, r1 = rank_ptr[c], rank_ptr[c + 1]
    R = r1 - r0
    f_base, b_base = fwd_ptr[s0], bwd_ptr[s0]
    # Producer ranges: forward k of stage j (global index g) reads stage g-1's forwards; backward k reads
    # stage g+1's backwards. Indices into the scratch arrays are relative to the candidate's first stage.
    for g in range(s0, s1):
        if g > s0:
            _spans(fwd, fwd_ptr[g - 1], fwd_ptr[g], fwd, fwd_ptr[g], fwd_ptr[g + 1],
                   fdep_lo[fwd_ptr[g] - f_base :], fdep_hi[fwd_ptr[g] - f_base :])  # fmt: skip
        if g < s1 - 1:
            _spans(bwd, bwd_ptr[g + 1], bwd_ptr[g + 2], bwd, bwd_ptr[g], bwd_ptr[g + 1],
                   gdep_lo[bwd_ptr[g] - b_base :], gdep_hi[bwd_ptr[g] - b_base :])  # fmt: skip
    for i in range(fwd_ptr[s1] - f_base):
        fdeliv[i] = -1.0
    for i in range(bwd_ptr[s1] - b_base):
        gdeliv[i] = -1.0
    for r in range(R):
        pos[r] = 0
        clock[r] = 0.0
        level[r] = 0.0
        mem[r0 + r] = 0.0
        busy[r0 + r] = 0.0
        for q in range(R):
            link[r, q] = 0.0
    remaining = act_ptr[r1] - act_ptr[r0]
    progress = True
    while remaining > 0 and progress:
        progress = False
        for r in range(R):
            a0 = act_ptr[r0 + r]
            n_act = act_ptr[r0 + r + 1] - a0
            while pos[r] < n_act:
                code = act[a0 + pos[r]]
                kind = code & 3
                j = (code >> 2) & 1023
                k = code >> 12
                g = s0 + j
                l_lo, l_hi = lo[g], hi[g]
                start = clock[r]
                needs = 0
                if kind == 0:
                    size = fwd[fwd_ptr[g] + k]
                    if j > 0:
                        i = fwd_ptr[g] - f_base + k
                        p_base = fwd_ptr[g - 1] - f_base
                        blocked = False
                        for m in range(fdep_lo[i], fdep_hi[i] + 1):
                            d = fdeliv[p_base + m]
                            if d < 0.0:
                                blocked = True
                                break
                            start = max(start, d)
                        if blocked:
                            break
                        if rank[g - 1] != rank[g]:
                            needs = fdep_hi[i] - fdep_lo[i] + 1
                    dur = t_fwd[size, l_hi] - t_fwd[size, l_lo]
                else:
                    size = bwd[bwd_ptr[g] + k]
                    if kind != 3 and j < S - 1:
                        i = bwd_ptr[g] - b_base + k
                        p_base = bwd_ptr[g + 1] - b_base
                        blocked = False
                        for m in range(gdep_lo[i], gdep_hi[i] + 1):
                            d = gdeliv[p_base + m]
                            if d < 0.0:
                                blocked = True
                                break
                            start = max(start, d)
                        if blocked:
                            break
                        if rank[g + 1] != rank[g]:
                            needs = gdep_hi[i] - gdep_lo[i] + 1
                    if kind == 1:
                        dur = t_bwd[size, l_hi] - t_bwd[size, l_lo]
                    elif kind == 2:
                        dur = t_inp[size, l_hi] - t_inp[size, l_lo]
                    else:
                        dur = t_wgt[size, l_hi] - t_wgt[size, l_lo]
                    if recompute[g] and kind != 3:
                        dur += t_fwd[size, l_hi] - t_fwd[size, l_lo]
                # Where the output goes: forward to stage j+1, B/I gradient to stage j-1.
                to = -1
                if kind == 0 and j < S - 1:
                    to = g + 1
                elif (kind == 1 or kind == 2) and j > 0:
                    to = g - 1
                sends = 1 if to >= 0 and rank[to] != rank[g] else 0
                dur += op_oh + msg_oh * (sends + needs)
                end = start + dur
                if to >= 0:
                    if sends == 0:
                        arrival = end
                    else:
                        dst = rank[to]
                        edge = l_hi - 1 if kind == 0 else l_lo - 1
                        arrival = max(end, link[r, dst]) + latency + size * out_bytes[edge] * ms_per_byte
                        link[r, dst] = arrival
                    if kind == 0:
                        fdeliv[fwd_ptr[g] - f_base + k] = arrival
                    else:
                        gdeliv[bwd_ptr[g] - b_base + k] = arrival
                # Memory (MODEL.md 5): additions, the peak, then releases.
                stash = (stash_prefix[l_hi] - stash_prefix[l_lo]) * size
                if recompute[g]:
                    inp = (input_bytes if l_lo == 0 else out_bytes[l_lo - 1]) * size
                    if kind == 0:
                        add, rel = inp, 0.0
                    elif kind == 1:
                        add, rel = stash, inp + stash
                    elif kind == 2:
                        add, rel = stash, inp
                    else:
                        add, rel = 0.0, stash
                else:
                    add = stash if kind == 0 else 0.0
                    rel = stash if kind == 1 or kind == 3 else 0.0
                level[r] += add
                mem[r0 + r] = max(mem[r0 + r], level[r])
                level[r] -= rel
                busy[r0 + r] += dur
                clock[r] = end
                pos[r] += 1
                remaining -= 1
                progress = True
    for r in range(R):
        ends[r0 + r] = clock[r]
    for g in range(s0, s1):
        mem[r0 + rank[g]] += state_factor * (param_prefix[hi[g]] - param_prefix[lo[g]])
    return remaining > 0
