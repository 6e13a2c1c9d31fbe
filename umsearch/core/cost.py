"""The cost model: stage times, transfer times and memory terms of MODEL.md.

Built once from a :class:`~umsearch.core.profile.Profile`. Per-layer times are
interpolated (and extrapolated, floored at 0) to every integer microbatch size
up to a cap, then prefix-summed over layers, so the forward or backward time of
any layer range at any size is two table lookups. The tables are plain numpy
arrays so the compiled batch evaluator reads the very same numbers as the
reference simulator.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from umsearch.core.profile import Profile

FloatArray = npt.NDArray[np.float64]


def interpolate_times(sizes: tuple[int, ...], times: FloatArray, b_max: int) -> FloatArray:
    """Times at sizes ``0..b_max`` for every layer: ``times`` is (layers, len(sizes)).

    Between measured sizes: linear interpolation. Above the largest: the line
    through the last two measured points, floored at 0 (MODEL.md section 1).
    Row 0 (size 0) is zero so a stage with no samples costs nothing.
    """
    s = np.asarray(sizes, dtype=np.float64)
    b = np.arange(b_max + 1, dtype=np.float64)
    out = np.zeros((b_max + 1, times.shape[0]), dtype=np.float64)
    inside = b <= s[-1]
    for layer in range(times.shape[0]):
        out[inside, layer] = np.interp(b[inside], s, times[layer])
        slope = (times[layer, -1] - times[layer, -2]) / (s[-1] - s[-2])
        out[~inside, layer] = np.maximum(0.0, times[layer, -1] + slope * (b[~inside] - s[-1]))
    out[0, :] = 0.0
    return out


class CostModel:
    """O(1) stage costs for one profile; ``b_max`` grows on demand."""

    def __init__(self, profile: Profile, state_factor: float = 4.0, b_max: int = 64) -> None:
        self.profile = profile
        self.state_factor = float(state_factor)
        lay = profile.layers
        self.num_layers = len(lay)
        self._fwd_raw = np.array([x.fwd_ms for x in lay], dtype=np.float64)
        self._bwd_raw = np.array([x.bwd_ms for x in lay], dtype=np.float64)
        self.out_bytes = np.array([x.out_bytes for x in lay], dtype=np.float64)
        self.stash_prefix = np.concatenate([[0.0], np.cumsum([x.stash_bytes for x in lay])])
        self.param_prefix = np.concatenate([[0.0], np.cumsum([x.param_bytes for x in lay])])
        self.input_bytes = float(profile.input_bytes)
        self.latency_ms = float(profile.link.latency_ms)
        # ms per byte: bandwidth in GB/s is 1e6 bytes per ms.
        self.ms_per_byte = 1.0 / (profile.link.bandwidth_gb_per_s * 1e6)
        self.b_max = 0
        self.fwd_prefix = np.zeros((1, self.num_layers + 1))
        self.bwd_prefix = np.zeros((1, self.num_layers + 1))
        self.ensure(b_max)

    def ensure(self, b_max: int) -> None:
        """Make the tables cover microbatch sizes up to ``b_max``."""
        if b_max <= self.b_max:
            return
        sizes = self.profile.microbatch_sizes
        zero = np.zeros((b_max + 1, 1))
        fwd = interpolate_times(sizes, self._fwd_raw, b_max)
        bwd = interpolate_times(sizes, self._bwd_raw, b_max)
        self.fwd_prefix = np.ascontiguousarray(np.hstack([zero, np.cumsum(fwd, axis=1)]))
        self.bwd_prefix = np.ascontiguousarray(np.hstack([zero, np.cumsum(bwd, axis=1)]))
        self.b_max = b_max

    def layer_fwd_ms(self, layer: int, b: int) -> float:
        """Forward time of one layer at size ``b``."""
        return self.stage_fwd_ms(layer, layer + 1, b)

    def layer_bwd_ms(self, layer: int, b: int) -> float:
        """Backward time of one layer at size ``b`` (no recompute)."""
        return self.stage_bwd_ms(layer, layer + 1, b, recompute=False)

    def stage_fwd_ms(self, lo: int, hi: int, b: int) -> float:
        """``F(b)``: forward time of layers ``[lo, hi)`` on ``b`` samples."""
        self.ensure(b)
        return float(self.fwd_prefix[b, hi] - self.fwd_prefix[b, lo])

    def stage_bwd_ms(self, lo: int, hi: int, b: int, recompute: bool) -> float:
        """``G(b)``: backward time, plus ``F(b)`` when the stage recomputes."""
        self.ensure(b)
        g = float(self.bwd_prefix[b, hi] - self.bwd_prefix[b, lo])
        return g + self.stage_fwd_ms(lo, hi, b) if recompute else g

    def transfer_ms(self, boundary_layer: int, samples: int) -> float:
        """Time to send ``samples`` outputs of layer ``boundary_layer`` (either direction)."""
        return self.latency_ms + samples * self.out_bytes[boundary_layer] * self.ms_per_byte

    def stash_bytes(self, lo: int, hi: int) -> float:
        """``stash_s``: bytes per sample stashed by layers ``[lo, hi)``."""
        return float(self.stash_prefix[hi] - self.stash_prefix[lo])

    def param_bytes(self, lo: int, hi: int) -> float:
        """``P_s``: parameter bytes of layers ``[lo, hi)``."""
        return float(self.param_prefix[hi] - self.param_prefix[lo])

    def input_bytes_of(self, lo: int) -> float:
        """``in_s``: bytes per sample entering a stage that starts at layer ``lo``."""
        return self.input_bytes if lo == 0 else float(self.out_bytes[lo - 1])

    def peak_memory_bytes(
        self, lo: int, hi: int, inflight: int, recompute: bool, max_backward: int
    ) -> float:
        """Peak memory of a stage, MODEL.md section 5."""
        base = self.state_factor * self.param_bytes(lo, hi)
        if recompute:
            return base + self.input_bytes_of(lo) * inflight + self.stash_bytes(lo, hi) * max_backward
        return base + self.stash_bytes(lo, hi) * inflight
