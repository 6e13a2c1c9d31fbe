"""Action rows: what the rules of :mod:`umsearch.core.actions` say of each kind of action on each stage of a
candidate, tabled once per candidate so that the per-action loops of the batch evaluator
(:mod:`umsearch.sim.population`) and the order generator (:mod:`umsearch.search.orders`) run without a
branch on an action's kind.

Row ``4 * stage + kind`` of two tables (filled by :func:`prepare`): integer columns index the candidate's
slots (one per microbatch of every stage's lists) and its flattened layer times; float columns are 0/1
factors, bytes per sample and the stage's time scale. The column names below are the tables' schema.
"""

from __future__ import annotations

import numpy as np

from umsearch.core.actions import B, F
from umsearch.sim.jit import njit
from umsearch.sim.kernels import (
    consumer_stage,
    ends_backward,
    memory_delta,
    on_forward_list,
    received_boundary,
    reruns_forward,
    sent_boundary,
    source_stage,
)

# A candidate's per-(stage, kind) tables, row ``4 * stage + kind`` (filled by :func:`prepare`): what the
# action rules of :mod:`umsearch.core.actions` say of that kind on that stage, as indices and factors
# the per-action loop uses without a branch. Integer columns:
SLOT = 0  # first slot of the stage's list the kind indexes
READ_AT, READ_STEP = 1, 2  # microbatch k reads the producers of slot READ_AT + k * READ_STEP (the idle slot: none)
SEND_AT, SEND_STEP = 3, 4  # and delivers to slot SEND_AT + k * SEND_STEP (the spare slot: nothing to deliver)
END_AT, TOOK_AT = 5, 6  # where it writes its end and duration (the stage's last B/W; the spare slot: nowhere)
DST = 7  # the rank its message goes to (its own: no message, a link that costs nothing)
T_HI, T_LO, F_HI, F_LO = 8, 9, 10, 11  # its own and the forward's layer times in the flattened times
INT_COLS = 12
# Float columns: 0/1 factors (exact: every term they scale is finite), bytes per sample, scale.
CROSS, SENDS, RERUN, SEND_BYTES, RECV_BYTES, SCALE = 0, 1, 2, 3, 4, 5
# docs/model.md 5: per sample, each of the stage's four terms as the kind adds it before the peak (ADD..ADD+3)
# and releases it after (REL..REL+3), and the stash's fixed part likewise (ADD_FIXED, REL_FIXED).
ADD, REL, ADD_FIXED, REL_FIXED = 6, 10, 14, 15
FLOAT_COLS = 16
_u = np.uint64  # an index known not to be negative: no wraparound code


MERGE_RATIO = 8
"""A sender and receiver list pair whose samples number more than this many times their slots is matched by
one linear merge (:func:`_merge`), else through a per-sample map of the sender (:func:`_owner_map`): the map
costs about a cycle per sample, the merge a mispredicted branch every other slot (measured on random
partitions of 256 samples into 8-64 microbatches)."""


@njit(cache=True)
def _producers(sizes, offset, sb, se, rb, re, owner, mapped, mapped_end, first, last, samples):  # type: ignore[no-untyped-def]
    """For each receiver slot q of ``rb..re-1``, the first and last sender slot of ``sb..se-1`` holding
    its samples (as :func:`umsearch.core.samples.spans`) and their samples in all. ``sizes`` and
    ``offset`` (its first sample in its list) per slot; ``owner`` is scratch for one list's samples, holding
    the map of slots ``mapped..mapped_end-1`` (-1: none), which is used again where the sender list is the
    same. Returns the slots whose map ``owner`` holds now."""
    if _merges(sizes, offset, sb, se, rb, re):
        _merge(sizes, sb, se, rb, re, first, last)
    else:
        if mapped < 0 or not same_list(sizes, mapped, mapped_end, sb, se):
            _owner_map(sizes, offset, sb, se, owner)
            mapped, mapped_end = sb, se
        _from_map(sizes, offset, rb, re, owner, sb - mapped, first, last)
    _samples(sizes, offset, rb, re, first, last, samples)
    return mapped, mapped_end


@njit(cache=True)
def _merges(sizes, offset, sb, se, rb, re):  # type: ignore[no-untyped-def]
    """Whether :func:`_producers` matches these lists by a merge (few microbatches for their samples)."""
    return offset[_u(se - 1)] + sizes[_u(se - 1)] > MERGE_RATIO * (se - sb + re - rb)


