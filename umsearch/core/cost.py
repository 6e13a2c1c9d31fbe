"""The cost model: stage times, transfer times and memory terms of docs/model.md sections 1, 4 and 5.

One rule turns measured layer times into the time at any size
(:func:`interpolate_times`: linear between measured sizes, the line through
the last two beyond, floored at 0, applied per layer before summing). A stage
time is a difference of prefix sums over layers at one size. :class:`CostModel`
computes those rows lazily, for the sizes a plan actually uses (a plan of one
microbatch of ten million samples costs one row); :meth:`CostModel.tables`
builds the same rows densely for every size up to a bound, read-only, for the
compiled batch evaluator. Both go through the same function, so the reference
simulator and the evaluator read the same numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from umsearch.core.plan import Plan
from umsearch.core.profile import QUANTITIES, Profile, RuntimeCosts, TiedWeight
from umsearch.errors import PlanError

FloatArray = npt.NDArray[np.float64]

MIB = float(2**20)
"""Bytes in the MiB of ``runtime.message_overhead_ms_per_mib``."""

MAX_TABLE_BYTES = 512 * 2**20
"""Largest dense cost table :meth:`CostModel.tables` builds (sizes x layers x 4 quantities)."""


def interpolate_times(sizes: Sequence[int], times: FloatArray, b: npt.ArrayLike) -> FloatArray:
    """Per-layer times at the sizes ``b``: ``times`` is (layers, len(sizes)), the result (len(b), layers).

    Between measured sizes: linear interpolation. Above the largest: the line
    through the last two measured points, floored at 0 (docs/model.md section 1).
    Size 0 costs nothing.
    """
    s = np.asarray(sizes, dtype=np.float64)
    bb = np.atleast_1d(np.asarray(b, dtype=np.float64))
    out = np.empty((bb.shape[0], times.shape[0]), dtype=np.float64)
    inside = bb <= s[-1]
    slope = (times[:, -1] - times[:, -2]) / (s[-1] - s[-2])
    for layer in range(times.shape[0]):
        out[inside, layer] = np.interp(bb[inside], s, times[layer])
    out[~inside] = np.maximum(0.0, times[None, :, -1] + slope[None, :] * (bb[~inside, None] - s[-1]))
    out[bb == 0] = 0.0
    return out


def stage_scales(runtime: RuntimeCosts, lo: npt.ArrayLike, hi: npt.ArrayLike) -> FloatArray:
    """docs/model.md (version 2.1): the factor on the layer times of each stage ``[lo, hi)`` (elementwise).

    A measured ``runtime.ranges`` entry for exactly ``[lo, hi)`` wins; else ``runtime.stage_scale``
    at k = hi - lo layers, linear between its points and constant beyond the ends; else 1. The one
    home of the rule: every simulator, the order generator, the partition search and the lower
    bound take their stage times through it.
    """
    lo_a = np.atleast_1d(np.asarray(lo, dtype=np.int64))
    hi_a = np.atleast_1d(np.asarray(hi, dtype=np.int64))
    if runtime.stage_scale:
        ks, ss = zip(*runtime.stage_scale, strict=True)
        out = np.interp((hi_a - lo_a).astype(np.float64), np.asarray(ks, dtype=np.float64), np.asarray(ss))
    else:
        out = np.ones(lo_a.shape[0])
    for r_lo, r_hi, scale in runtime.ranges:
        out[(lo_a == r_lo) & (hi_a == r_hi)] = scale
    return out


def device_state_factor(base: float, replicas: int, zero1: bool) -> float:
    """Bytes of training state per parameter byte on one device (docs/model.md 9): ``base``, or with ZeRO-1
    its optimizer part sharded over the ``replicas`` copies, ``2 + (base - 2) / D``. The one rule: the
    simulators, the compiled kernels (which compile this very function) and the cluster pruning read it."""
    return 2.0 + (base - 2.0) / replicas if zero1 else base


def least_scale(runtime: RuntimeCosts) -> float:
    """The smallest factor :func:`stage_scales` can give any stage (what keeps a lower bound a bound)."""
    values = [s for _, s in runtime.stage_scale] or [1.0]
    return min(values + [sc for _, _, sc in runtime.ranges])


def _prefix(rows: FloatArray) -> FloatArray:
    """Prefix sums over layers, a zero column first: ``[b, hi] - [b, lo]`` is a stage's time."""
    return np.ascontiguousarray(np.hstack([np.zeros((rows.shape[0], 1)), np.cumsum(rows, axis=1)]))


