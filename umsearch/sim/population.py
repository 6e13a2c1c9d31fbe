"""The batch evaluator: score a whole population of plans in one compiled call.

Same model as :mod:`umsearch.sim.reference`, reorganised for speed. An
action's start is ``max(end of its rank's previous action, delivery of the
last input it needs)``, known as soon as its producers have run. So each rank
advances through its list until an action's producer has not run yet; the
rank then waits on that one producer and is resumed when it runs. Messages on
one directed link leave in the sender's order, which is its rank's list
order, so the link's state is its last arrival. When no rank can be resumed
while actions remain, the plan deadlocks. The loop is sequential per
candidate with data-dependent branching, which numpy cannot vectorize, so it
is compiled with numba (nopython, cached on disk). The timing and memory
rules are those of :mod:`umsearch.sim.kernels` (``finish``, ``needed_ms``,
``ready_at``) spelled out inline in the per-action loop, as calls passing
arrays cost their reference counts on every action; the action rules of
:mod:`umsearch.core.actions` are called as compiled, once per candidate for
each stage and kind (:func:`umsearch.sim.action_rows.prepare`), into small tables of slots and 0/1
factors, so the loop takes no branch on an action's kind (a mispredicted
branch costs more than the arithmetic it skips) and indexes arrays with
unsigned integers (numba adds no negative-index fix-up for those). Memory
reads each stage's docs/model.md 5 terms, computed once per call
(:func:`stage_memory`).

Candidates travel as :class:`ArrayPlan`: a few flat numpy arrays per plan,
no Python object per action, so packing a population is a handful of
concatenations. :func:`encode` turns a :class:`~umsearch.core.plan.Plan`
into one and :func:`decode` turns one back. An action is one int64 code
(:func:`umsearch.core.actions.action_code`).

Data-parallel replicas on a cluster (docs/model.md section 9) stay outside the
per-action loop: replicas whose ranks share nodes alike time identically, so
the loop runs once per distinct pattern (a **run**), each with its own
per-rank-pair link table, and a small pass after it cuts every stage into its
gradient buckets, readies each within the stage's last backward and chains
every rank's bucket all-reduces (the rules of :mod:`umsearch.core.cluster`,
compiled).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Protocol

import numpy as np
import numpy.typing as npt
from numba import get_num_threads, prange

from umsearch.core import cluster as cl
from umsearch.core.actions import MAX_STAGES, Action
from umsearch.core.cluster import (
    DEFAULT_BUCKET_MIB,
    DEFAULT_LAYOUT,
    Cluster,
    bucket_cap_bytes,
    copies_span_nodes,
    device,
    ms_per_byte,
)
from umsearch.core.cost import CostTables
from umsearch.core.plan import Plan, Stage
from umsearch.errors import PlanError
from umsearch.sim.action_rows import (
    ADD,
    ADD_FIXED,
    CROSS,
    DST,
    END_AT,
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
    TOOK_AT,
    prepare,
    same_list,
)
from umsearch.sim.jit import njit
from umsearch.sim.kernels import (
    code_kind,
    code_mb,
    code_stage,
    device_state_factor,
    ends_backward,
    hands_on,
)

bucket_firsts = njit(cache=True)(cl.bucket_firsts)
bucket_ready_ms = njit(cache=True)(cl.bucket_ready_ms)
chain_allreduces = njit(cache=True)(cl.chain_allreduces)
ring_ms = njit(cache=True)(cl.ring_ms)

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
_u = np.uint64  # an index known not to be negative: no wraparound code

def offsets(lengths: npt.ArrayLike) -> IntArray:
    """CSR offsets of consecutive runs of the given lengths: ``[0, l0, l0 + l1, ...]``."""
    arr = np.asarray(lengths, dtype=np.int64)
    out = np.zeros(arr.shape[0] + 1, dtype=np.int64)
    np.cumsum(arr, out=out[1:])
    return out


@dataclass(frozen=True, eq=False)
class ArrayPlan:
    """One plan as flat arrays: the form the search builds and the evaluator packs."""

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
    fwd: IntArray
    """Every stage's forward sizes, stage after stage."""
    fwd_len: IntArray
    """(S,) forward microbatches per stage."""
    bwd: IntArray
    """Every stage's backward sizes, stage after stage."""
    bwd_len: IntArray
    """(S,) backward microbatches per stage."""
    act: IntArray
    """Every rank's action codes, rank after rank."""
    act_len: IntArray
    """(R,) actions per rank."""
    replicas: int = 1
    """``D``: data-parallel replicas (docs/model.md 9); ``batch`` is still the global batch."""
    cluster: Cluster | None = None
    """Nodes and their links; None: the profile's link everywhere."""
    layout: str = DEFAULT_LAYOUT
    """``dp_inner`` or ``pp_inner``: which device each replica's rank is."""
    zero1: bool = False
    """Whether optimizer states are sharded over the replicas."""
    bucket_mib: float | None = DEFAULT_BUCKET_MIB
    """Gradient bucket cap in MiB (docs/model.md 9); None: one bucket per stage (version 2.2)."""

    @property
    def stages(self) -> int:
        return len(self.rank)


