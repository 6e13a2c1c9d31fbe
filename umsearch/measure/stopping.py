"""When a cell has been measured enough: how well the median of its rounds is known.

The profile's value of a cell is (before the monotone fit) the median of its
per-round samples, so the rule asks how well that median is known. The
standard error of the median of ``n`` samples is about ``0.93 IQR / sqrt(n)``
(``1.2533 sigma / sqrt(n)`` for normal samples, ``sigma = IQR / 1.349``; the
same figure :mod:`umsearch.measure.quality` uses to suggest ``--repeats``), so
its ``confidence`` interval is ``median +- z 0.93 IQR / sqrt(n)``
(:func:`median_half_width`, ``z = 1.645`` at 90%). The interquartile range
rather than the standard deviation, so that one round a burst of load hit
moves it little: an exact order-statistic interval (``[x(j), x(n+1-j)]``) is
``[min, max]`` up to nine samples at 90% and lets one such round hold a cell
for ten (in one profile of the 6-block GPT on this project's shared 2-core
machine it kept the median cell running 13 of 15 rounds at 5%).

A cell stops (:func:`converged`) when every quantity's half-width is at most
``precision`` of its median, after at least ``min_rounds`` rounds. A quantity
smaller than ``floor_ms`` is judged against ``floor_ms`` instead (the profiler
passes 1% of the measured layers' time at that size, the share from which
:mod:`umsearch.measure.quality` counts a layer's noise), so that the noise of
a 0.01 ms embedding does not keep the whole round going. ``precision`` 0 never
stops early.

With the default 5% a cell whose rounds spread by an IQR of 7% of their
median stops after 5 rounds; one at the quality report's steady limit (10%)
after about 10; 15 rounds (the default ``repeats``, the most) know the median
of a cell spread by 12% to 5%.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from statistics import NormalDist

from umsearch.measure.curves import iqr, median

DEFAULT_PRECISION = 0.05
"""Half-width of the median's interval, relative to the median, at which a cell stops (5%)."""

DEFAULT_CONFIDENCE = 0.90
"""Coverage of the interval."""

MIN_ROUNDS = 5
"""Fewest timed rounds of every cell (an IQR of fewer says little)."""

MEDIAN_SE = 0.93
"""Standard error of a median over ``IQR / sqrt(n)`` (``1.2533 / 1.349`` for normal samples)."""


def median_half_width(xs: Sequence[float], confidence: float = DEFAULT_CONFIDENCE) -> float:
    """Half-width (ms) of the ``confidence`` interval of the median of ``xs``; ``inf`` below 2 samples."""
    if len(xs) < 2:
        return math.inf
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    return z * MEDIAN_SE * iqr(xs) / math.sqrt(len(xs))


def relative_half_width(xs: Sequence[float], confidence: float = DEFAULT_CONFIDENCE, floor: float = 0.0) -> float:
    """:func:`median_half_width` over ``max(median, floor)``; 0 for an all-zero quantity (a layer with no
    backward), ``inf`` below 2 samples."""
    half = median_half_width(xs, confidence)
    scale = max(abs(median(xs)), floor)
    if scale <= 0:
        return 0.0 if half == 0 else math.inf
    return half / scale


def converged(samples: Mapping[str, Sequence[float]], *, precision: float = DEFAULT_PRECISION,
              confidence: float = DEFAULT_CONFIDENCE, min_rounds: int = MIN_ROUNDS,
              floor_ms: float = 0.0) -> bool:  # fmt: skip
    """Whether a cell's per-round samples (per quantity) are enough (see the module doc): at least
    ``min_rounds`` (and 2) of every quantity, and each median known to ``precision`` (of itself, or of
    ``floor_ms`` when that is larger). ``precision <= 0`` never converges."""
    if precision <= 0 or not samples:
        return False
    for xs in samples.values():
        if len(xs) < max(min_rounds, 2):
            return False
        if relative_half_width(xs, confidence, floor_ms) > precision:
            return False
    return True
