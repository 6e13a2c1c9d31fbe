"""Rich tables of a plan and its simulated cost, compact enough for an 80-column terminal.

Microbatch lists are the long part of a plan: a table shows them run-length
compressed (``8x4 2 6``) when that fits its column, else as a one-line
summary (``24 mb, 2..16: 2 4 8 .. 16 8``); ``report.md`` has them in full.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.table import Table

from umsearch.core.plan import Plan
from umsearch.core.units import format_bytes
from umsearch.sim.result import SimResult


def run_length(sizes: Sequence[int]) -> str:
    """``[8, 8, 8, 2, 6]`` as ``8x3 2 6``."""
    runs: list[tuple[int, int]] = []
    for v in sizes:
        if runs and runs[-1][0] == v:
            runs[-1] = (v, runs[-1][1] + 1)
        else:
            runs.append((v, 1))
    return " ".join(f"{v}x{n}" if n > 1 else str(v) for v, n in runs)


def format_sizes(sizes: Sequence[int], width: int = 24) -> str:
    """The list run-length compressed if that fits in ``width`` characters, else a summary that does:
    count, smallest..largest, and the first and last runs."""
    full = run_length(sizes)
    if len(full) <= width:
        return full
    head = f"{len(sizes)} mb, {min(sizes)}..{max(sizes)}"
    runs = full.split(" ")
    for keep in range(min(3, len(runs) - 1), 0, -1):
        text = f"{head}: {' '.join(runs[:keep])} .. {runs[-1]}"
        if len(text) <= width:
            return text
    return head


def _list_width(console_width: int, fixed: int) -> int:
    """Characters left per microbatch-list column (two of them) once the fixed columns are placed."""
    return max(12, (console_width - fixed) // 2)


def stage_table(plan: Plan, result: SimResult | None, layer_names: Sequence[str] | None = None,
                width: int = 80) -> Table:  # fmt: skip
    """One row per stage: rank, layers, forward and backward lists, split/recompute, busy time."""
    busy = [0.0] * plan.num_stages
    if result is not None:
        for a in result.records:
            busy[a.stage] += a.end_ms - a.start_ms
    table = Table(title="stages", title_justify="left", pad_edge=False)
    names = bool(layer_names) and width >= 120
    lw = _list_width(width, 52 + (24 if names else 0))
    for col in ("stage", "rank", "layers", "forward", "backward", "how", "busy ms"):
        table.add_column(col, justify="right" if col in ("stage", "rank", "busy ms") else "left", no_wrap=True,
                         overflow="ellipsis")  # fmt: skip
    for j, st in enumerate(plan.stages):
        layers = f"{st.lo}-{st.hi - 1}"
        if names and layer_names:
            layers += f" {layer_names[st.lo]}..{layer_names[st.hi - 1]}"
        how = ("R" if st.recompute else "") + ("IW" if plan.uses_split[j] else "")
        back = "same" if st.backward == st.forward else format_sizes(st.backward, lw)
        table.add_row(str(j), str(st.rank), layers, format_sizes(st.forward, lw), back, how or "-",
                      f"{busy[j]:.2f}" if result is not None else "-")  # fmt: skip
    table.caption = "how: R recompute, IW split I/W; 8x3: size x count"
    table.caption_justify = "left"
    return table


def rank_table(plan: Plan, result: SimResult) -> Table:
    """One row per rank: its stages, actions, busy time, idle share and peak memory."""
    table = Table(title="ranks", title_justify="left", pad_edge=False)
    for col in ("rank", "stages", "actions", "busy ms", "idle", "peak memory"):
        table.add_column(col, justify="left" if col == "stages" else "right", no_wrap=True)
    for r in range(plan.ranks):
        idle = result.rank_bubble(r)
        table.add_row(
            str(r), ",".join(map(str, plan.stages_of(r))), str(len(plan.actions[r])),
            "-" if result.busy_ms is None else f"{result.busy_ms[r]:.2f}",
            "-" if idle is None else f"{idle:.1%}",
            "-" if result.peak_memory_bytes is None else format_bytes(result.peak_memory_bytes[r]),
        )  # fmt: skip
    return table


def plan_tables(plan: Plan, result: SimResult | None, layer_names: Sequence[str] | None = None,
                width: int = 80) -> list[Table]:  # fmt: skip
    """The stage table, and the rank table when there is a simulation to fill it."""
    tables = [stage_table(plan, result, layer_names, width)]
    if result is not None:
        tables.append(rank_table(plan, result))
    return tables