def encode(plan: Plan) -> ArrayPlan:
    """The arrays of a (valid) plan; raises PlanError for more stages than an action code can name."""
    st = plan.stages
    if len(st) > MAX_STAGES:
        raise PlanError(f"the plan has {len(st)} stages; the evaluator codes at most {MAX_STAGES}: use fewer stages")
    codes = [a.code for acts in plan.actions for a in acts]
    return ArrayPlan(
        batch=plan.global_batch, ranks=plan.ranks,
        cuts=np.array([s.lo for s in st] + [st[-1].hi], dtype=np.int64),
        rank=np.array([s.rank for s in st], dtype=np.int64),
        recompute=np.array([s.recompute for s in st], dtype=np.bool_),
        fwd=np.array([v for s in st for v in s.forward], dtype=np.int64),
        fwd_len=np.array([len(s.forward) for s in st], dtype=np.int64),
        bwd=np.array([v for s in st for v in s.backward], dtype=np.int64),
        bwd_len=np.array([len(s.backward) for s in st], dtype=np.int64),
        act=np.array(codes, dtype=np.int64), act_len=np.array([len(a) for a in plan.actions], dtype=np.int64),
        replicas=plan.data_parallel, cluster=plan.cluster, layout=plan.layout, zero1=plan.zero1,
        bucket_mib=plan.bucket_mib,
    )  # fmt: skip


def decode(ap: ArrayPlan) -> Plan:
    """The :class:`~umsearch.core.plan.Plan` of an array plan (not validated here)."""
    fp, bp, ap_ = offsets(ap.fwd_len), offsets(ap.bwd_len), offsets(ap.act_len)
    fwd, bwd, act = ap.fwd.tolist(), ap.bwd.tolist(), ap.act.tolist()
    stages = tuple(
        Stage(layers=(int(ap.cuts[j]), int(ap.cuts[j + 1])), rank=int(ap.rank[j]),
              forward=tuple(fwd[fp[j]:fp[j + 1]]), backward=tuple(bwd[bp[j]:bp[j + 1]]),
              recompute=bool(ap.recompute[j]))
        for j in range(ap.stages)
    )  # fmt: skip
    actions = tuple(
        tuple(Action.from_code(c) for c in act[ap_[r] : ap_[r + 1]])
        for r in range(ap.ranks)
    )
    return Plan(global_batch=ap.batch, ranks=ap.ranks, stages=stages, actions=actions, data_parallel=ap.replicas,
                cluster=ap.cluster, layout=ap.layout, zero1=ap.zero1, bucket_mib=ap.bucket_mib)  # fmt: skip


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
    replicas: IntArray
    """(N,) data-parallel replicas of each candidate."""
    zero1: BoolArray
    """(N,) whether each candidate shards its optimizer states."""
    links: FloatArray
    """(N, 4) each candidate's cluster links: intra latency, intra ms per byte, inter latency, inter
    ms per byte (zeros without a cluster)."""
    run_ptr: IntArray
    """(N+1,) offsets of each candidate's runs: one per distinct link pattern of its replicas."""
    node_ptr: IntArray
    """Offsets of each run's node ids in ``run_node``; an empty range: no cluster (the profile's link)."""
    run_node: IntArray
    """Flat node of each rank of each run's replica."""
    stage_link: IntArray
    """Per stage, the link its all-reduce uses: 0 the profile's, 1 intra, 2 inter."""
    bucket_bytes: FloatArray
    """(N,) each candidate's gradient bucket cap in bytes (``inf``: one bucket per stage)."""

    @property
    def size(self) -> int:
        return int(self.stage_ptr.shape[0]) - 1


@lru_cache(maxsize=256)
def _patterns(ranks: int, replicas: int, cluster: Cluster, layout: str) -> tuple[IntArray, IntArray]:
    """``(nodes, stage_link)`` of a cluster placement: one row of per-rank nodes for each distinct
    pattern of shared nodes among a replica's ranks (in order of first replica), and per rank the
    link its stages' all-reduces use (1 intra, 2 inter)."""
    d, r = np.arange(replicas)[:, None], np.arange(ranks)[None, :]
    nodes = np.asarray(device(d, r, ranks, replicas, layout)) // cluster.gpus_per_node  # type: ignore[arg-type]
    # Nodes grow with the rank, so where they change between neighbouring ranks is the whole pattern.
    _, first = np.unique(np.diff(nodes, axis=1) != 0, axis=0, return_index=True)
    rows = nodes[np.sort(first)].astype(np.int64)
    spans = [copies_span_nodes(cluster, q, ranks, replicas, layout) for q in range(ranks)]
    return rows, np.where(spans, 2, 1).astype(np.int64)


