"""The batch evaluator: score a whole population of plans in one compiled call.

Same model as :mod:`umsearch.sim.reference`, reorganised for speed. Every op's
start is ``max(end of the stage's previous op, arrival of the last message it
needs)``; messages on a link direction are serialized, so arrival times only
grow and the last needed message is the only one to wait for. Stages are swept
round-robin, each advancing while its next op's dependency is met; a sweep
without progress while ops remain is a deadlock. The loop is sequential per
candidate with data-dependent branching, which numpy cannot vectorize well,
so it is compiled with numba (nopython, cached on disk); see ``make bench``.

Candidates are packed CSR-style: ``fwd_ptr[c * S + s]`` is where candidate c's
stage s forward list starts in the flat ``fwd`` array (likewise ``bwd``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain

import numpy as np
import numpy.typing as npt
from numba import njit

from umsearch.core.cost import CostModel
from umsearch.core.plan import Plan

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True, kw_only=True)
class PackedPlans:
    """N candidate plans with the same stage count S and global batch."""

    batch: int
    """Global batch B shared by all candidates."""
    cuts: IntArray
    """(N, S+1) stage boundaries ``0 = c0 < c1 < ... < cS = L``."""
    fwd: IntArray
    """Flat forward microbatch sizes."""
    fwd_ptr: IntArray
    """(N*S+1,) offsets into ``fwd`` for candidate-stage ``c*S+s``."""
    bwd: IntArray
    """Flat backward microbatch sizes."""
    bwd_ptr: IntArray
    """(N*S+1,) offsets into ``bwd``."""
    warmup: IntArray
    """(N, S) warmup per stage."""
    recompute: BoolArray
    """(N, S) recompute flag per stage."""

    @property
    def size(self) -> int:
        return int(self.cuts.shape[0])

    @property
    def stages(self) -> int:
        return int(self.cuts.shape[1]) - 1


@dataclass(frozen=True, kw_only=True)
class BatchResult:
    """Scores of a packed population, row c for candidate c."""

    iteration_ms: FloatArray
    """(N,) iteration time; ``inf`` where the candidate deadlocks."""
    deadlock: BoolArray
    """(N,) True where the candidate deadlocks."""
    peak_memory_bytes: FloatArray
    """(N, S) peak memory per stage."""
    busy_ms: FloatArray
    """(N, S) sum of op durations per stage."""
    stage_end_ms: FloatArray
    """(N, S) end of each stage's last op (of those that ran)."""


def pack_plans(plans: Sequence[Plan]) -> PackedPlans:
    """Pack plans that share S and B (the search builds :class:`PackedPlans` directly)."""
    if not plans:
        raise ValueError("pack_plans needs at least one plan")
    S, B = plans[0].num_stages, plans[0].global_batch
    if any(p.num_stages != S or p.global_batch != B for p in plans):
        raise ValueError("all packed plans must have the same stage count and global batch")
    cuts = np.array([[st.lo for st in p.stages] + [p.stages[-1].hi] for p in plans], dtype=np.int64)
    fwd_lists = [st.forward for p in plans for st in p.stages]
    bwd_lists = [st.backward for p in plans for st in p.stages]
    fwd_ptr = np.concatenate([[0], np.cumsum([len(f) for f in fwd_lists])]).astype(np.int64)
    bwd_ptr = np.concatenate([[0], np.cumsum([len(b) for b in bwd_lists])]).astype(np.int64)
    return PackedPlans(
        batch=B,
        cuts=cuts,
        fwd=np.fromiter(chain.from_iterable(fwd_lists), dtype=np.int64, count=int(fwd_ptr[-1])),
        fwd_ptr=fwd_ptr,
        bwd=np.fromiter(chain.from_iterable(bwd_lists), dtype=np.int64, count=int(bwd_ptr[-1])),
        bwd_ptr=bwd_ptr,
        warmup=np.array([[st.warmup for st in p.stages] for p in plans], dtype=np.int64),
        recompute=np.array([[st.recompute for st in p.stages] for p in plans], dtype=np.bool_),
    )


