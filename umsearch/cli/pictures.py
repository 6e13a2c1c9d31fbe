"""Pictures of a plan: a Gantt chart (PNG), a Chrome trace (Perfetto) and the Pareto front.

Predicted timelines (from the simulator) and measured ones (from the runtime)
go through the same functions, so they can be compared side by side.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol

from umsearch.core.jsonio import write_bytes_atomic, write_json

TRACE_SCHEMA = "umsearch.trace/1"
_FWD_COLOR = "#4C72B0"
_BWD_COLOR = "#DD8452"


class OpLike(Protocol):
    """What a timeline needs of an op; :class:`umsearch.sim.reference.OpRecord` is one."""

    @property
    def stage(self) -> int: ...
    @property
    def kind(self) -> str: ...
    @property
    def index(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def start_ms(self) -> float: ...
    @property
    def end_ms(self) -> float: ...


def chrome_trace_events(ops: Iterable[OpLike], *, source: str = "predicted") -> list[dict[str, Any]]:
    """Complete ('X') events, one row (tid) per stage, times in microseconds."""
    events: list[dict[str, Any]] = []
    stages: set[int] = set()
    for op in ops:
        stages.add(op.stage)
        name = f"{'forward' if op.kind == 'F' else 'backward'} {op.index} [{op.size}]"
        events.append({
            "name": name, "cat": op.kind, "ph": "X", "pid": 0, "tid": op.stage,
            "ts": op.start_ms * 1e3, "dur": (op.end_ms - op.start_ms) * 1e3,
            "args": {"kind": op.kind, "index": op.index, "size": op.size},
        })  # fmt: skip
    meta: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": 0, "args": {"name": f"umsearch ({source})"}}
    ]
    meta += [
        {"name": "thread_name", "ph": "M", "pid": 0, "tid": s, "args": {"name": f"stage {s}"}}
        for s in sorted(stages)
    ]
    return meta + events


def write_chrome_trace(
    ops: Iterable[OpLike], path: str | os.PathLike[str], *, source: str = "predicted",
    metadata: dict[str, Any] | None = None,
) -> Path:  # fmt: skip
    """Write a Chrome-trace JSON that chrome://tracing and Perfetto open."""
    doc = {
        "schema": TRACE_SCHEMA,
        "traceEvents": chrome_trace_events(ops, source=source),
        "displayTimeUnit": "ms",
        "metadata": {"source": source, **(metadata or {})},
    }
    return write_json(path, doc)


def _figure_bytes(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120, bbox_inches="tight")
    return buf.getvalue()


def write_gantt(
    ops: Sequence[OpLike], num_stages: int, path: str | os.PathLike[str], *, title: str = ""
) -> Path:
    """One row per stage, forward blue and backward orange, each box labelled with its size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    end = max((op.end_ms for op in ops), default=1.0)
    fig, ax = plt.subplots(figsize=(min(22.0, 6 + 0.12 * len(ops) / max(num_stages, 1)), 0.6 * num_stages + 1.6))
    for op in ops:
        color = _FWD_COLOR if op.kind == "F" else _BWD_COLOR
        width = op.end_ms - op.start_ms
        ax.broken_barh([(op.start_ms, width)], (op.stage - 0.4, 0.8), facecolors=color, edgecolors="white", linewidth=0.5)
        if width > end / 120:
            ax.text(op.start_ms + width / 2, op.stage, str(op.size), ha="center", va="center", fontsize=7, color="white")
    ax.set_yticks(range(num_stages), [f"stage {s}" for s in range(num_stages)])
    ax.invert_yaxis()
    ax.set_xlim(0, end * 1.01)
    ax.set_xlabel("time (ms)")
    ax.set_title(title or f"pipeline timeline: {end:.2f} ms")
    ax.legend(handles=[Patch(color=_FWD_COLOR, label="forward"), Patch(color=_BWD_COLOR, label="backward")],
              loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)  # fmt: skip
    ax.grid(axis="x", alpha=0.3)
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
    markers = iter("s^vD<>Pp*")
    for name, (t, m) in baselines.items():
        ax.scatter([t], [m / gib], marker=next(markers, "x"), s=60, label=name, zorder=3)
    if chosen is not None:
        ax.scatter([chosen[0]], [chosen[1] / gib], marker="*", s=220, color="gold", edgecolors="black", label="chosen plan", zorder=4)
    if memory_limit is not None:
        ax.axhline(memory_limit / gib, color="red", linestyle="--", linewidth=1, label="memory limit")
    ax.set_xlabel("iteration time (ms)")
    ax.set_ylabel("peak memory of the fullest stage (GiB)")
    ax.set_title(title or "time vs memory")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    data = _figure_bytes(fig)
    plt.close(fig)
    return write_bytes_atomic(path, data)