class _MemoryTerms(Protocol):
    """What :func:`stage_memory` reads of a profile (:class:`CostModel` or :class:`CostTables`)."""

    @property
    def stash_prefix(self) -> FloatArray: ...
    @property
    def shared(self) -> FloatArray: ...
    @property
    def kept(self) -> FloatArray: ...
    @property
    def freed(self) -> FloatArray: ...
    @property
    def freed_prefix(self) -> FloatArray: ...
    @property
    def out_bytes(self) -> FloatArray: ...
    @property
    def input_bytes(self) -> float: ...


MEMORY_TERMS = ("stash", "input", "kept", "freed")
"""The per-sample quantities of a stage that docs/model.md 5's table (:data:`umsearch.core.actions.MEMORY`)
combines, in the order of :func:`stage_memory`'s last axis."""


def stage_memory(p: _MemoryTerms, lo: npt.ArrayLike, hi: npt.ArrayLike, recompute: npt.ArrayLike,
                 hand_in: npt.ArrayLike, hand_out: npt.ArrayLike) -> FloatArray:  # fmt: skip
    """docs/model.md 5 (version 2.3), per sample of stages ``[lo, hi)`` (elementwise; last axis
    :data:`MEMORY_TERMS`):

    - ``stash``: what the stage's graph keeps, ``sum stash_bytes[lo:hi] - sum_{lo<i<hi}
      boundary_shared_bytes[i]``, less ``boundary_shared_bytes[lo]`` where ``hand_in`` (the previous stage,
      on the same rank, handed its output over and counts that storage itself);
    - ``input``: ``in_j``, one input sample;
    - ``kept``: of it, what the first layer saves (``input_saved_bytes[lo]``): a recomputing stage's
      rebuilt graph saves its kept input, not a copy;
    - ``freed``: what ``I`` frees: its layers' ``stash_bytes - weight_stash_bytes`` (each layer's ``I``
      runs on its own graph), less, at each interior boundary and at a boundary handed on (``hand_out``),
      the storage the layer after still saves for its ``W`` (``boundary_shared_bytes``, at most what the
      layer before frees); at most ``stash``.
    """
    lo, hi = np.asarray(lo, dtype=np.int64), np.asarray(hi, dtype=np.int64)
    rec = np.asarray(recompute, dtype=np.bool_)
    stash = p.stash_prefix[hi] - p.stash_prefix[lo] + p.shared[lo] - np.where(hand_in, p.shared[lo], 0.0)
    inp = np.where(lo == 0, p.input_bytes, p.out_bytes[np.maximum(lo - 1, 0)])
    kept = np.where(rec, p.kept[lo], 0.0)
    last = np.where(hand_out, p.freed_prefix[hi] - p.freed_prefix[hi - 1], p.freed[hi - 1])
    freed = p.freed_prefix[hi - 1] - p.freed_prefix[lo] + last
    out: FloatArray = np.stack(np.broadcast_arrays(stash, inp, kept, np.clip(freed, 0.0, stash)), axis=-1)
    return out


class _FixedTerms(Protocol):
    """What :func:`stash_fixed` reads of a profile."""

    @property
    def stash_fixed_prefix(self) -> FloatArray: ...