def evaluate(packed: PackedPlans, cost: CostModel) -> BatchResult:
    """Score every candidate; agrees with :func:`umsearch.sim.reference.simulate` to 1e-9 relative.

    Assumes valid candidates (see :func:`umsearch.core.plan.validate_plan`).
    """
    cost.ensure(packed.batch)
    n, S = packed.size, packed.stages
    it = np.empty(n, dtype=np.float64)
    dead = np.zeros(n, dtype=np.bool_)
    mem = np.empty((n, S), dtype=np.float64)
    busy = np.empty((n, S), dtype=np.float64)
    ends = np.empty((n, S), dtype=np.float64)
    _evaluate_all(
        packed.cuts, packed.fwd, packed.fwd_ptr, packed.bwd, packed.bwd_ptr,
        packed.warmup, packed.recompute.astype(np.bool_),
        cost.fwd_prefix, cost.bwd_prefix, cost.out_bytes, cost.stash_prefix, cost.param_prefix,
        cost.input_bytes, cost.latency_ms, cost.ms_per_byte, cost.state_factor,
        it, dead, mem, busy, ends,
    )  # fmt: skip
    return BatchResult(iteration_ms=it, deadlock=dead, peak_memory_bytes=mem, busy_ms=busy, stage_end_ms=ends)


@njit(cache=True)
def _evaluate_all(  # type: ignore[no-untyped-def]
    cuts, fwd, fwd_ptr, bwd, bwd_ptr, warmup, recompute,
    fwd_prefix, bwd_prefix, out_bytes, stash_prefix, param_prefix,
    input_bytes, latency, ms_per_byte, state_factor,
    it, dead, mem, busy, ends,
):  # fmt: skip
    n, S1 = cuts.shape
    S = S1 - 1
    max_f = 0
    max_b = 0
    for cs in range(n * S):
        max_f = max(max_f, fwd_ptr[cs + 1] - fwd_ptr[cs])
        max_b = max(max_b, bwd_ptr[cs + 1] - bwd_ptr[cs])
    # Scratch reused across candidates: per stage, its ops, durations, deps and message arrivals.
    n_ops = max_f + max_b
    kind = np.empty((S, n_ops), dtype=np.int8)
    idx = np.empty((S, n_ops), dtype=np.int64)
    fdur = np.empty((S, max_f))
    bdur = np.empty((S, max_b))
    fdep = np.empty((S, max_f), dtype=np.int64)
    bdep = np.empty((S, max_b), dtype=np.int64)
    farr = np.empty((S, max_f))
    barr = np.empty((S, max_b))
    nf = np.empty(S, dtype=np.int64)
    nb = np.empty(S, dtype=np.int64)
    pos = np.empty(S, dtype=np.int64)
    fdone = np.empty(S, dtype=np.int64)
    bdone = np.empty(S, dtype=np.int64)
    t = np.empty(S)
    for c in range(n):
        for s in range(S):
            _build_stage(c, s, S, cuts, fwd, fwd_ptr, bwd, bwd_ptr, warmup, recompute,
                         fwd_prefix, bwd_prefix, stash_prefix, param_prefix, out_bytes,
                         input_bytes, state_factor, kind, idx, fdur, bdur, nf, nb, mem)  # fmt: skip
        for s in range(S):
            _link_deps(c, s, S, fwd, fwd_ptr, bwd, bwd_ptr, fdep, bdep)
        dead[c] = _run(c, S, cuts, fwd, fwd_ptr, bwd, bwd_ptr, out_bytes, latency, ms_per_byte,
                       kind, idx, fdur, bdur, fdep, bdep, farr, barr, nf, nb, pos, fdone,
                       bdone, t, busy)  # fmt: skip
        last = 0.0
        for s in range(S):
            ends[c, s] = t[s]
            last = max(last, t[s])
        it[c] = np.inf if dead[c] else last


@njit(cache=True)
def _build_stage(  # type: ignore[no-untyped-def]
    c, s, S, cuts, fwd, fwd_ptr, bwd, bwd_ptr, warmup, recompute,
    fwd_prefix, bwd_prefix, stash_prefix, param_prefix, out_bytes,
    input_bytes, state_factor, kind, idx, fdur, bdur, nf, nb, mem,
):  # fmt: skip
    """Op order (MODEL.md 3), op durations and peak memory (MODEL.md 5) of one stage."""
    lo, hi = cuts[c, s], cuts[c, s + 1]
    f0, f1 = fwd_ptr[c * S + s], fwd_ptr[c * S + s + 1]
    b0, b1 = bwd_ptr[c * S + s], bwd_ptr[c * S + s + 1]
    nf[s], nb[s] = f1 - f0, b1 - b0
    rec = recompute[c, s]
    for j in range(f1 - f0):
        size = fwd[f0 + j]
        fdur[s, j] = fwd_prefix[size, hi] - fwd_prefix[size, lo]
    max_b = 0
    for k in range(b1 - b0):
        size = bwd[b0 + k]
        max_b = max(max_b, size)
        g = bwd_prefix[size, hi] - bwd_prefix[size, lo]
        if rec:
            g += fwd_prefix[size, hi] - fwd_prefix[size, lo]
        bdur[s, k] = g
    # Op order and the largest in-flight sample count after any forward.
    w = warmup[c, s]
    n_op = 0
    done = 0
    cf = 0
    cb = 0
    inflight = 0
    for k in range(b1 - b0):
        target_b = cb + bwd[b0 + k]
        need = done
        acc = cf
        while acc < target_b:
            acc += fwd[f0 + need]
            need += 1
        count = max(need, min(k + w, f1 - f0))
        while done < count:
            cf += fwd[f0 + done]
            kind[s, n_op] = 0
            idx[s, n_op] = done
            n_op += 1
            done += 1
            inflight = max(inflight, cf - cb)
        kind[s, n_op] = 1
        idx[s, n_op] = k
        n_op += 1
        cb = target_b
    while done < f1 - f0:  # unreachable for valid plans: the last backward needs every forward
        cf += fwd[f0 + done]
        kind[s, n_op] = 0
        idx[s, n_op] = done
        n_op += 1
        done += 1
        inflight = max(inflight, cf - cb)
    stash = stash_prefix[hi] - stash_prefix[lo]
    base = state_factor * (param_prefix[hi] - param_prefix[lo])
    if rec:
        in_b = input_bytes if lo == 0 else out_bytes[lo - 1]
        mem[c, s] = base + in_b * inflight + stash * max_b
    else:
        mem[c, s] = base + stash * inflight


