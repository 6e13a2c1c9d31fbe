"""Compiled building blocks of docs/model.md sections 4 and 5, shared by every numba loop.

(Each takes at most one array: numba passes an array as a struct of seven
fields, and calls taking several cost more than the work they do.)

The batch evaluator (:mod:`umsearch.sim.population`) and the search's order
generator (:mod:`umsearch.search.orders`) both time actions, ship messages and
track memory; they do it through these functions, so the rules exist once in
compiled form (the reference simulator is their plain-Python twin, and tests
hold them equal). One exception, for speed: the evaluator's per-action loop
(``batch._one``) spells out :func:`finish`, :func:`needed_ms` and :func:`ready_at`
inline, and reads memory from each stage's terms (``batch.stage_memory``, the
whole of docs/model.md 5, as the order generator does through :func:`memory_delta`;
:func:`memory_step`, version 2.2's rule, is left for ``benchmarks/evaluator.py``'s old loop), so a change to one of them goes there too
(``tests/sim`` holds the evaluator to the reference simulator). Kinds are 0 ``F``, 1 ``B``, 2 ``I``, 3 ``W``; what each kind
feeds and needs, the boundary its message crosses, whether it reruns the forward,
what it does to memory and how an action is coded are compiled from
:mod:`umsearch.core.actions` itself (its tables and functions), never restated here.
"""

from __future__ import annotations

from umsearch.core import actions, cost
from umsearch.core.actions import B, F
from umsearch.sim.jit import njit

action_code = njit(cache=True)(actions.action_code)
code_kind = njit(cache=True)(actions.code_kind)
code_stage = njit(cache=True)(actions.code_stage)
code_mb = njit(cache=True)(actions.code_mb)
memory_delta = njit(cache=True)(actions.memory_effect)
hands_on = njit(cache=True)(actions.hands_on)
on_forward_list = njit(cache=True)(actions.on_forward_list)
ends_backward = njit(cache=True)(actions.ends_backward)
consumer_stage = njit(cache=True)(actions.consumer_stage)
source_stage = njit(cache=True)(actions.source_stage)
sent_boundary = njit(cache=True)(actions.sent_boundary)
received_boundary = njit(cache=True)(actions.received_boundary)
reruns_forward = njit(cache=True)(actions.reruns_forward)
device_state_factor = njit(cache=True)(cost.device_state_factor)


@njit(cache=True)
def compute_ms(kind, size, lo, hi, rec, scale, times):  # type: ignore[no-untyped-def]
    """An action's own compute time: its layers at its size (``times`` is
    :attr:`umsearch.core.cost.CostTables.times`), plus the forward again when a recomputing stage
    runs B or I, all times the stage's ``scale`` (:func:`umsearch.core.cost.stage_scales`)."""
    t = times[kind, size, hi] - times[kind, size, lo]
    if reruns_forward(kind, rec):
        t += times[F, size, hi] - times[F, size, lo]
    return t * scale


@njit(cache=True)
def message_ms(count, samples, sample_bytes, msg_oh, msg_per_byte):  # type: ignore[no-untyped-def]
    """What ``count`` cross-rank messages carrying ``samples`` samples of ``sample_bytes`` each in all
    cost a compute timeline (docs/model.md 4 and 2.1: a fixed part per message plus one per byte)."""
    return count * msg_oh + msg_per_byte * samples * sample_bytes


@njit(cache=True)
def needed_ms(sizes, base, first, last, sample_bytes, msg_oh, msg_per_byte):  # type: ignore[no-untyped-def]
    """The message charge of an action that needs producers ``first..last`` on another rank (their
    sizes ``sizes[base + m]``): one message each, by its full size."""
    samples = 0
    for m in range(first, last + 1):
        samples += sizes[base + m]
    return message_ms(last - first + 1, samples, sample_bytes, msg_oh, msg_per_byte)


@njit(cache=True)
def transfer_ms(size, edge, out_bytes, latency, ms_per_byte):  # type: ignore[no-untyped-def]
    """One message of ``size`` samples across the boundary after layer ``edge``."""
    return latency + size * out_bytes[edge] * ms_per_byte


