"""Pictures of a plan: a Gantt chart (PNG), a Chrome trace (Perfetto) and the Pareto front.

Predicted timelines (from the simulator) and measured ones (from the runtime)
go through the same functions, so they can be compared side by side. A plan
with data-parallel replicas (docs/model.md section 9) is drawn as its slowest
replica, each rank's gradient all-reduces in a thin lane under its actions.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol

from umsearch.core.actions import KINDS
from umsearch.storage.jsonio import write_bytes_atomic, write_json

TRACE_SCHEMA = "umsearch.trace/2"
_KIND_NAMES = {"F": "forward", "B": "backward", "I": "input-grad", "W": "weight-grad"}
# One hue per stage (tab10-like, colour-blind friendly enough); the kind sets the shade and hatch.
_STAGE_COLORS = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C",
                 "#CCB974", "#64B5CD")  # fmt: skip
_FWD_COLOR = _STAGE_COLORS[0]


class RecordLike(Protocol):
    """What a timeline needs of an action; :class:`umsearch.core.actions.ActionRecord` is one."""

    @property
    def rank(self) -> int: ...
    @property
    def stage(self) -> int: ...
    @property
    def kind(self) -> str: ...
    @property
    def mb(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def start_ms(self) -> float: ...
    @property
    def end_ms(self) -> float: ...


class SpanLike(Protocol):
    """What the all-reduce lane needs of a stage's all-reduce; :class:`umsearch.sim.result.AllReduceSpan` is one."""

    @property
    def rank(self) -> int: ...
    @property
    def stage(self) -> int: ...
    @property
    def start_ms(self) -> float: ...
    @property
    def end_ms(self) -> float: ...


ALLREDUCE_TID = 1000
"""Chrome-trace thread of rank r's all-reduce lane: ``ALLREDUCE_TID + r`` (apart from the ranks' own rows)."""


def chrome_trace_events(records: Iterable[RecordLike], *, source: str = "predicted",
                        allreduces: Sequence[SpanLike] = ()) -> list[dict[str, Any]]:  # fmt: skip
    """Complete ('X') events, one row (tid) per rank, named like torch's actions (``2F0``), times in us;
    with ``allreduces`` (a data-parallel plan, docs/model.md 9) each rank's all-reduces in a row of their own."""
    events: list[dict[str, Any]] = []
    ranks: set[int] = set()
    for a in records:
        ranks.add(a.rank)
        events.append({
            "name": f"{a.stage}{a.kind}{a.mb} [{a.size}]", "cat": _KIND_NAMES.get(a.kind, a.kind), "ph": "X",
            "pid": 0, "tid": a.rank, "ts": a.start_ms * 1e3, "dur": (a.end_ms - a.start_ms) * 1e3,
            "args": {"stage": a.stage, "kind": a.kind, "mb": a.mb, "size": a.size},
        })  # fmt: skip
    lanes = {s.rank for s in allreduces}
    for s in allreduces:
        events.append({"name": f"all-reduce stage {s.stage}", "cat": "all-reduce", "ph": "X", "pid": 0,
                       "tid": ALLREDUCE_TID + s.rank, "ts": s.start_ms * 1e3, "dur": (s.end_ms - s.start_ms) * 1e3,
                       "args": {"stage": s.stage, "rank": s.rank}})  # fmt: skip
    meta: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": 0, "args": {"name": f"umsearch ({source})"}}
    ]
    meta += [{"name": "thread_name", "ph": "M", "pid": 0, "tid": r, "args": {"name": f"rank {r}"}}
             for r in sorted(ranks)]  # fmt: skip
    meta += [{"name": "thread_name", "ph": "M", "pid": 0, "tid": ALLREDUCE_TID + r,
              "args": {"name": f"rank {r} all-reduce"}} for r in sorted(lanes)]  # fmt: skip
    order: list[int] = []  # each lane right under its rank, not after every rank
    for r in sorted(ranks | lanes):
        order += ([r] if r in ranks else []) + ([ALLREDUCE_TID + r] if r in lanes else [])
    meta += [{"name": "thread_sort_index", "ph": "M", "pid": 0, "tid": t, "args": {"sort_index": i}}
             for i, t in enumerate(order)]  # fmt: skip
    return meta + events


def write_chrome_trace(
    records: Iterable[RecordLike], path: str | os.PathLike[str], *, source: str = "predicted",
    metadata: dict[str, Any] | None = None, allreduces: Sequence[SpanLike] = (),
) -> Path:  # fmt: skip
    """Write a Chrome-trace JSON that chrome://tracing and Perfetto open (with the all-reduce lanes of
    a data-parallel plan when given)."""
    doc = {
        "schema": TRACE_SCHEMA,
        "traceEvents": chrome_trace_events(records, source=source, allreduces=allreduces),
        "displayTimeUnit": "ms",
        "metadata": {"source": source, **(metadata or {})},
    }
    return write_json(path, doc)