@njit(cache=True)
def _owner_map(sizes, offset, sb, se, owner):  # type: ignore[no-untyped-def]
    """``owner[x]``: the sender slot (of ``sb..se-1``) holding sample ``x`` of the list. Without a branch
    per slot: each sample's slot is a running count of the slots that ended before it."""
    total = offset[_u(se - 1)] + sizes[_u(se - 1)]
    for x in range(total):
        owner[_u(x)] = 0
    for m in range(sb + 1, se):
        owner[_u(offset[_u(m)])] += 1
    at = sb
    for x in range(total):
        at += owner[_u(x)]
        owner[_u(x)] = at


@njit(cache=True)
def _from_map(sizes, offset, rb, re, owner, shift, first, last):  # type: ignore[no-untyped-def]
    """Each receiver slot's first and last sender slot, read off :func:`_owner_map`'s map (plus ``shift``:
    the map of an equal list at other slots)."""
    for q in range(rb, re):
        first[_u(q)] = owner[_u(offset[_u(q)])] + shift
        last[_u(q)] = owner[_u(offset[_u(q)] + sizes[_u(q)] - 1)] + shift


@njit(cache=True)
def _samples(sizes, offset, rb, re, first, last, samples):  # type: ignore[no-untyped-def]
    """Each receiver slot's producers' samples in all."""
    for q in range(rb, re):
        samples[_u(q)] = offset[_u(last[_u(q)])] + sizes[_u(last[_u(q)])] - offset[_u(first[_u(q)])]


@njit(cache=True)
def same_list(sizes, ab, ae, bb, be):  # type: ignore[no-untyped-def]
    """Whether slots ``ab..ae-1`` and ``bb..be-1`` hold the same sizes in the same order."""
    if ae - ab != be - bb:
        return False
    for k in range(ae - ab):
        if sizes[_u(ab + k)] != sizes[_u(bb + k)]:
            return False
    return True


@njit(cache=True)
def _merge(sizes, sb, se, rb, re, first, last):  # type: ignore[no-untyped-def]
    """:func:`_producers`' first and last sender slots by one linear merge (:func:`umsearch.core.samples.spans`)."""
    m = sb
    end = sizes[_u(m)]
    start = 0
    for q in range(rb, re):
        stop = start + sizes[_u(q)]
        first[_u(q)] = m
        while end < stop:
            m += 1
            end += sizes[_u(m)]
        last[_u(q)] = m
        start = stop
        if end == stop and m + 1 < se:
            m += 1
            end += sizes[_u(m)]


