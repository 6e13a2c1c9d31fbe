"""How far to trust a profile: per-layer spread, pooling, calibration, and a verdict with the fix.

Every profile carries this report (``quality`` in the JSON) and the command
prints it. The verdict is one of

- ``good``: every layer that matters measured steadily and stage-sized ranges
  agree with the sum of their layers;
- ``noisy``: some layers' rounds spread widely or the profiler did not get a
  whole CPU: the machine was busy, and the message says how to rerun;
- ``inconsistent``: layers measured steadily, but stage-sized ranges take
  noticeably longer or shorter than their layers' sum (layers interact when
  run together), so multi-layer stages will be mispredicted by about that much;
- ``unjudged``: too few rounds to tell.

A layer *matters* when it holds at least ``material`` of the model's total
time: the noise of a 0.01 ms embedding says nothing about the machine.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from umsearch.core.profile import LayerProfile
from umsearch.measure.curves import relative_spread

NAMES = {"fwd": "forward", "bwd": "backward", "bwd_input": "input-gradient", "bwd_weight": "weight-gradient"}
"""Human names of the quantities."""

JUDGED = ("fwd", "bwd")
"""Quantities whose spread decides the verdict (every plan uses them)."""


@dataclass(frozen=True, kw_only=True)
class Thresholds:
    """Limits of a trustworthy profile."""

    spread: float = 0.10
    """Largest relative spread (IQR over median, time-weighted over sizes) of a steady layer."""
    calibration: float = 0.15
    """Largest relative error of a stage-sized range against the sum of its layers."""
    cpu_share: float = 0.90
    """Smallest share of one CPU the (single-threaded) profiler must get in a round."""
    material: float = 0.01
    """Share of the model's total time from which a layer's noise counts."""
    min_rounds: int = 5
    """Fewest rounds for a meaningful spread."""
    target_error: float = 0.02
    """Standard error of a median the suggested ``--repeats`` aims at."""


def suggested_repeats(spread: float, rounds: int, t: Thresholds) -> int:
    """An odd round count that brings a median with this spread near ``t.target_error``.

    The standard error of a median of n normal samples is about ``0.93 * IQR / sqrt(n)``;
    the suggestion at least doubles ``rounds`` and stays at most ``max(31, 2 * rounds + 1)``.
    """
    need = math.ceil((0.93 * spread / t.target_error) ** 2)
    lo = 2 * rounds + 1
    n = max(lo, min(need, max(31, lo)))
    return n if n % 2 else n + 1


def _layer_rows(layers: Sequence[LayerProfile], groups: Sequence[Sequence[int]]) -> list[dict[str, Any]]:
    group_of = {i: g for g, members in enumerate(groups) for i in members}
    totals = [sum(lay.fwd_ms) + sum(lay.bwd_ms) for lay in layers]
    whole = sum(totals)
    rows = []
    for i, lay in enumerate(layers):
        spread = {q: relative_spread(lay.spread_ms[q], lay.raw_ms.get(q, ())) for q in lay.spread_ms}
        raw_total = sum(sum(lay.raw_ms.get(q, ())) for q in JUDGED)
        change = sum(abs(f - r) for q in JUDGED for f, r in zip(lay.times(q) or (), lay.raw_ms.get(q, ()), strict=False))
        rows.append({"layer": i, "name": lay.name, "group": group_of.get(i, i),
                     "share": totals[i] / whole if whole > 0 else 0.0, "spread": spread,
                     "fit_change": change / raw_total if raw_total > 0 else 0.0})  # fmt: skip
    return rows


def _calibration(calibration: Sequence[dict[str, Any]], t: Thresholds) -> dict[str, Any]:
    errors = [float(c["error"]) for c in calibration]
    worst = max(errors, key=abs) if errors else 0.0
    return {"ranges": len(errors), "worst_error": worst, "limit": t.calibration, "ok": abs(worst) <= t.calibration}


def _noise(rows: Sequence[dict[str, Any]], t: Thresholds) -> tuple[list[str], float]:
    """Phrases like "forward spread 40% on 6 layers", and the worst spread among them."""
    phrases, worst = [], 0.0
    for q in JUDGED:
        noisy = [r["spread"].get(q, 0.0) for r in rows if r["share"] >= t.material and r["spread"].get(q, 0.0) > t.spread]
        if noisy:
            phrases.append(f"{NAMES[q]} spread {max(noisy):.0%} on {len(noisy)} layer{'s' if len(noisy) > 1 else ''}")
            worst = max(worst, *noisy)
    return phrases, worst


def _steady(rows: Sequence[dict[str, Any]], t: Thresholds) -> str:
    parts = [f"{NAMES[q]} {max((r['spread'].get(q, 0.0) for r in rows if r['share'] >= t.material), default=0.0):.0%}"
             for q in JUDGED]  # fmt: skip
    return "spread at most " + " and ".join(parts)


def verdict(
    rows: Sequence[dict[str, Any]], calibration: dict[str, Any], *, rounds: int, cpu_share: float | None,
    t: Thresholds, gpu: bool = False,
) -> tuple[str, str]:  # fmt: skip
    """``(verdict, message)`` for the layer rows of :func:`assess`; the message says what to do
    (``gpu``: the layers ran on a GPU, whose noise is not the host's load)."""
    phrases, worst = _noise(rows, t)
    if cpu_share is not None and cpu_share < t.cpu_share:
        phrases.append(f"the profiler got only {cpu_share:.0%} of a CPU")
        worst = max(worst, t.spread * 2)
    cal = calibration["worst_error"]
    cal_text = f"stage-sized ranges took {cal:+.0%} against the sum of their layers"
    if phrases:
        repeats = suggested_repeats(worst, rounds, t)
        if gpu:
            # A GPU's times do not depend on the host's load once calls are queued back to back; what
            # moves them is another process on the GPU or its clocks.
            also = "" if calibration["ok"] else f"; {cal_text}"
            return "noisy", (f"{', '.join(phrases)} on the GPU: another process may share it or its clocks "
                             f"changed (see nvidia-smi); rerun with --repeats {repeats} on an otherwise idle GPU"
                             f"{also}")  # fmt: skip
        if cpu_share is not None and cpu_share >= t.cpu_share:
            # The profiler had the CPU: the spread is the layers' own (caches, the allocator, what ran
            # before them), not load; it does not shrink with rounds, only the medians' error does.
            error = 0.93 * worst / math.sqrt(max(rounds, 1))
            also = "" if calibration["ok"] else f"; {cal_text}"
            return "noisy", (f"{', '.join(phrases)} although the profiler had {cpu_share:.0%} of a CPU: the layers "
                             f"vary by themselves (caches, allocator, what ran before them), not from load; each "
                             f"median is good to about {error:.0%}, --repeats {repeats} narrows that{also}")  # fmt: skip
        rerun = f"rerun with --repeats {repeats} or on an idle machine"
        also = "" if calibration["ok"] else f" ({cal_text}, likely the same noise)"
        return "noisy", f"{', '.join(phrases)}: the machine is busy; {rerun}{also}"
    if rounds < t.min_rounds:
        return "unjudged", (f"{rounds} round{'s' if rounds > 1 else ''} are too few to measure a spread; "
                            f"rerun with --repeats {max(t.min_rounds, 15)}")  # fmt: skip
    if not calibration["ok"]:
        return "inconsistent", (
            f"layers measured steadily ({_steady(rows, t)}), but {cal_text}: layers interact when run "
            f"together (per-call overhead, caches, allocator), so stages of several layers will be mispredicted by about "
            f"{abs(cal):.0%}; profile on an idle machine to rule out load, or accept that margin"
        )
    cal_ok = f", stage-sized ranges within {abs(cal):.0%} of their layers' sum" if calibration["ranges"] else ""
    return "good", f"{_steady(rows, t)} on every layer that matters{cal_ok}: the profile can be trusted"


def assess(
    layers: Sequence[LayerProfile], *, groups: Sequence[Sequence[int]], calibration: Sequence[dict[str, Any]],
    rounds: int, cpu_share: float | None, thresholds: Thresholds | None = None, device_type: str = "cpu",
) -> dict[str, Any]:  # fmt: skip
    """The quality report (JSON-ready) of measured layers.

    ``groups``: the layer groups measured together (singletons included); ``calibration``: the
    stage-sized range checks (each with its relative ``error``); ``cpu_share``: the median share of
    a CPU the profiler got per round, or None when it cannot be judged (several threads, a GPU);
    ``device_type``: where the layers ran (a GPU's noise is judged as the GPU's, not the host's load).
    """
    t = thresholds or Thresholds()
    rows = _layer_rows(layers, groups)
    cal = _calibration(calibration, t)
    word, message = verdict(rows, cal, rounds=rounds, cpu_share=cpu_share, t=t, gpu=device_type == "cuda")
    return {"verdict": word, "message": message, "rounds": rounds, "cpu_share": cpu_share,
            "pooled": [list(g) for g in groups if len(g) > 1], "calibration": cal, "layers": rows,
            "thresholds": asdict(t)}  # fmt: skip