def _replica_arrays(c: ArrayPlan) -> tuple[IntArray, IntArray]:
    """A candidate's runs (rows of per-rank nodes; one empty row without a cluster) and the link class
    of each stage's all-reduce."""
    if c.cluster is None:
        return np.empty((1, 0), dtype=np.int64), np.zeros(c.stages, dtype=np.int64)
    rows, per_rank = _patterns(c.ranks, c.replicas, c.cluster, c.layout)
    return rows, per_rank[c.rank]


def _links(x: Cluster | None) -> list[float]:
    """A cluster's links as :attr:`PackedPlans.links` holds them (zeros without a cluster)."""
    if x is None:
        return [0.0] * 4
    return [x.intra.latency_ms, ms_per_byte(x.intra), x.inter.latency_ms, ms_per_byte(x.inter)]


def _one_run_each(n: int, stages: int) -> dict[str, npt.NDArray[np.generic]]:
    """:class:`PackedPlans`' cluster arrays of ``n`` candidates (``stages`` in all) without a cluster: one run each."""
    return {"links": np.zeros((n, 4)), "run_ptr": np.arange(n + 1, dtype=np.int64),
            "node_ptr": np.zeros(n + 1, dtype=np.int64), "run_node": np.zeros(0, dtype=np.int64),
            "stage_link": np.zeros(stages, dtype=np.int64)}  # fmt: skip


def _replica_fields(candidates: Sequence[ArrayPlan]) -> dict[str, npt.NDArray[np.generic]]:
    """:class:`PackedPlans`' section 9 arrays (quick where no candidate has a cluster: one run each)."""
    n = len(candidates)
    out: dict[str, npt.NDArray[np.generic]] = {
        "replicas": np.array([c.replicas for c in candidates], dtype=np.int64),
        "zero1": np.array([c.zero1 for c in candidates], dtype=np.bool_),
        "bucket_bytes": np.array([bucket_cap_bytes(c.bucket_mib) for c in candidates], dtype=np.float64),
    }
    if all(c.cluster is None for c in candidates):
        return out | _one_run_each(n, sum(c.stages for c in candidates))
    reps = [_replica_arrays(c) for c in candidates]
    runs = [rows for rows, _ in reps]
    return out | {
        "links": np.array([_links(c.cluster) for c in candidates], dtype=np.float64).reshape(n, 4),
        "run_ptr": offsets([rows.shape[0] for rows in runs]),
        "node_ptr": offsets([rows.shape[1] for rows in runs for _ in range(rows.shape[0])]),
        "run_node": np.concatenate([rows.ravel() for rows in runs]),
        "stage_link": np.concatenate([link for _, link in reps]),
    }


def alike_replica_fields(n: int, ranks: int, rank: IntArray, *, replicas: int = 1, cluster: Cluster | None = None,
                         layout: str = DEFAULT_LAYOUT, zero1: bool = False,
                         bucket_mib: float | None = DEFAULT_BUCKET_MIB) -> dict[str, npt.NDArray[np.generic]]:  # fmt: skip
    """:class:`PackedPlans`' section 9 arrays of ``n`` candidates of ``ranks`` ranks that share every section 9
    field (those of :class:`ArrayPlan`, its defaults the same), ``rank`` the rank of every stage of them all:
    what :func:`pack` makes of such candidates, without a pass over them (one search's candidates)."""
    out: dict[str, npt.NDArray[np.generic]] = {
        "replicas": np.full(n, replicas, dtype=np.int64), "zero1": np.full(n, zero1, dtype=np.bool_),
        "bucket_bytes": np.full(n, bucket_cap_bytes(bucket_mib), dtype=np.float64),
    }  # fmt: skip
    if cluster is None:
        return out | _one_run_each(n, rank.shape[0])
    rows, per_rank = _patterns(ranks, replicas, cluster, layout)
    runs, width = rows.shape
    return out | {"links": np.tile(np.array(_links(cluster), dtype=np.float64), (n, 1)),
                  "run_ptr": np.arange(n + 1, dtype=np.int64) * runs,
                  "node_ptr": np.arange(n * runs + 1, dtype=np.int64) * width,
                  "run_node": np.tile(rows.ravel(), n), "stage_link": per_rank[rank]}  # fmt: skip


