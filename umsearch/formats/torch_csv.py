"""Action lists to and from torch.distributed.pipelining's compute-only CSV schedule.

torch's ``_PipelineScheduleRuntime`` (2.13) can run any schedule given as a
CSV file: ``schedule._load_csv(path, format="compute_only")``. Its loader reads
the file with :mod:`csv`; row r is rank r's list, in order, and each cell is
one action in torch's notation, which is also umsearch's (``2F0``, ``1B3``,
``0I1``, ``0W1``; see :mod:`umsearch.core.actions`). An empty cell is an
idle step and is skipped. "Compute only" means the file holds no
communication (``SEND_F``, ``RECV_B``, ...) and no ``UNSHARD`` / ``RESHARD`` /
``REDUCE_GRAD`` actions: the loader refuses communication there, and adds
every send, receive and gradient reduction itself when it lowers the
schedule.

After reading, torch validates the whole schedule and refuses (with an
``AssertionError``) a file where: the number of rows differs from the
process group's size; a stage appears on two ranks; a stage does not run
exactly ``n_microbatches`` forwards, or ``B`` plus ``I`` backwards, or as many
``W`` as ``I``; or a ``B`` / ``I`` comes before its microbatch's forward, a
``W`` before its ``I``, anywhere in the rank's row. Its runtime also splits the
batch into ``n_microbatches`` equal chunks, so a umsearch plan with unequal
microbatches has no faithful CSV. :func:`pipelining_csv` refuses (ValueError)
the schedules torch's validation would refuse, so a file it writes loads; it
also refuses an action listed twice, which torch's check (it counts distinct
microbatches) lets through and its runtime would run twice.

Pure Python; torch is not imported.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence

from umsearch.core.actions import Action, parse_action, rank_order_problem
from umsearch.core.plan_rules import RUNS

Seen = dict[tuple[int, str], set[int]]
"""``(stage, kind) -> microbatches``: what the rank lists hold."""


def _started(seen: Seen, stage: int, forward: bool) -> set[int]:
    """The microbatches of ``stage``'s forward (backward) list that begin one of their ways (:data:`RUNS`)."""
    return set().union(*(seen.get((stage, way[0]), set()) for way in RUNS[forward]))


def _unfinished(seen: Seen, stage: int) -> str | None:
    """Where a split backward of ``stage`` is not listed whole: a later kind of a way (``W``) for other
    microbatches than its first (``I``); torch counts them, and needs as many."""
    for way in RUNS[False]:
        first = seen.get((stage, way[0]), set())
        for kind in way[1:]:
            then = seen.get((stage, kind), set())
            if then != first:
                return f"stage {stage} has {kind} for microbatches {sorted(then)} but {way[0]} for {sorted(first)}"
    return None


def _refusal(actions: Sequence[Sequence[Action]]) -> str | None:
    """Why torch's schedule validation would refuse these rank lists, or None."""
    if len(actions) == 0:
        return "there are no ranks; torch needs one row per rank of the process group"
    owner: dict[int, int] = {}
    seen: Seen = {}
    for r, row in enumerate(actions):
        for pos, a in enumerate(row):
            where = f"rank {r}, action {pos} ({a})"
            if a.stage < 0 or a.mb < 0:
                return f"{where}: stage and microbatch must be >= 0"
            if owner.setdefault(a.stage, r) != r:
                return f"{where}: stage {a.stage} is also on rank {owner[a.stage]}; a stage lives on one rank"
            done = seen.setdefault((a.stage, a.kind), set())
            if a.mb in done:
                return f"{where}: {a} appears twice"
            done.add(a.mb)
        # torch runs equal microbatches: a backward's samples are its forward's of the same index.
        problem = rank_order_problem(row, lambda j, k: (k,))
        if problem is not None:
            pos, why = problem
            return f"rank {r}, action {pos} ({row[pos]}): {why}"
    stages = sorted(owner)
    if stages != list(range(len(stages))):
        missing = sorted(set(range(stages[-1] + 1)) - set(stages))
        return (
            f"stage {missing[0]} has no actions; stages must be 0..{stages[-1]} with none missing"
        )
    empty = [r for r, row in enumerate(actions) if len(row) == 0]
    if empty:
        return f"rank {empty[0]} has no actions; every rank must hold a stage"
    m = len(_started(seen, 0, True))
    for s in stages:
        fwd, bwd = _started(seen, s, True), _started(seen, s, False)
        if fwd != set(range(m)):
            return (
                f"stage {s} runs forwards of microbatches {sorted(fwd)}, but torch needs every "
                f"stage to run microbatches 0..{m - 1} (stage 0's count) exactly once"
            )
        if bwd != fwd:
            return f"stage {s} runs backwards of microbatches {sorted(bwd)}; it must be 0..{m - 1}"
        unfinished = _unfinished(seen, s)
        if unfinished is not None:
            return unfinished
    return None


def pipelining_csv(actions: Sequence[Sequence[Action]]) -> str:
    """The compute-only CSV of these rank lists, as torch's ``_PipelineScheduleRuntime`` loads it.

    One line per rank, rank 0 first; on each line the rank's actions in order,
    comma-separated, written ``{stage}{kind}{microbatch}`` with no quoting or
    spaces; lines end with ``\\n`` (torch's :mod:`csv` reader takes any line
    ending). Raises ValueError, naming the first offending action, on lists
    torch's loader would refuse (see the module docstring); the schedule's
    ``n_microbatches`` must then equal each stage's microbatch count.
    """
    reason = _refusal(actions)
    if reason is not None:
        raise ValueError(f"torch.distributed.pipelining would refuse this schedule: {reason}")
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    for row in actions:
        writer.writerow([str(a) for a in row])
    return buf.getvalue()


def parse_pipelining_csv(text: str) -> tuple[tuple[Action, ...], ...]:
    """Rank lists from a compute-only CSV (the inverse of :func:`pipelining_csv`).

    Reads the file as torch's loader does: every CSV row is a rank, empty
    cells (torch's idle steps, as its own ``_dump_csv`` writes them) are
    skipped, and surrounding spaces are ignored. Raises ValueError on a cell
    that is not a compute action (``SEND_F``, ``RESHARD`` and other
    communication or sharding actions belong to torch's ``compute_comms``
    format, not this one). The rank lists are not validated; pass them to
    the plan validation for that.
    """
    out: list[tuple[Action, ...]] = []
    for r, row in enumerate(csv.reader(io.StringIO(text))):
        acts: list[Action] = []
        for col, cell in enumerate(row):
            if cell.strip() == "":
                continue
            try:
                acts.append(parse_action(cell))
            except ValueError:
                raise ValueError(
                    f"row {r} (rank {r}), column {col}: {cell.strip()!r} is not a compute action; "
                    "a compute-only schedule holds only actions like '2F0', '1B3', '0I1', '0W1'"
                ) from None
        out.append(tuple(acts))
    return tuple(out)