def _figure_bytes(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120, bbox_inches="tight")
    return buf.getvalue()


def _stage_color(stage: int, stages: int) -> tuple[float, float, float]:
    """A distinct hue per stage: the ten base colours, else hues spread over a continuous colormap
    (tab20's light halves would read as the lighter shades of backward actions)."""
    from matplotlib import colormaps
    from matplotlib.colors import to_rgb

    if stages <= len(_STAGE_COLORS):
        return to_rgb(_STAGE_COLORS[stage])
    return to_rgb(colormaps["turbo"](0.05 + 0.9 * stage / (stages - 1)))


_LIGHTEN = {"F": 0.0, "B": 0.35, "I": 0.35, "W": 0.6}
"""How much lighter than its stage's hue each kind's box is."""


def _style(stage: int, kind: str, stages: int) -> dict[str, Any]:
    """Box style: the stage's hue; backward parts lighter, I hatched, W paler still and cross-hatched."""
    base = _stage_color(stage, stages)
    lighten = _LIGHTEN.get(kind, 0.0)
    color = tuple(c + (1 - c) * lighten for c in base)
    return {"facecolors": color, "hatch": {"I": "///", "W": "xx"}.get(kind), "edgecolors": "white", "linewidth": 0.5}


_LANE = (0.22, 0.2)
"""Offset below a rank's centre and height of its all-reduce lane."""


def _draw_allreduces(ax: Any, spans: Sequence[SpanLike], stages: int) -> None:
    """Each rank's all-reduces in a thin lane under its row, in their stage's hue, dotted; one
    collection per stage."""
    lanes: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for s in spans:
        lanes.setdefault((s.rank, s.stage), []).append((s.start_ms, s.end_ms - s.start_ms))
    for (rank, stage), boxes in lanes.items():
        ax.broken_barh(boxes, (rank + _LANE[0], _LANE[1]), facecolors=_stage_color(stage, stages), hatch="..",
                       edgecolors="white", linewidth=0.5)  # fmt: skip