@njit(cache=True)
def prepare(  # type: ignore[no-untyped-def]
    s0, S, lo, hi, rank, recompute, scale, fwd, fwd_ptr, bwd, bwd_ptr, sizes, layers, out_bytes, stage_mem,
    slot_size, offset, owner, first, last, samples, row_int, row_float,
):  # fmt: skip
    """Fill the per-slot arrays and per-(stage, kind) rows of the candidate of stages ``s0..s0+S-1``.

    Slots: forward k of stage g is slot ``fwd_ptr[g] - fwd_ptr[s0] + k``, backward k slot ``n_f +
    bwd_ptr[g] - bwd_ptr[s0] + k``; then per stage its last B/W end (``n_slots + j``) and that action's
    duration (``n_slots + S + j``); then the spare slot (written, never read) and the idle slot (its
    own producer, delivered at 0). Per slot: its size, the first and last producer slot it reads (the
    source stage's list, :func:`umsearch.core.actions.source_stage`) and their samples. ``times`` is
    flattened: ``sizes`` by ``layers`` per kind."""
    f_base, b_base = fwd_ptr[s0], bwd_ptr[s0]
    n_f = fwd_ptr[s0 + S] - f_base
    n_slots = n_f + bwd_ptr[s0 + S] - b_base
    spare, idle = n_slots + 2 * S, n_slots + 2 * S + 1
    for q in range(n_f):
        slot_size[_u(q)] = fwd[_u(f_base + q)]
    for q in range(n_f, n_slots):
        slot_size[_u(q)] = bwd[_u(b_base + q - n_f)]
    for g in range(s0, s0 + S):  # each slot's first sample in its list
        for listed in (F, B):
            n = 0
            for q in range(_list_slot(listed, g, fwd_ptr, bwd_ptr, f_base, b_base, n_f),
                           _list_slot(listed, g + 1, fwd_ptr, bwd_ptr, f_base, b_base, n_f)):
                offset[_u(q)] = n
                n += slot_size[_u(q)]
    first[idle] = last[idle] = idle
    samples[idle] = 0
    for p in range(S):  # each list as a sender; a stage's backward list equal to its forward one reuses its map
        mapped = mapped_end = -1  # the slots of the list whose map ``owner`` holds (-1: none)
        for listed in (F, B):
            j = consumer_stage(listed, p, S)
            if j < 0:
                continue
            sb = _list_slot(listed, s0 + p, fwd_ptr, bwd_ptr, f_base, b_base, n_f)
            se = _list_slot(listed, s0 + p + 1, fwd_ptr, bwd_ptr, f_base, b_base, n_f)
            rb = _list_slot(listed, s0 + j, fwd_ptr, bwd_ptr, f_base, b_base, n_f)
            re = _list_slot(listed, s0 + j + 1, fwd_ptr, bwd_ptr, f_base, b_base, n_f)
            mapped, mapped_end = _producers(slot_size, offset, sb, se, rb, re, owner, mapped, mapped_end, first, last,
                                            samples)  # fmt: skip
    for j in range(S):
        g = s0 + j
        for kind in range(4):
            row = 4 * j + kind
            p = source_stage(kind, j, S)
            to = consumer_stage(kind, j, S)
            dst = rank[s0 + to] if to >= 0 else rank[g]
            ends = ends_backward(kind)
            base = _list_slot(kind, g, fwd_ptr, bwd_ptr, f_base, b_base, n_f)
            row_int[row, SLOT] = base
            row_int[row, READ_AT], row_int[row, READ_STEP] = (base, 1) if p >= 0 else (idle, 0)
            row_int[row, SEND_AT], row_int[row, SEND_STEP] = (base, 1) if to >= 0 else (spare, 0)
            row_int[row, END_AT] = n_slots + j if ends else spare
            row_int[row, TOOK_AT] = n_slots + S + j if ends else spare
            row_int[row, DST] = dst
            row_int[row, T_HI] = kind * sizes * layers + hi[g]
            row_int[row, T_LO] = kind * sizes * layers + lo[g]
            row_int[row, F_HI] = F * sizes * layers + hi[g]
            row_int[row, F_LO] = F * sizes * layers + lo[g]
            row_float[row, CROSS] = p >= 0 and rank[s0 + p] != rank[g]
            row_float[row, SENDS] = dst != rank[g]
            row_float[row, RERUN] = reruns_forward(kind, recompute[g])
            row_float[row, SEND_BYTES] = out_bytes[sent_boundary(kind, lo[g], hi[g])]
            row_float[row, RECV_BYTES] = out_bytes[received_boundary(kind, lo[g], hi[g])]
            row_float[row, SCALE] = scale[g]
            _memory_row(kind, recompute[g], stage_mem[g, 0], stage_mem[g, 1], stage_mem[g, 2], stage_mem[g, 3],
                        stage_mem[g, 4], row_float[row])


@njit(cache=True)
def _memory_row(kind, rec, stash, inp, kept, freed, fixed, out):  # type: ignore[no-untyped-def]
    """Into ``out`` (a row of :func:`prepare`'s float table): per sample, each docs/model.md 5 term of
    its stage (:func:`stage_memory`: ``stash``, ``inp``, ``kept``, ``freed``, per sample; ``fixed`` per
    microbatch) as an action of kind code ``kind`` adds it and releases it (the rule on one term at a
    time). Its coefficients are 0 or +-1, so the per-action sum of these times the size is, bit for bit,
    the rule on the terms times the size (the stash's fixed part added to its term)."""
    out[ADD], out[REL] = memory_delta(kind, rec, stash, 0.0, 0.0, 0.0)
    out[ADD + 1], out[REL + 1] = memory_delta(kind, rec, 0.0, inp, 0.0, 0.0)
    out[ADD + 2], out[REL + 2] = memory_delta(kind, rec, 0.0, 0.0, kept, 0.0)
    out[ADD + 3], out[REL + 3] = memory_delta(kind, rec, 0.0, 0.0, 0.0, freed)
    out[ADD_FIXED], out[REL_FIXED] = memory_delta(kind, rec, fixed, 0.0, 0.0, 0.0)


@njit(cache=True)
def _list_slot(kind, g, fwd_ptr, bwd_ptr, f_base, b_base, n_f):  # type: ignore[no-untyped-def]
    """The first slot of stage ``g``'s list that kind code ``kind`` indexes (``g`` one past the last stage: the end)."""
    return fwd_ptr[g] - f_base if on_forward_list(kind) else n_f + bwd_ptr[g] - b_base