def stash_fixed(p: _FixedTerms, lo: npt.ArrayLike, hi: npt.ArrayLike) -> FloatArray:
    """docs/model.md 5 (version 2.3): ``c_j``, the bytes stages ``[lo, hi)`` save per microbatch whatever its
    size (the sum of their layers' ``stash_fixed_bytes``; elementwise). A microbatch of ``n`` samples adds
    ``stash_j * n + c_j`` where the table adds its stash, and releases the same where it releases the stash;
    ``I`` frees none of it."""
    lo, hi = np.asarray(lo, dtype=np.int64), np.asarray(hi, dtype=np.int64)
    out: FloatArray = p.stash_fixed_prefix[hi] - p.stash_fixed_prefix[lo]
    return out


class _StateTerms(Protocol):
    """What :func:`stage_params` reads of a profile."""

    @property
    def param_prefix(self) -> FloatArray: ...
    @property
    def tied(self) -> tuple[TiedWeight, ...]: ...


def stage_params(p: _StateTerms, lo: npt.ArrayLike, hi: npt.ArrayLike, rank: npt.ArrayLike,
                 group: npt.ArrayLike) -> FloatArray:  # fmt: skip
    """docs/model.md 5 (version 2.3), elementwise over stages ``[lo, hi)`` on ranks ``rank`` of plans
    ``group`` (stages of one plan share a group and come in stage order): each stage's parameter bytes as
    its rank holds them. ``P_j``, less each tied weight (``tied_weights``) that an earlier stage of the
    same rank already holds, or that the stage's own layers hold more than once: summed over a rank's
    stages, every tied weight counts once."""
    lo, hi = np.asarray(lo, dtype=np.int64), np.asarray(hi, dtype=np.int64)
    out: FloatArray = p.param_prefix[hi] - p.param_prefix[lo]
    if not p.tied:
        return out
    rank_a = np.broadcast_to(np.asarray(rank, dtype=np.int64), lo.shape)
    key = np.broadcast_to(np.asarray(group, dtype=np.int64), lo.shape) * (int(np.max(rank_a, initial=0)) + 1) + rank_a
    for tie in p.tied:
        held = np.zeros(lo.shape, dtype=np.int64)
        for i in tie.layers:
            held += (lo <= i) & (i < hi)
        holders = np.flatnonzero(held)
        first = np.zeros(lo.shape, dtype=np.int64)
        first[holders[np.unique(key[holders], return_index=True)[1]]] = 1  # the rank's first stage holding it
        out = out - tie.bytes * (held - first)
    return out