def pack(candidates: Sequence[ArrayPlan]) -> PackedPlans:
    """Flatten array plans (any mix of rank and stage counts) for :func:`evaluate`."""
    if not candidates:
        raise ValueError("pack needs at least one candidate")
    cat = np.concatenate
    return PackedPlans(
        stage_ptr=offsets([c.stages for c in candidates]),
        lo=cat([c.cuts[:-1] for c in candidates]), hi=cat([c.cuts[1:] for c in candidates]),
        rank=cat([c.rank for c in candidates]), recompute=cat([c.recompute for c in candidates]),
        fwd=cat([c.fwd for c in candidates]), fwd_ptr=offsets(cat([c.fwd_len for c in candidates])),
        bwd=cat([c.bwd for c in candidates]), bwd_ptr=offsets(cat([c.bwd_len for c in candidates])),
        rank_ptr=offsets([c.ranks for c in candidates]),
        act=cat([c.act for c in candidates]), act_ptr=offsets(cat([c.act_len for c in candidates])),
        **_replica_fields(candidates),  # type: ignore[arg-type]
    )  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class BatchResult:
    """Scores of a packed population, entry c for candidate c."""

    iteration_ms: FloatArray
    """(N,) iteration time (the later of the two ends below); ``inf`` where the candidate deadlocks."""
    compute_end_ms: FloatArray
    """(N,) latest end of any action of any replica; ``inf`` on deadlock."""
    allreduce_end_ms: FloatArray
    """(N,) latest end of any all-reduce; 0 with one replica, ``inf`` on deadlock."""
    allreduce_span_ms: FloatArray
    """(stages of all candidates, 3): each stage's all-reduce ready time, start and end (in the packed
    stage order, ``stage_ptr``); NaN with one replica or on deadlock."""
    deadlock: BoolArray
    """(N,) True where the candidate deadlocks."""
    max_memory_bytes: FloatArray
    """(N,) peak memory of the fullest rank (``inf`` on deadlock)."""
    peak_memory_bytes: FloatArray
    """Flat per-rank peak memory; candidate c's ranks are ``rank_ptr[c]..rank_ptr[c+1]``."""
    busy_ms: FloatArray
    """Flat per-rank busy time, likewise."""
    rank_end_ms: FloatArray
    """Flat per-rank end of the last action that ran (the latest over replicas), likewise."""
    rank_ptr: IntArray
    """(N+1,) offsets into the per-rank arrays."""
    stage_ptr: IntArray
    """(N+1,) offsets into the per-stage arrays."""

    def ranks_of(self, c: int, values: FloatArray) -> FloatArray:
        """Candidate ``c``'s slice of a per-rank array."""
        return values[self.rank_ptr[c] : self.rank_ptr[c + 1]]

    def stages_of(self, c: int, values: FloatArray) -> FloatArray:
        """Candidate ``c``'s slice of a per-stage array."""
        return values[self.stage_ptr[c] : self.stage_ptr[c + 1]]


def evaluate(packed: PackedPlans, tables: CostTables) -> BatchResult:
    """Score every candidate; agrees with :func:`umsearch.sim.reference.simulate` to 1e-9 relative.

    Assumes valid candidates that fit the tables (:func:`umsearch.core.plan_rules.validate_plan`,
    :meth:`umsearch.core.cost.CostModel.check`, sizes up to ``tables.b_max``).
    """
    n = packed.size
    n_ranks = int(packed.rank_ptr[-1])
    it, top, comp, ar_end = np.empty(n), np.empty(n), np.empty(n), np.empty(n)
    dead = np.zeros(n, dtype=np.bool_)
    mem, busy, ends = np.zeros(n_ranks), np.zeros(n_ranks), np.zeros(n_ranks)
    spans = np.full((packed.lo.shape[0], 3), np.nan)
    t = tables
    ar_latency, ar_per_byte = allreduce_links(packed, tables)
    times = np.ascontiguousarray(t.times)
    _evaluate_all(
        packed.stage_ptr, packed.lo, packed.hi, packed.rank, packed.recompute, t.stage_scale(packed.lo, packed.hi),
        packed.fwd, packed.fwd_ptr, packed.bwd, packed.bwd_ptr, packed.rank_ptr, packed.act, packed.act_ptr,
        times, times.reshape(-1), t.out_bytes, stage_memory(packed, tables), t.param_prefix,
        t.latency_ms, t.ms_per_byte, t.op_overhead_ms, t.message_overhead_ms, t.message_overhead_ms_per_byte,
        t.state_factor, packed.replicas, packed.zero1, packed.links, packed.run_ptr, packed.node_ptr,
        packed.run_node, ar_latency, ar_per_byte, packed.bucket_bytes,
        it, dead, top, comp, ar_end, spans, mem, busy, ends, min(n, 4 * get_num_threads()),
    )  # fmt: skip
    return BatchResult(iteration_ms=it, compute_end_ms=comp, allreduce_end_ms=ar_end, allreduce_span_ms=spans,
                       deadlock=dead, max_memory_bytes=top, peak_memory_bytes=mem, busy_ms=busy, rank_end_ms=ends,
                       rank_ptr=packed.rank_ptr, stage_ptr=packed.stage_ptr)  # fmt: skip


def allreduce_links(packed: PackedPlans, tables: CostTables) -> tuple[FloatArray, FloatArray]:
    """Per stage (all candidates), the latency and ms per byte of the link its copies all-reduce over
    (docs/model.md 9): the profile's without a cluster, else intra or inter."""
    counts = np.diff(packed.stage_ptr)
    links = np.repeat(packed.links, counts, axis=0)
    cls = packed.stage_link
    lat = np.where(cls == 0, tables.latency_ms, np.where(cls == 1, links[:, 0], links[:, 2]))
    per_byte = np.where(cls == 0, tables.ms_per_byte, np.where(cls == 1, links[:, 1], links[:, 3]))
    return lat, per_byte