@njit(cache=True)
def _link_deps(c, s, S, fwd, fwd_ptr, bwd, bwd_ptr, fdep, bdep):  # type: ignore[no-untyped-def]
    """Last message each op waits for: fdep from stage s-1's forwards, bdep from s+1's backwards."""
    f0, f1 = fwd_ptr[c * S + s], fwd_ptr[c * S + s + 1]
    b0, b1 = bwd_ptr[c * S + s], bwd_ptr[c * S + s + 1]
    if s > 0:
        p0, p1 = fwd_ptr[c * S + s - 1], fwd_ptr[c * S + s]
        m = -1
        sent = 0
        mine = 0
        for j in range(f1 - f0):
            mine += fwd[f0 + j]
            while sent < mine and m + 1 < p1 - p0:
                m += 1
                sent += fwd[p0 + m]
            fdep[s, j] = m
    if s < S - 1:
        q0, q1 = bwd_ptr[c * S + s + 1], bwd_ptr[c * S + s + 2]
        m = -1
        sent = 0
        mine = 0
        for k in range(b1 - b0):
            mine += bwd[b0 + k]
            while sent < mine and m + 1 < q1 - q0:
                m += 1
                sent += bwd[q0 + m]
            bdep[s, k] = m


@njit(cache=True)
def _run(  # type: ignore[no-untyped-def]
    c, S, cuts, fwd, fwd_ptr, bwd, bwd_ptr, out_bytes, latency, ms_per_byte,
    kind, idx, fdur, bdur, fdep, bdep, farr, barr, nf, nb, pos, fdone, bdone, t, busy,
):  # fmt: skip
    """Advance all stages to completion or deadlock; returns True on deadlock."""
    for s in range(S):
        pos[s] = 0
        fdone[s] = 0
        bdone[s] = 0
        t[s] = 0.0
        busy[c, s] = 0.0
    remaining = 0
    for s in range(S):
        remaining += nf[s] + nb[s]
    progress = True
    while remaining > 0 and progress:
        progress = False
        for s in range(S):
            while pos[s] < nf[s] + nb[s]:
                j = idx[s, pos[s]]
                start = t[s]
                if kind[s, pos[s]] == 0:
                    if s > 0:
                        m = fdep[s, j]
                        if fdone[s - 1] <= m:
                            break
                        start = max(start, farr[s - 1, m])
                    end = start + fdur[s, j]
                    if s < S - 1:
                        size = fwd[fwd_ptr[c * S + s] + j]
                        ready = end if j == 0 else max(end, farr[s, j - 1])
                        farr[s, j] = ready + (latency + size * out_bytes[cuts[c, s + 1] - 1] * ms_per_byte)
                    fdone[s] += 1
                    busy[c, s] += end - start
                else:
                    if s < S - 1:
                        m = bdep[s, j]
                        if bdone[s + 1] <= m:
                            break
                        start = max(start, barr[s + 1, m])
                    end = start + bdur[s, j]
                    if s > 0:
                        size = bwd[bwd_ptr[c * S + s] + j]
                        ready = end if j == 0 else max(end, barr[s, j - 1])
                        barr[s, j] = ready + (latency + size * out_bytes[cuts[c, s] - 1] * ms_per_byte)
                    bdone[s] += 1
                    busy[c, s] += end - start
                t[s] = end
                pos[s] += 1
                remaining -= 1
                progress = True
    return remaining > 0
