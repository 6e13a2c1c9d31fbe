"""``umsearch profile --check``: re-measure a sample of a stored profile and report its drift.

The sample is the most expensive layer groups (the ones that decide stage
times; a pooled group counts once) at the smallest, middle and largest
measured sizes, measured exactly as the profiler measures (the same rounds and
bursts). Drift of a cell is ``measured / stored - 1`` of forward plus
backward; the summary is the mean absolute drift, the same figure the
profile-noise benchmark reports between two profiles.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from umsearch.core.profile import Profile
from umsearch.errors import ProfilingError
from umsearch.measure.curves import iqr, median
from umsearch.measure.profiler import (
    ProfileConfig,
    Step,
    Target,
    cpu_share_of,
    group_name,
    measure_cells,
    run_chain,
    steps,
)
from umsearch.measure.rounds import Cell
from umsearch.nn.models import BuiltModel

SCHEMA = "umsearch.profile_check/1"


@dataclass(frozen=True, kw_only=True)
class CheckLimits:
    """When a stored profile still describes this machine."""

    mean: float = 0.05
    """Largest mean absolute drift."""
    worst: float = 0.15
    """Largest drift of any one cell."""


def stored_groups(profile: Profile) -> list[list[int]]:
    """The profile's pooled groups plus every other layer alone, ordered by first member."""
    pooled = [list(map(int, g)) for g in profile.extra.get("pooled", [])]
    seen = {i for g in pooled for i in g}
    return sorted(pooled + [[i] for i in range(profile.num_layers) if i not in seen])


def sample_groups(profile: Profile, groups: Sequence[Sequence[int]], n: int) -> list[list[int]]:
    """The ``n`` groups with the largest total forward+backward time (whole group), in layer order."""
    def weight(g: Sequence[int]) -> float:
        return sum(sum(profile.layers[i].fwd_ms) + sum(profile.layers[i].bwd_ms) for i in g)

    return sorted(list(g) for g in sorted(groups, key=weight, reverse=True)[:n])


def sample_sizes(sizes: Sequence[int]) -> list[int]:
    """Smallest, middle and largest size (fewer when there are fewer)."""
    return sorted({sizes[0], sizes[len(sizes) // 2], sizes[-1]})


def _verdict(cells: Sequence[dict[str, Any]], limits: CheckLimits) -> tuple[str, str, float, float]:
    drifts = [c["drift"] for c in cells]
    mean = statistics.fmean(abs(d) for d in drifts)
    worst = max(drifts, key=abs)
    summary = f"mean drift {mean:.1%}, worst {worst:+.1%} on {len(cells)} cells"
    if mean <= limits.mean and abs(worst) <= limits.worst:
        return "ok", f"{summary}: the profile still describes this machine", mean, worst
    return "drifted", (f"{summary} (limits {limits.mean:.0%} mean, {limits.worst:.0%} worst): the machine is busier "
                       "or other than when the profile was taken; re-profile on an idle machine"), mean, worst  # fmt: skip


def check_profile(
    profile: Profile, built: BuiltModel, config: ProfileConfig, *, groups: int = 4,
    limits: CheckLimits | None = None, tick: Step | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Re-measure a sample of ``profile`` with ``built`` (the same model) and report the drift.

    ``config.sizes`` is ignored: the sizes are sampled from the profile's.
    """
    if len(built.layers) != profile.num_layers:
        raise ProfilingError(f"the profile has {profile.num_layers} layers but the model builds {len(built.layers)}; "
                             "check it against the model it was measured from")  # fmt: skip
    for i, (stored, name) in enumerate(zip((lay.name for lay in profile.layers), built.names, strict=True)):
        if stored != name:
            raise ProfilingError(f"layer {i} is {stored!r} in the profile but {name!r} in the model; "
                                 "check the profile against the model (and arguments) it was measured from")  # fmt: skip
    for m in built.layers:
        m.to(config.device)
    sizes = sample_sizes(profile.microbatch_sizes)
    config = replace(config, sizes=tuple(sizes))
    chain = run_chain(built, sizes, config.device, precision=config.precision, cap_bytes=config.memory_cap_bytes)
    chosen = sample_groups(profile, stored_groups(profile), groups)
    targets = [Target(name=group_name(built.names, g), layers=tuple(g)) for g in chosen]
    cells = [Cell(t, b) for t in range(len(targets)) for b in chain.sizes]
    measured = measure_cells(targets, cells, built, chain, config, tick=tick)
    rows = []
    for cell in cells:
        if cell.size not in measured.sizes:
            continue
        k = profile.microbatch_sizes.index(cell.size)
        lay = profile.layers[chosen[cell.target][0]]
        s = measured.samples[cell]
        got, want = median(s["fwd"]) + median(s["bwd"]), lay.fwd_ms[k] + lay.bwd_ms[k]
        rows.append({"layers": chosen[cell.target], "name": targets[cell.target].name, "size": cell.size,
                     "stored_ms": want, "measured_ms": got, "spread_ms": iqr(s["fwd"]) + iqr(s["bwd"]),
                     "drift": got / want - 1 if want > 0 else 0.0})  # fmt: skip
    if not rows:
        raise ProfilingError("no sampled size fit in memory; the check cannot compare anything")
    word, message, mean, worst = _verdict(rows, limits or CheckLimits())
    return {"schema": SCHEMA, "verdict": word, "message": message, "mean_abs_drift": mean, "worst_drift": worst,
            "cells": rows, "rounds": config.repeats, "threads": torch.get_num_threads(),
            "cpu_share": cpu_share_of(measured, config.device), "duration_s": measured.duration_s}  # fmt: skip


def check_steps(profile: Profile, config: ProfileConfig, groups: int = 4) -> int:
    """Progress steps of :func:`check_profile`."""
    n = min(groups, len(stored_groups(profile)))
    return steps(config, n * len(sample_sizes(profile.microbatch_sizes)), 0)
