"""Rich tables of plans and their simulated cost."""

from __future__ import annotations

from collections.abc import Sequence

from rich.table import Table

from umsearch.core.plan import Plan
from umsearch.sim.reference import SimResult


def format_bytes(n: float) -> str:
    """Human-readable binary size (``1.50 GiB``)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def format_sizes(sizes: Sequence[int], limit: int = 12) -> str:
    """Microbatch list, run-length compressed: ``[8x4, 2, 6]``."""
    runs: list[tuple[int, int]] = []
    for v in sizes:
        if runs and runs[-1][0] == v:
            runs[-1] = (v, runs[-1][1] + 1)
        else:
            runs.append((v, 1))
    parts = [f"{v}x{n}" if n > 1 else str(v) for v, n in runs]
    if len(parts) > limit:
        parts = parts[: limit - 1] + [f"... ({len(sizes)} total)"]
    return "[" + ", ".join(parts) + "]"


def stage_table(plan: Plan, result: SimResult, layer_names: Sequence[str] | None = None) -> Table:
    """One row per stage: layers, microbatches, busy time, bubble, peak memory."""
    table = Table(title="stages", title_justify="left")
    for col in ("stage", "layers", "forward", "backward", "warmup", "busy ms", "bubble", "peak memory"):
        table.add_column(col, justify="right" if col in ("busy ms", "bubble", "peak memory", "warmup") else "left")
    for s, st in enumerate(plan.stages):
        layers = f"[{st.lo}, {st.hi})"
        if layer_names:
            layers += f" {layer_names[st.lo]}..{layer_names[st.hi - 1]}"
        bubble = result.stage_bubble(s)
        table.add_row(
            str(s),
            layers,
            format_sizes(st.forward),
            format_sizes(st.backward) + (" (recompute)" if st.recompute else ""),
            str(st.warmup),
            f"{result.busy_ms[s]:.3f}",
            "-" if bubble is None else f"{bubble:.1%}",
            format_bytes(result.peak_memory_bytes[s]),
        )
    return table