class StagesOfCandidates(Protocol):
    """What :func:`stage_memory` reads of a population: packed plans, or the order generator's genomes."""

    @property
    def stage_ptr(self) -> IntArray: ...
    @property
    def rank(self) -> IntArray: ...
    @property
    def recompute(self) -> BoolArray: ...
    @property
    def fwd(self) -> IntArray: ...
    @property
    def fwd_ptr(self) -> IntArray: ...
    @property
    def lo(self) -> IntArray: ...
    @property
    def hi(self) -> IntArray: ...


def stage_memory(packed: StagesOfCandidates, tables: CostTables) -> FloatArray:
    """(stages, 6) every stage's docs/model.md 5 terms: the four per sample (:func:`umsearch.core.cost.stage_memory`),
    with its hand-offs on the same rank (:func:`umsearch.sim.reference.hand_offs`, here by candidate), then
    the stash it saves per microbatch whatever its size (:func:`umsearch.core.cost.stash_fixed`) and its
    parameter bytes as its rank holds them (:func:`umsearch.core.cost.stage_params`, tied weights once).
    They depend on ranks, recompute flags and forward lists alone, never on the order of the actions."""
    hand_out = _hand_offs(packed.stage_ptr, packed.rank, packed.recompute, packed.fwd, packed.fwd_ptr)
    hand_in = np.concatenate([[False], hand_out[:-1]])  # a candidate's last stage hands nothing on
    group = np.repeat(np.arange(packed.stage_ptr.shape[0] - 1), np.diff(packed.stage_ptr))
    return np.column_stack([tables.stage_memory(packed.lo, packed.hi, packed.recompute, hand_in, hand_out),
                            tables.stash_fixed(packed.lo, packed.hi),
                            tables.stage_params(packed.lo, packed.hi, packed.rank, group)])  # fmt: skip


@njit(cache=True)
def _hand_offs(stage_ptr, rank, recompute, fwd, fwd_ptr):  # type: ignore[no-untyped-def]
    """Per stage (all candidates), :func:`~umsearch.core.actions.hands_on` to the next stage of its candidate."""
    out = np.zeros(rank.shape[0], np.bool_)
    for c in range(stage_ptr.shape[0] - 1):
        for g in range(stage_ptr[c], stage_ptr[c + 1] - 1):
            same = same_list(fwd, fwd_ptr[g], fwd_ptr[g + 1], fwd_ptr[g + 1], fwd_ptr[g + 2])
            out[g] = hands_on(rank[g] == rank[g + 1], recompute[g], recompute[g + 1], same)
    return out


@njit(cache=True)
def scratch_sizes(stage_ptr, rank_ptr, lo, hi, fwd, fwd_ptr, bwd, bwd_ptr):  # type: ignore[no-untyped-def]
    """The scratch every candidate's loop needs, the largest candidate's: slots, ranks, stages and layers of
    a candidate, and the most samples of one list (a valid plan's lists all hold its batch); each at least 1."""
    max_s = max_r = max_g = max_l = max_b = 1
    for g in range(fwd_ptr.shape[0] - 1):
        f_batch = b_batch = 0
        for q in range(fwd_ptr[g], fwd_ptr[g + 1]):
            f_batch += fwd[q]
        for q in range(bwd_ptr[g], bwd_ptr[g + 1]):
            b_batch += bwd[q]
        max_b = max(max_b, f_batch, b_batch)
    for c in range(stage_ptr.shape[0] - 1):
        s0, s1 = stage_ptr[c], stage_ptr[c + 1]
        max_r = max(max_r, rank_ptr[c + 1] - rank_ptr[c])
        max_g = max(max_g, s1 - s0)
        max_l = max(max_l, hi[s1 - 1] - lo[s0])
        max_s = max(max_s, fwd_ptr[s1] - fwd_ptr[s0] + bwd_ptr[s1] - bwd_ptr[s0] + 2 * (s1 - s0) + 2)
    return max_s, max_r, max_g, max_l, max_b