@njit(cache=True)
def spans(sender, s0, s1, receiver, r0, r1, first, last):  # type: ignore[no-untyped-def]
    """For each receiver microbatch, the first and last sender microbatch holding its samples (one
    linear merge, as :func:`umsearch.core.samples.spans`)."""
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
def link_producers(fwd, fwd_ptr, bwd, bwd_ptr, s0, s1, dep_lo, dep_hi):  # type: ignore[no-untyped-def]
    """For the candidate of stages ``s0..s1-1``, fill ``dep_lo``/``dep_hi`` of every slot (forward k
    of stage g is slot ``fwd_ptr[g] - fwd_ptr[s0] + k``, backward k slot ``n_f + bwd_ptr[g] -
    bwd_ptr[s0] + k``, ``n_f`` its forward count) with the producer microbatches it reads: a forward
    its source stage's forwards, a backward (``B`` or ``I``, which read alike) its source stage's
    backwards (:func:`umsearch.core.actions.source_stage`, docs/model.md 4)."""
    f_base, b_base = fwd_ptr[s0], bwd_ptr[s0]
    n_f = fwd_ptr[s1] - f_base
    S = s1 - s0
    for j in range(S):
        g = s0 + j
        p = source_stage(F, j, S)
        if p >= 0:
            o = fwd_ptr[g] - f_base
            p += s0
            spans(fwd, fwd_ptr[p], fwd_ptr[p + 1], fwd, fwd_ptr[g], fwd_ptr[g + 1], dep_lo[o:], dep_hi[o:])
        p = source_stage(B, j, S)
        if p >= 0:
            o = n_f + bwd_ptr[g] - b_base
            p += s0
            spans(bwd, bwd_ptr[p], bwd_ptr[p + 1], bwd, bwd_ptr[g], bwd_ptr[g + 1], dep_lo[o:], dep_hi[o:])


@njit(cache=True)
def first_missing(deliveries, base, first, last):  # type: ignore[no-untyped-def]
    """The slot of the first producer of ``first..last`` (offset ``base``) not yet delivered, or -1."""
    for m in range(first, last + 1):
        if deliveries[base + m] < 0.0:
            return base + m
    return -1


@njit(cache=True)
def ready_at(deliveries, base, first, last):  # type: ignore[no-untyped-def]
    """The latest delivery time of producers ``first..last`` (offset ``base``), or -1 while any is
    still undelivered."""
    t = 0.0
    for m in range(first, last + 1):
        d = deliveries[base + m]
        if d < 0.0:
            return -1.0
        t = max(t, d)
    return t


@njit(cache=True)
def finish(kind, j, g, S, r, start, size, l_lo, l_hi, rec, scale, need_ms, rank, link, times, out_bytes,  # type: ignore[no-untyped-def]
           op_oh, msg_oh, msg_per_byte):  # fmt: skip
    """docs/model.md section 4 for one action of stage ``j`` (global index ``g``, layer-time factor
    ``scale``) on rank ``r`` starting at ``start``, charged ``need_ms`` for the messages it received
    (:func:`needed_ms`): ``(end, to, arrival)``, ``to`` the stage its output goes to (-1: none) and
    ``arrival`` when it is there. ``link[r, q]`` is ``(arrival of its last message, latency ms, ms per
    byte)`` of the directed link from rank r to q (its own per pair on a cluster, docs/model.md 9); a
    cross-rank message takes it after its previous message (the arrival is updated here)."""
    dur = compute_ms(kind, size, l_lo, l_hi, rec, scale, times)
    to = consumer_stage(kind, j, S)
    if to >= 0:
        to += g - j
    sends = to >= 0 and rank[to] != rank[g]
    edge = sent_boundary(kind, l_lo, l_hi)
    sent_ms = message_ms(1, size, out_bytes[edge], msg_oh, msg_per_byte) if sends else 0.0
    end = start + dur + op_oh + need_ms + sent_ms
    arrival = end
    if sends:
        dst = rank[to]
        arrival = max(end, link[r, dst, 0]) + transfer_ms(size, edge, out_bytes, link[r, dst, 1], link[r, dst, 2])
        link[r, dst, 0] = arrival
    return end, to, arrival


@njit(cache=True)
def memory_step(kind, rec, size, l_lo, l_hi, input_bytes, out_bytes, stash_prefix):  # type: ignore[no-untyped-def]
    """docs/model.md section 5: what one action of ``size`` samples on layers ``[l_lo, l_hi)`` adds to its
    rank's activation level before the peak, and releases after it; exact for a profile without version
    2.3's per-layer fields (``stash_prefix`` is :attr:`~umsearch.core.cost.CostTables.stash_prefix`, so a
    stage's first boundary, its kept input, what ``I`` frees and hand-offs are left out: the evaluator reads
    the whole rule from :func:`umsearch.sim.population.stage_memory`)."""
    inp = (input_bytes if l_lo == 0 else out_bytes[l_lo - 1]) * size
    return memory_delta(kind, rec, (stash_prefix[l_hi] - stash_prefix[l_lo]) * size, inp, 0.0, 0.0)
