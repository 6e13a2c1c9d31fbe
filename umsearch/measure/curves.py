"""One layer quantity's curve over microbatch sizes: raw medians, spreads and a monotone fit.

Physics: doing more samples never takes less time, so a layer's time is
non-decreasing in the microbatch size. A measured curve that dips (16 slower
than 32) is noise, and a search would exploit it. :func:`isotonic_median` is
the closest non-decreasing curve to *all* samples in the L1 sense (the sum of
absolute deviations): pool-adjacent-violators whose merged blocks take the
median of the samples they pool. L1 rather than least squares so that one
preempted round cannot drag a value.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass


def median(xs: Sequence[float]) -> float:
    """The median (mean of the middle two for an even count); 0 for no samples."""
    return float(statistics.median(xs)) if xs else 0.0


def iqr(xs: Sequence[float]) -> float:
    """Interquartile range with linear interpolation between order statistics; 0 below two samples."""
    if len(xs) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    return float(q3 - q1)


def isotonic_median(samples: Sequence[Sequence[float]]) -> list[float]:
    """Non-decreasing values, one per size, minimizing ``sum |sample - value|`` over every sample.

    ``samples[k]`` are all samples of size k (ascending sizes; every size needs at least one).
    Adjacent sizes whose values violate the order are merged into one block whose value is the
    median of the union of their samples, until no violation is left.
    """
    if any(not s for s in samples):
        raise ValueError("every size needs at least one sample")
    blocks: list[tuple[list[float], int, float]] = []  # (pooled samples, sizes covered, value)
    for s in samples:
        pooled, width = sorted(s), 1
        value = median(pooled)
        while blocks and blocks[-1][2] > value:
            prev, prev_width, _ = blocks.pop()
            pooled, width = sorted(prev + pooled), width + prev_width
            value = median(pooled)
        blocks.append((pooled, width, value))
    return [value for _, width, value in blocks for _ in range(width)]


@dataclass(frozen=True, kw_only=True)
class Curve:
    """A quantity measured at every size over several rounds."""

    fitted: tuple[float, ...]
    """Monotone (non-decreasing) fit over all rounds: the profile's value."""
    raw: tuple[float, ...]
    """Median of the rounds at each size, before the fit."""
    spread: tuple[float, ...]
    """Interquartile range of the rounds at each size."""


def fit_curve(samples: Sequence[Sequence[float]]) -> Curve:
    """:class:`Curve` of ``samples[k]``, the per-round samples at the k-th size."""
    return Curve(
        fitted=tuple(isotonic_median(samples)),
        raw=tuple(median(s) for s in samples),
        spread=tuple(iqr(s) for s in samples),
    )


def relative_spread(spread: Sequence[float], raw: Sequence[float]) -> float:
    """Time-weighted relative spread of a curve: total IQR over total median (0 for a zero curve)."""
    total = sum(raw)
    return sum(spread) / total if total > 0 else 0.0