@njit(cache=True, parallel=True)
def _evaluate_all(  # type: ignore[no-untyped-def]
    stage_ptr, lo, hi, rank, recompute, scale, fwd, fwd_ptr, bwd, bwd_ptr, rank_ptr, act, act_ptr,
    times, flat_times, out_bytes, stage_mem, param_prefix,
    latency, ms_per_byte, op_oh, msg_oh, msg_per_byte, state_factor,
    replicas, zero1, links, run_ptr, node_ptr, run_node, ar_latency, ar_per_byte, bucket_bytes,
    it, dead, top, comp, ar_end, spans, mem, busy, ends, blocks,
):  # fmt: skip
    n = stage_ptr.shape[0] - 1
    max_s, max_r, max_g, max_l, max_b = scratch_sizes(stage_ptr, rank_ptr, lo, hi, fwd, fwd_ptr, bwd, bwd_ptr)
    # Candidates are independent: blocks of them run on numba's threads, each with its own
    # scratch, and every result lands in the candidate's own slots (deterministic).
    for blk in prange(blocks):
        # Per slot (forwards, then backwards): its size, the absolute range of the producer slots it
        # reads and their samples; its delivery (-1: not yet; then per stage its last B/W end and that
        # action's duration) and the rank waiting for it (-1: none).
        slot_size = np.empty(max_s, np.int64)
        first = np.empty(max_s, np.int64)
        last = np.empty(max_s, np.int64)
        samples = np.empty(max_s, np.int64)
        offset = np.empty(max_s, np.int64)
        owner = np.empty(max_b, np.int64)
        deliv = np.empty(max_s)
        waiter = np.empty(max_s, np.int64)
        row_int = np.empty((4 * max_g, INT_COLS), np.int64)  # per (stage, kind): see prepare
        row_float = np.empty((4 * max_g, FLOAT_COLS))
        link = np.empty((max_r, max_r, 3))  # link[src, dst]: arrival of its last message, latency, ms/byte
        pos = np.empty(max_r, np.int64)
        clock = np.empty(max_r)
        level = np.empty(max_r)
        stack = np.empty(max_r, np.int64)
        last_end = np.empty(max_r)  # per rank, over the runs
        ready = np.empty(max_g)  # per stage, its last B/W's end over the runs
        took = np.empty(max_g)  # per stage, that action's duration (the same in every run)
        last_kind = np.empty(max_g, np.int64)  # per stage, that action's kind and size
        last_size = np.empty(max_g, np.int64)
        b_scratch = np.empty((3, max_l))  # per bucket: ready, all-reduce time, start
        b_int = np.empty((4, max_l), np.int64)  # per bucket: ready order, rank, first layer, stage
        for c in range(blk * n // blocks, (blk + 1) * n // blocks):
            r0, R = rank_ptr[c], rank_ptr[c + 1] - rank_ptr[c]
            s0, S = stage_ptr[c], stage_ptr[c + 1] - stage_ptr[c]
            n_slots = fwd_ptr[s0 + S] - fwd_ptr[s0] + bwd_ptr[s0 + S] - bwd_ptr[s0]
            D = replicas[c]
            factor = device_state_factor(state_factor, D, zero1[c])
            prepare(s0, S, lo, hi, rank, recompute, scale, fwd, fwd_ptr, bwd, bwd_ptr, times.shape[1],
                     times.shape[2], out_bytes, stage_mem, slot_size, offset, owner, first, last, samples, row_int, row_float)
            last_end[:R] = 0.0
            ready[:S] = 0.0
            for u in range(run_ptr[c], run_ptr[c + 1]):
                _set_links(link, R, run_node, node_ptr[u], node_ptr[u + 1], links, c, latency, ms_per_byte)
                dead[c] = _one(S, R, r0, n_slots, act, act_ptr, flat_times, times.shape[2], op_oh, msg_oh,
                               msg_per_byte, slot_size, first, last, samples, row_int, row_float, deliv, waiter,
                               link, pos, clock, level, stack, mem, busy)  # fmt: skip
                if dead[c]:  # links change times, never what waits for what
                    break
                for r in range(R):
                    ends[r0 + r] = clock[r]
                    last_end[r] = max(last_end[r], clock[r])
                for j in range(S):
                    ready[j] = max(ready[j], deliv[n_slots + j])
                    took[j] = deliv[n_slots + S + j]
            if dead[c]:
                for r in range(R):
                    ends[r0 + r] = clock[r]
            for g in range(s0, s0 + S):
                mem[r0 + rank[g]] += factor * stage_mem[g, 5]  # its parameters, a tied weight once per rank
            peak = 0.0
            for r in range(R):
                peak = max(peak, mem[r0 + r])
            if dead[c]:
                it[c] = top[c] = comp[c] = ar_end[c] = np.inf
                continue
            last_t = 0.0
            for r in range(R):
                ends[r0 + r] = last_end[r]
                last_t = max(last_t, last_end[r])
            done = 0.0
            if D > 1:
                _last_backwards(s0, S, r0, R, bwd, bwd_ptr, act, act_ptr, last_kind, last_size)
                done = _bucket_end(s0, S, lo, hi, rank, times, param_prefix, bucket_bytes[c], D, ar_latency,
                                   ar_per_byte, ready, took, last_kind, last_size, b_scratch, b_int, clock,
                                   spans)  # fmt: skip
            comp[c], ar_end[c] = last_t, done
            it[c] = max(last_t, done)
            top[c] = peak


@njit(cache=True)
def _set_links(link, R, run_node, n0, n1, links, c, latency, ms_per_byte):  # type: ignore[no-untyped-def]
    """Clear ``link``'s arrivals and give every rank pair of candidate ``c``'s run its latency and ms
    per byte: the profile's without a cluster (``n0 == n1``), else intra or inter by the ranks' nodes
    ``run_node[n0:n1]``."""
    for r in range(R):
        for q in range(R):
            link[r, q, 0] = 0.0
            if n0 == n1:
                link[r, q, 1] = latency
                link[r, q, 2] = ms_per_byte
            else:
                k = 0 if run_node[n0 + r] == run_node[n0 + q] else 2
                link[r, q, 1] = links[c, k]
                link[r, q, 2] = links[c, k + 1]


@njit(cache=True)
def _last_backwards(s0, S, r0, R, bwd, bwd_ptr, act, act_ptr, kind, size):  # type: ignore[no-untyped-def]
    """Per stage ``j`` of the candidate, the kind and size of its last ``B`` or ``W`` (its rank's list order)."""
    for r in range(R):
        for i in range(act_ptr[r0 + r], act_ptr[r0 + r + 1]):
            code = act[i]
            k = code_kind(code)
            if ends_backward(k):
                j = code_stage(code)
                kind[j] = k
                size[j] = bwd[bwd_ptr[s0 + j] + code_mb(code)]


@njit(cache=True)
def _bucket_end(  # type: ignore[no-untyped-def]
    s0, S, lo, hi, rank, times, param_prefix, cap, D, latency, per_byte, end, took, kind, size, scratch, ints,
    free, spans,
):  # fmt: skip
    """docs/model.md section 9: cut each stage into its gradient buckets (:func:`~umsearch.core.cluster.
    bucket_firsts`), ready each within the stage's last backward, ``kind``/``size``, that ends at ``end[j]``
    in the slowest run after ``took[j]`` (:func:`~umsearch.core.cluster.bucket_ready_ms`), and chain each
    rank's bucket all-reduces (:func:`~umsearch.core.cluster.chain_allreduces`). Writes each stage's first
    bucket ready time, first start and last end to ``spans[s0 + j]``; returns the latest end. ``scratch``,
    ``ints`` and ``free`` (per rank) are scratch."""
    ready, cost, start = scratch[0], scratch[1], scratch[2]
    order, ranks, firsts, stage = ints[0], ints[1], ints[2], ints[3]
    n = 0
    for j in range(S):
        g = s0 + j
        row = times[kind[j], size[j]]
        m = bucket_firsts(param_prefix, lo[g], hi[g], cap, firsts[n:])
        top = hi[g]
        for b in range(n, n + m):
            a = firsts[b]
            ready[b] = bucket_ready_ms(end[j], took[j], row[a] - row[lo[g]], row[hi[g]] - row[lo[g]])
            cost[b] = ring_ms(param_prefix[top] - param_prefix[a], D, latency[g], per_byte[g])
            stage[b] = j
            ranks[b] = rank[g]
            top = a
        n += m
    last = chain_allreduces(ready, cost, ranks, n, order, free, start)
    for j in range(S):
        spans[s0 + j, 0] = spans[s0 + j, 1] = np.inf
        spans[s0 + j, 2] = 0.0
    for b in range(n):
        g = s0 + stage[b]
        spans[g, 0] = min(spans[g, 0], ready[b])
        spans[g, 1] = min(spans[g, 1], start[b])
        spans[g, 2] = max(spans[g, 2], start[b] + cost[b])
    return last


@njit(cache=True)
def _one(  # type: ignore[no-untyped-def]
    S, R, r0, n_slots, act, act_ptr, times, layers, op_oh, msg_oh, msg_per_byte,
    slot_size, first, last, samples, row_int, row_float, deliv, waiter, link, pos, clock, level, stack, mem, busy,
):  # fmt: skip
    """Run one replica of a candidate (its tables from :func:`prepare`, its links in ``link``, see
    :func:`_set_links`, its ranks ``r0..r0+R-1``) to the end or to a deadlock; returns True on deadlock.
    Leaves each rank's end in ``clock``, its activation peak in ``mem[r0 + r]`` and busy time in ``busy[r0 + r]``; ``deliv[n_slots + j]`` at stage j's last B/W end and
    ``deliv[n_slots + S + j]`` at that action's duration.

    The rules of :mod:`umsearch.sim.kernels` (``finish``, ``needed_ms``, ``ready_at``) are spelled out
    inline here, on scalars and this function's own arguments: a kernel call taking arrays costs their
    reference counts on every action (ARCHITECTURE.md). What the action rules of :mod:`umsearch.core.actions`
    say of each stage and kind was worked out once (:func:`prepare`), as slots and 0/1 factors, so an
    action takes no branch on its kind: a mispredicted branch costs more than the arithmetic it skips.
    Memory multiplies the stage's docs/model.md 5 terms per sample (:func:`stage_memory`) by the size
    and adds the stash's fixed part to the stash.
    """
    _reset(n_slots, S, R, r0, deliv, waiter, pos, clock, level, stack, mem, busy)
    for r in range(R):  # a rank's link to itself: the message that is not sent arrives at once
        link[r, r, 0] = link[r, r, 1] = link[r, r, 2] = 0.0
    top_of_stack = R
    remaining = act_ptr[r0 + R] - act_ptr[r0]
    while top_of_stack > 0:
        top_of_stack -= 1
        r = stack[top_of_stack]
        a0 = act_ptr[r0 + r]
        n_act = act_ptr[r0 + r + 1] - a0
        i = pos[r]
        t_r = clock[r]
        lvl = level[r]
        peak = mem[r0 + r]
        work = busy[r0 + r]
        while i < n_act:
            code = act[_u(a0 + i)]
            kind = code_kind(code)
            row = 4 * code_stage(code) + kind
            k = code_mb(code)
            reads = row_int[_u(row), READ_AT] + k * row_int[_u(row), READ_STEP]
            lo_m, hi_m = first[_u(reads)], last[_u(reads)]
            d_lo, d_hi = deliv[_u(lo_m)], deliv[_u(hi_m)]
            ready = max(d_lo, d_hi)
            low = min(d_lo, d_hi)
            for m in range(lo_m + 1, hi_m):  # the producers between
                d = deliv[_u(m)]
                ready = max(ready, d)
                low = min(low, d)
            if low < 0.0:  # wait on the first producer that has not run; it resumes this rank
                for m in range(lo_m, hi_m + 1):
                    if deliv[m] < 0.0:
                        waiter[m] = r
                        break
                break
            start = max(t_r, ready)
            slot = row_int[_u(row), SLOT] + k
            size = slot_size[_u(slot)]
            at = size * layers
            dur = times[_u(row_int[_u(row), T_HI] + at)] - times[_u(row_int[_u(row), T_LO] + at)]
            dur += row_float[_u(row), RERUN] * (times[_u(row_int[_u(row), F_HI] + at)] - times[_u(row_int[_u(row), F_LO] + at)])
            dur *= row_float[_u(row), SCALE]
            # One message per producer by its full size, and one sent, each only across ranks.
            need = row_float[_u(row), CROSS] * ((hi_m - lo_m + 1) * msg_oh + msg_per_byte * samples[_u(reads)] *
                                            row_float[_u(row), RECV_BYTES])  # fmt: skip
            sent_ms = row_float[_u(row), SENDS] * (1 * msg_oh + msg_per_byte * size * row_float[_u(row), SEND_BYTES])
            end = start + dur + op_oh + need + sent_ms
            deliv[_u(row_int[_u(row), END_AT])] = end  # the stage's latest backward end so far (its rank runs in order)
            deliv[_u(row_int[_u(row), TOOK_AT])] = end - start
            dst = row_int[_u(row), DST]  # after the link's previous message
            arrival = max(end, link[_u(r), _u(dst), 0]) + (link[_u(r), _u(dst), 1] + size * row_float[_u(row), SEND_BYTES] *
                                                  link[_u(r), _u(dst), 2])  # fmt: skip
            link[_u(r), _u(dst), 0] = arrival
            sent = row_int[_u(row), SEND_AT] + k * row_int[_u(row), SEND_STEP]
            deliv[_u(sent)] = arrival
            w = waiter[_u(sent)]
            if w >= 0:
                waiter[_u(sent)] = -1
                stack[top_of_stack] = w
                top_of_stack += 1
            # Memory (docs/model.md 5): additions, the peak, then releases.
            add = (row_float[_u(row), ADD] * size + row_float[_u(row), ADD_FIXED] +
                   row_float[_u(row), ADD + 1] * size + row_float[_u(row), ADD + 2] * size +
                   row_float[_u(row), ADD + 3] * size)
            rel = (row_float[_u(row), REL] * size + row_float[_u(row), REL_FIXED] +
                   row_float[_u(row), REL + 1] * size + row_float[_u(row), REL + 2] * size +
                   row_float[_u(row), REL + 3] * size)
            lvl += add
            peak = max(peak, lvl)
            lvl -= rel
            work += end - start
            t_r = end
            i += 1
            remaining -= 1
        pos[r] = i
        clock[r] = t_r
        level[r] = lvl
        mem[r0 + r] = peak
        busy[r0 + r] = work
    return remaining > 0


@njit(cache=True)
def _reset(n_slots, S, R, r0, deliv, waiter, pos, clock, level, stack, mem, busy):  # type: ignore[no-untyped-def]
    """A candidate's start: nothing delivered or awaited (each stage's last backward end at 0, the idle
    slot delivered at 0), every rank at its first action with an empty clock and level, rank 0 first
    on the stack."""
    for q in range(n_slots):
        deliv[_u(q)] = -1.0
    for q in range(n_slots, n_slots + 2 * S + 2):
        deliv[_u(q)] = 0.0
    for q in range(n_slots + 2 * S + 2):
        waiter[_u(q)] = -1
    for r in range(R):
        pos[r], clock[r], level[r], mem[r0 + r], busy[r0 + r] = 0, 0.0, 0.0, 0.0, 0.0
        stack[r] = R - 1 - r