@dataclass(frozen=True, kw_only=True)
class CostTables:
    """Dense, read-only cost tables for every size ``0..b_max``: what the compiled evaluator reads."""

    b_max: int
    """Largest microbatch size covered."""
    times: FloatArray
    """(4, b_max+1, L+1): per action kind (F, B, I, W, the order of
    :data:`~umsearch.core.actions.KINDS`), prefix sums over layers of its time at each size; the
    I and W rows are NaN where the profile has no split. One array, so compiled code passes it cheaply."""
    out_bytes: FloatArray
    """(L,) bytes per sample of each layer's output."""
    stash_prefix: FloatArray
    """(L+1,) prefix sums over layers of ``stash_bytes[i] - boundary_shared_bytes[i]`` per sample: a stage
    ``[lo, hi)`` keeps ``stash_prefix[hi] - stash_prefix[lo] + shared[lo]`` (docs/model.md 5); per layer,
    a lower bound of what it adds to any stage holding it."""
    shared: FloatArray
    """(L+1,) per layer ``boundary_shared_bytes`` per sample (0 at ``L``)."""
    kept: FloatArray
    """(L,) per layer ``input_saved_bytes`` per sample (0 where the profile does not say)."""
    freed: FloatArray
    """(L,) per layer ``stash_bytes - weight_stash_bytes`` per sample: what its ``I`` frees, run alone (0
    where the profile does not say)."""
    freed_prefix: FloatArray
    """(L+1,) prefix sums of what a layer's ``I`` frees that the next layer does not save:
    ``freed[i] - min(freed[i], boundary_shared_bytes[i+1])``."""
    param_prefix: FloatArray
    """(L+1,) prefix sums of parameter bytes."""
    stash_fixed_prefix: FloatArray
    """(L+1,) prefix sums of ``stash_fixed_bytes``: what a layer saves per microbatch whatever its size."""
    tied: tuple[TiedWeight, ...]
    """The profile's tied weights (:func:`stage_params`)."""
    input_bytes: float
    """Bytes of one input sample of layer 0."""
    latency_ms: float
    """Link latency per message."""
    ms_per_byte: float
    """Link transfer time per byte."""
    op_overhead_ms: float
    """Runtime cost added to every action."""
    message_overhead_ms: float
    """Runtime cost of each cross-rank message, to the sender and to each action needing it."""
    message_overhead_ms_per_byte: float
    """Size-dependent part of that cost (``runtime.message_overhead_ms_per_mib`` per byte)."""
    state_factor: float
    """Bytes of training state per parameter byte."""
    runtime: RuntimeCosts
    """The profile's runtime terms, for :meth:`stage_scale`."""

    def stage_memory(self, lo: npt.ArrayLike, hi: npt.ArrayLike, recompute: npt.ArrayLike,
                     hand_in: npt.ArrayLike, hand_out: npt.ArrayLike) -> FloatArray:  # fmt: skip
        """:func:`stage_memory` of this profile, elementwise over stages ``[lo, hi)``: shape (stages, 4)."""
        return stage_memory(self, lo, hi, recompute, hand_in, hand_out)

    def stash_fixed(self, lo: npt.ArrayLike, hi: npt.ArrayLike) -> FloatArray:
        """:func:`stash_fixed` of this profile, elementwise over stages ``[lo, hi)``."""
        return stash_fixed(self, lo, hi)

    def stage_params(self, lo: npt.ArrayLike, hi: npt.ArrayLike, rank: npt.ArrayLike,
                     group: npt.ArrayLike) -> FloatArray:  # fmt: skip
        """:func:`stage_params` of this profile, elementwise over stages ``[lo, hi)``."""
        return stage_params(self, lo, hi, rank, group)

    def stage_scale(self, lo: npt.ArrayLike, hi: npt.ArrayLike) -> FloatArray:
        """:func:`stage_scales` of this profile, elementwise over stages ``[lo, hi)``."""
        return stage_scales(self.runtime, lo, hi)

    @property
    def least_scale(self) -> float:
        """:func:`least_scale` of this profile."""
        return least_scale(self.runtime)