def _draw_gantt(ax: Any, records: Sequence[RecordLike], ranks: int, title: str, end: float | None = None,
                allreduces: Sequence[SpanLike] = ()) -> None:  # fmt: skip
    """One row per rank on ``ax``; a colour per stage, forward dark, backward light, I hatched, W
    cross-hatched; each wide enough box is labelled with its action (``2F0``) and, wider still, its size.
    With ``allreduces``, each rank's row is narrower and its all-reduces run in a lane under it."""
    from matplotlib.patches import Patch

    end = end or max([a.end_ms for a in records] + [s.end_ms for s in allreduces], default=1.0)
    stages = max([a.stage for a in records] + [s.stage for s in allreduces], default=0) + 1
    # Without all-reduces a row is 0.8 high around the rank; with them 0.6 high, raised above the lane.
    row_lo, row_h = (-0.4, 0.8) if not allreduces else (-0.42, 0.6)
    mid = row_lo + row_h / 2
    boxes: dict[tuple[int, int, str], list[tuple[float, float]]] = {}
    for a in records:  # one collection per (rank, stage, kind): thousands of actions draw in one go
        boxes.setdefault((a.rank, a.stage, a.kind), []).append((a.start_ms, a.end_ms - a.start_ms))
    for (rank, stage, kind), spans in boxes.items():
        ax.broken_barh(spans, (rank + row_lo, row_h), **_style(stage, kind, stages))
    _draw_allreduces(ax, allreduces, stages)
    for a in records:
        width = a.end_ms - a.start_ms
        if width > end / 60:  # stage, kind and microbatch (torch's notation) over the microbatch's size
            label = f"{a.stage}{a.kind}{a.mb}\n{a.size}" if width > end / 40 else f"{a.stage}{a.kind}{a.mb}"
            ax.text(a.start_ms + width / 2, a.rank + mid, label, ha="center", va="center", fontsize=6,
                    color="black" if _LIGHTEN.get(a.kind, 0.0) else "white", linespacing=0.9)  # fmt: skip
    ax.set_yticks([r + mid for r in range(ranks)], [f"rank {r}" for r in range(ranks)])
    ax.set_ylim(ranks - 0.5, -0.5)
    ax.set_xlim(0, end * 1.01)
    ax.set_title(title, fontsize=10)

    def patch(stage: int, kind: str, label: str) -> Patch:
        style = _style(stage, kind, stages)
        return Patch(facecolor=style["facecolors"], hatch=style["hatch"], edgecolor="white", label=label)

    shown = range(stages) if stages <= 16 else sorted({0, stages // 4, stages // 2, 3 * stages // 4, stages - 1})
    handles = [patch(s, "F", f"stage {s}") for s in shown]
    ran = {a.kind for a in records}
    handles += [patch(0, kind, f"{kind}: {_KIND_NAMES[kind]}") for kind in KINDS if kind in ran]
    if allreduces:
        handles.append(Patch(facecolor=_stage_color(0, stages), hatch="..", edgecolor="white",
                             label="all-reduce (lane under each rank)"))  # fmt: skip
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7)
    ax.grid(axis="x", alpha=0.3)


def write_gantt(
    records: Sequence[RecordLike], ranks: int, path: str | os.PathLike[str], *, title: str = "",
    allreduces: Sequence[SpanLike] = (),
) -> Path:  # fmt: skip
    """The timeline of one plan (one replica's) as a PNG, with its all-reduce lanes when given (see
    :func:`_draw_gantt`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    end = max([a.end_ms for a in records] + [s.end_ms for s in allreduces], default=1.0)
    per_rank = len(records) / max(ranks, 1)
    fig, ax = plt.subplots(figsize=(min(22.0, 6 + 0.12 * per_rank), (0.75 if allreduces else 0.6) * ranks + 1.8))
    _draw_gantt(ax, records, ranks, title or f"pipeline timeline: {end:.2f} ms", allreduces=allreduces)
    ax.set_xlabel("time (ms)")
    data = _figure_bytes(fig)
    plt.close(fig)
    return write_bytes_atomic(path, data)


def write_gantts(timelines: Sequence[tuple[str, Sequence[RecordLike], int]], path: str | os.PathLike[str]) -> Path:
    """Several plans' timelines, one panel each on a shared time axis: ``(title, records, ranks)``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    end = max((a.end_ms for _, recs, _ in timelines for a in recs), default=1.0)
    heights = [0.5 * ranks + 0.9 for _, _, ranks in timelines]
    per_rank = max(len(recs) / max(ranks, 1) for _, recs, ranks in timelines)
    fig, axes = plt.subplots(len(timelines), 1, figsize=(min(22.0, 6 + 0.12 * per_rank), sum(heights) + 0.6),
                             gridspec_kw={"height_ratios": heights}, squeeze=False, sharex=True)  # fmt: skip
    for ax, (title, recs, ranks) in zip(axes[:, 0], timelines, strict=True):
        _draw_gantt(ax, recs, ranks, title, end)
    axes[-1, 0].set_xlabel("time (ms)")
    data = _figure_bytes(fig)
    plt.close(fig)
    return write_bytes_atomic(path, data)


def write_pareto(
    front: Sequence[tuple[float, float]],
    baselines: dict[str, tuple[float, float]],
    path: str | os.PathLike[str],
    *,
    memory_limit: float | None = None,
    chosen: tuple[float, float] | None = None,
    title: str = "",
) -> Path:
    """Iteration time vs peak memory: the non-dominated plans, the baselines and the limit."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gib = float(2**30)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    if front:
        pts = sorted(front)
        ax.plot([p[0] for p in pts], [p[1] / gib for p in pts], "o-", color=_FWD_COLOR, label="umsearch Pareto front")
        for i, (t, m) in enumerate(front):  # the index --pick takes
            ax.annotate(f"#{i}", (t, m / gib), textcoords="offset points", xytext=(-4, -11), fontsize=7,
                        color=_FWD_COLOR)  # fmt: skip
    markers = iter("s^vD<>Pp*")
    for name, (t, m) in baselines.items():
        ax.scatter([t], [m / gib], marker=next(markers, "x"), s=60, label=name, zorder=3)
    if chosen is not None:
        ax.scatter([chosen[0]], [chosen[1] / gib], marker="*", s=220, color="gold", edgecolors="black", label="chosen plan", zorder=4)
    for name, (t, m) in baselines.items():
        ax.annotate(name, (t, m / gib), textcoords="offset points", xytext=(4, 4), fontsize=7)
    title = title or "time vs memory"
    if memory_limit is not None and (front or baselines):
        top = max([m for _, m in front] + [m for _, m in baselines.values()])
        if memory_limit <= 4 * top:
            ax.axhline(memory_limit / gib, color="red", linestyle="--", linewidth=1,
                       label=f"memory limit {memory_limit / gib:.3g} GiB")
        else:  # drawn, a limit far above every plan would squash them all onto the axis
            title += f" (memory limit {memory_limit / gib:.3g} GiB, far above)"
    ax.set_xlabel("iteration time (ms)")
    ax.set_ylabel("peak memory of the fullest rank (GiB)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    data = _figure_bytes(fig)
    plt.close(fig)
    return write_bytes_atomic(path, data)
