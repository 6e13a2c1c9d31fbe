"""What every benchmark shares: the environment it ran in, medians with bootstrap intervals, drift.

Benchmarks compare contenders side by side in one run, rounds rotated; these
helpers turn the per-round numbers into what the JSON reports: a median with
a 95% bootstrap confidence interval, ratios between contenders (paired by
round), and how much the machine itself drifted while it ran.
"""

from __future__ import annotations

import os
import platform
import random
import statistics
import subprocess
import time
from collections.abc import Sequence
from typing import Any


def cpu_name() -> str:
    """The processor's model name (Linux), else the platform's word for it."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def environment() -> dict[str, Any]:
    """Where and when a benchmark ran: versions, processor, cores, load, commit."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=False).stdout.strip()
    except OSError:
        commit = ""
    import numpy

    return {"python": platform.python_version(), "numpy": numpy.__version__, "platform": platform.platform(),
            "cpu": cpu_name(), "cpus": os.cpu_count(),
            "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
            "loadavg_1m_at_start": os.getloadavg()[0] if hasattr(os, "getloadavg") else None, "commit": commit,
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}  # fmt: skip


def bootstrap_ci(xs: Sequence[float], stat: str = "median", n: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95% bootstrap interval of the median (or ``"mean"``) of ``xs``."""
    f = statistics.median if stat == "median" else statistics.fmean
    rng = random.Random(seed)
    vals = sorted(f(rng.choices(xs, k=len(xs))) for _ in range(n))
    return vals[int(0.025 * n)], vals[int(0.975 * n) - 1]


def summary(xs: Sequence[float]) -> dict[str, Any]:
    """Median, its 95% interval, quartiles and count of a sample."""
    q1, _, q3 = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) > 1 else (xs[0], 0, xs[0])
    lo, hi = bootstrap_ci(xs)
    return {"median": statistics.median(xs), "ci95": [lo, hi], "q1": q1, "q3": q3, "n": len(xs)}


def ratio(a: Sequence[float], b: Sequence[float]) -> dict[str, Any]:
    """Per-round ``a / b`` (paired: the same round ran both), its median and 95% interval."""
    rs = [x / y for x, y in zip(a, b, strict=True)]
    return {**summary(rs), "rounds": rs}


def drift(first: Sequence[float], last: Sequence[float]) -> float:
    """Relative change of the median between two samples of the same thing (the machine's drift)."""
    return statistics.median(last) / statistics.median(first) - 1


def kendall_tau(a: Sequence[float], b: Sequence[float]) -> float:
    """Kendall's tau-b between two paired samples (ties counted as neither concordant nor discordant)."""
    conc = disc = ties_a = ties_b = 0
    n = len(a)
    for i in range(n):
        for j in range(i + 1, n):
            da, db = a[i] - a[j], b[i] - b[j]
            if da == 0 and db == 0:
                continue
            if da == 0:
                ties_a += 1
            elif db == 0:
                ties_b += 1
            elif (da > 0) == (db > 0):
                conc += 1
            else:
                disc += 1
    denom = ((conc + disc + ties_a) * (conc + disc + ties_b)) ** 0.5
    return (conc - disc) / denom if denom > 0 else 0.0