class CostModel:
    """Stage costs of one profile under one state factor, computed per size on first use."""

    def __init__(self, profile: Profile, state_factor: float = 4.0) -> None:
        self.profile = profile
        self.state_factor = float(state_factor)
        self.num_layers = profile.num_layers
        lay = profile.layers
        nan = (float("nan"),) * len(profile.microbatch_sizes)
        self._raw = {q: np.array([lay_.times(q) or nan for lay_ in lay], dtype=np.float64) for q in QUANTITIES}
        self._rows: dict[tuple[str, int], FloatArray] = {}
        self.out_bytes = np.array([x.out_bytes for x in lay], dtype=np.float64)
        self.shared = np.array([x.boundary_shared_bytes for x in lay] + [0.0], dtype=np.float64)
        self.stash_prefix = np.concatenate([[0.0], np.cumsum([x.stash_bytes for x in lay] - self.shared[:-1])])
        self.kept = np.array([x.input_saved_bytes or 0.0 for x in lay], dtype=np.float64)
        self.freed = np.array([0.0 if x.weight_stash_bytes is None else x.stash_bytes - x.weight_stash_bytes
                               for x in lay], dtype=np.float64)  # fmt: skip
        self.freed_prefix = np.concatenate([[0.0], np.cumsum(self.freed - np.minimum(self.freed, self.shared[1:]))])
        self.param_prefix = np.concatenate([[0.0], np.cumsum([x.param_bytes for x in lay])])
        self.stash_fixed_prefix = np.concatenate([[0.0], np.cumsum([x.stash_fixed_bytes for x in lay])])
        self.tied = profile.tied_weights
        self.input_bytes = float(profile.input_bytes)
        self.latency_ms = float(profile.link.latency_ms)
        self.ms_per_byte = 1.0 / (profile.link.bandwidth_gb_per_s * 1e6)  # GB/s is 1e6 bytes per ms
        self.op_overhead_ms = float(profile.runtime.op_overhead_ms)
        self.message_overhead_ms = float(profile.runtime.message_overhead_ms)
        self.message_overhead_ms_per_byte = float(profile.runtime.message_overhead_ms_per_mib) / MIB
        self._scales: dict[tuple[int, int], float] = {}

    def _row(self, quantity: str, b: int) -> FloatArray:
        key = (quantity, b)
        row = self._rows.get(key)
        if row is None:
            row = _prefix(interpolate_times(self.profile.microbatch_sizes, self._raw[quantity], [b]))[0]
            self._rows[key] = row
        return row

    def time_ms(self, quantity: str, lo: int, hi: int, b: int) -> float:
        """``quantity`` (``fwd``, ``bwd``, ``bwd_input``, ``bwd_weight``) of layers ``[lo, hi)`` at size ``b``."""
        row = self._row(quantity, b)
        return float(row[hi] - row[lo])

    def stage_scale(self, lo: int, hi: int) -> float:
        """:func:`stage_scales` of stage ``[lo, hi)`` under this profile."""
        key = (lo, hi)
        scale = self._scales.get(key)
        if scale is None:
            scale = self._scales[key] = float(stage_scales(self.profile.runtime, lo, hi)[0])
        return scale

    def message_charge_ms(self, boundary_layer: int, samples: int) -> float:
        """What one cross-rank message of ``samples`` outputs of ``boundary_layer`` costs the compute
        timeline of its sender, and again of each action that needs it (docs/model.md 4 and 2.1)."""
        return self.message_overhead_ms + self.message_overhead_ms_per_byte * samples * float(
            self.out_bytes[boundary_layer])

    def transfer_ms(self, boundary_layer: int, samples: int) -> float:
        """One message of ``samples`` outputs of layer ``boundary_layer`` (either direction)."""
        return self.latency_ms + samples * float(self.out_bytes[boundary_layer]) * self.ms_per_byte

    def stash_bytes(self, lo: int, hi: int) -> float:
        """``stash_j``: bytes per sample stashed by layers ``[lo, hi)``, a storage saved on both sides of an
        interior layer boundary once (docs/model.md 5)."""
        return float(self.stash_prefix[hi] - self.stash_prefix[lo] + self.shared[lo])

    def stage_memory(self, lo: int, hi: int, recompute: bool, hand_in: bool = False,
                     hand_out: bool = False) -> tuple[float, float, float, float]:  # fmt: skip
        """:func:`stage_memory` of one stage ``[lo, hi)``, per sample."""
        row = stage_memory(self, lo, hi, recompute, hand_in, hand_out)
        return float(row[0]), float(row[1]), float(row[2]), float(row[3])

    def microbatch_memory(self, lo: int, hi: int, recompute: bool, hand_in: bool, hand_out: bool,
                          n: int) -> tuple[float, float, float, float]:  # fmt: skip
        """The sizes docs/model.md 5's table combines for one microbatch of ``n`` samples of stage ``[lo, hi)``:
        :meth:`stage_memory` times ``n``, the stash plus its fixed part (:func:`stash_fixed`)."""
        stash, inp, kept, freed = self.stage_memory(lo, hi, recompute, hand_in, hand_out)
        return stash * n + float(stash_fixed(self, lo, hi)), inp * n, kept * n, freed * n

    def stash_fixed(self, lo: npt.ArrayLike, hi: npt.ArrayLike) -> FloatArray:
        """:func:`stash_fixed` of this profile, elementwise over stages ``[lo, hi)``."""
        return stash_fixed(self, lo, hi)

    def stage_params(self, lo: npt.ArrayLike, hi: npt.ArrayLike, rank: npt.ArrayLike,
                     group: npt.ArrayLike) -> FloatArray:  # fmt: skip
        """:func:`stage_params` of this profile, elementwise over stages ``[lo, hi)``."""
        return stage_params(self, lo, hi, rank, group)

    def rank_param_bytes(self, stages: Sequence[tuple[int, int]]) -> float:
        """The parameter bytes of a rank holding the layer ranges ``stages`` (``(lo, hi)`` in stage order):
        their ``P_j``, each tied weight once (:func:`stage_params`)."""
        lo, hi = (np.array([x[k] for x in stages], dtype=np.int64) for k in (0, 1))
        return float(sum(stage_params(self, lo, hi, 0, 0).tolist()))  # in stage order, as 2.2 added them

    def param_bytes(self, lo: int, hi: int) -> float:
        """``P_j``: parameter bytes of layers ``[lo, hi)``."""
        return float(self.param_prefix[hi] - self.param_prefix[lo])

    def input_bytes_of(self, lo: int) -> float:
        """``in_j``: bytes per sample entering a stage that starts at layer ``lo``."""
        return self.input_bytes if lo == 0 else float(self.out_bytes[lo - 1])

    def check(self, plan: Plan) -> Plan:
        """Raise PlanError unless ``plan`` covers this profile's layers and has the I/W split it uses."""
        if plan.num_layers != self.num_layers:
            raise PlanError(
                f"the plan covers layers [0, {plan.num_layers}) but the profile has {self.num_layers} layers; "
                "cost the plan with the profile it was made for"
            )
        for j, split in enumerate(plan.uses_split):
            st = plan.stages[j]
            missing = self.profile.layers_without_split(st.lo, st.hi) if split else []
            if missing:
                raise PlanError(
                    f"stage {j} uses I/W but layer {missing[0]} has no bwd_input_ms; re-profile with the "
                    f"backward split measured, or give stage {j} full backwards (B)"
                )
        return plan

    def tables(self, b_max: int) -> CostTables:
        """Dense read-only tables for sizes ``0..b_max``; refuses sizes that need over
        :data:`MAX_TABLE_BYTES`."""
        need = (b_max + 1) * (self.num_layers + 1) * 8 * len(QUANTITIES)
        if need > MAX_TABLE_BYTES:
            raise PlanError(
                f"microbatches of up to {b_max} samples on {self.num_layers} layers need {need / 2**20:.0f} MiB "
                f"of cost tables, above the limit of {MAX_TABLE_BYTES / 2**20:.0f} MiB; use smaller microbatches"
            )
        sizes = np.arange(b_max + 1)
        times = np.stack([_prefix(interpolate_times(self.profile.microbatch_sizes, self._raw[q], sizes))
                          for q in QUANTITIES])  # fmt: skip
        arrays = {"times": times, "out_bytes": self.out_bytes.copy(), "stash_prefix": self.stash_prefix.copy(),
                  "shared": self.shared.copy(), "kept": self.kept.copy(), "freed": self.freed.copy(),
                  "freed_prefix": self.freed_prefix.copy(), "param_prefix": self.param_prefix.copy(),
                  "stash_fixed_prefix": self.stash_fixed_prefix.copy()}  # fmt: skip
        for a in arrays.values():
            a.setflags(write=False)
        return CostTables(b_max=b_max, **arrays, input_bytes=self.input_bytes, latency_ms=self.latency_ms,
                          ms_per_byte=self.ms_per_byte, op_overhead_ms=self.op_overhead_ms,
                          message_overhead_ms=self.message_overhead_ms,
                          message_overhead_ms_per_byte=self.message_overhead_ms_per_byte,
                          state_factor=self.state_factor, runtime=self.profile.runtime, tied=self.tied)  # fmt: skip
