"""Export to torch.distributed.pipelining's compute-only CSV: format, round trip, and a real gloo run."""

from __future__ import annotations

import copy
import os
import socket
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from umsearch.core.actions import Action, parse_actions
from umsearch.core.schedules import (
    PEER_SCHEDULES,
    RankActions,
    interleaved_1f1b,
    interleaved_zero_bubble,
    one_f_one_b,
    placement,
    warmup_rule,
    zbv_zero_bubble,
)
from umsearch.formats.torch_csv import parse_pipelining_csv, pipelining_csv


def test_format() -> None:
    # One line per rank, comma-separated actions in torch's notation, no spaces or quotes.
    assert pipelining_csv(one_f_one_b(2, 2)) == "0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n"


def test_parse_reads_torch_dumps() -> None:
    # torch's _dump_csv writes idle steps as empty cells and ends lines with \r\n.
    text = "0F0,0F1,,0B0,0B1\r\n,1F0, 1B0 ,1F1,1B1\r\n"
    assert parse_pipelining_csv(text) == (
        parse_actions("0F0 0F1 0B0 0B1"),
        parse_actions("1F0 1B0 1F1 1B1"),
    )


def test_parse_refuses_communication() -> None:
    with pytest.raises(
        ValueError, match=r"row 1 \(rank 1\), column 1: '1SEND_F0' is not a compute"
    ):
        parse_pipelining_csv("0F0,0B0\n1F0,1SEND_F0\n")


@settings(max_examples=100, deadline=None)
@given(
    name=st.sampled_from(sorted(PEER_SCHEDULES)),
    ranks=st.integers(1, 5),
    v=st.integers(1, 3),
    m=st.integers(1, 12),
)
def test_round_trip_peer_schedules(name: str, ranks: int, v: int, m: int) -> None:
    sched = PEER_SCHEDULES[name]
    if sched.accepts(ranks, v, m) is not None:
        return
    actions = sched.generate(ranks, v, m)
    assert parse_pipelining_csv(pipelining_csv(actions)) == actions


def test_round_trip_custom_order() -> None:
    # Any valid order with equal microbatch counts exports, not only the peer schedules.
    actions = (
        parse_actions("0F0 2F0 0F1 2B0 2F1 0B0 2I1 2W1 0B1"),
        parse_actions("1F0 3F0 3I0 1F1 3F1 3B1 1B0 3W0 1B1"),
    )
    assert parse_pipelining_csv(pipelining_csv(actions)) == actions
    # Unequal microbatches (warmup rule) export too, as long as the counts agree.
    uneven = (warmup_rule(0, [1, 3], [2, 2], 1), warmup_rule(1, [2, 2], [4], 2))
    with pytest.raises(ValueError, match="stage 1 runs backwards of microbatches"):
        pipelining_csv(uneven)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", "no ranks"),
        ("0F0 0B0 | 0F1 0B1", "stage 0 is also on rank 0"),
        ("0F0 0B0 0F0", "0F0 appears twice"),
        ("0B0 0F0", "0B0 comes before 0F0"),
        ("0F0 0W0 0I0", "0W0 comes before 0I0"),
        ("0F0 0I0 0B0 0W0", "has both a B and an I"),
        ("0F0 0B0 | 2F0 2B0", "stage 1 has no actions"),
        ("0F0 0B0 1F0 1B0 | ", "rank 1 has no actions"),
        ("0F0 0F1 0B0 0B1 | 1F0 1B0", "stage 1 runs forwards of microbatches [0]"),
        ("0F0 0I0", "W for microbatches [] but I for [0]"),
    ],
)
def test_export_refuses_what_torch_refuses(text: str, words: str) -> None:
    rows = tuple(parse_actions(part) for part in text.split("|")) if text else ()
    with pytest.raises(ValueError, match="would refuse") as err:
        pipelining_csv(rows)
    assert words in str(err.value)


# ---------------------------------------------------------------------------
# torch's loader, without a process group
# ---------------------------------------------------------------------------


def test_torch_loader_reads_export(tmp_path: Path) -> None:
    # _PipelineScheduleRuntime._load_csv validates the file, infers the stage
    # placement from it and lowers it with sends and receives; stand-in stage
    # objects are enough for all of that.
    pytest.importorskip("torch.distributed.pipelining")
    from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

    from tests.core.test_schedules_torch import Recorder, ours

    for actions, kind, v in (
        (one_f_one_b(2, 4), "loop", 1),
        (interleaved_1f1b(2, 2, 4), "loop", 2),
        (zbv_zero_bubble(2, 4), "vshape", 2),
    ):
        path = tmp_path / "schedule.csv"
        path.write_text(pipelining_csv(actions))
        ranks = placement(kind, 2, v)  # type: ignore[arg-type]
        for rank in (0, 1):
            log: list[Action] = []
            stages = [Recorder(s, 2 * v, 2, rank, log) for s, r in enumerate(ranks) if r == rank]
            runtime = _PipelineScheduleRuntime(stages, 4)
            runtime._load_csv(str(path), format="compute_only")
            got = tuple(a for a in map(ours, runtime.pipeline_order[rank]) if a is not None)
            assert got == actions[rank]
            assert tuple(runtime.stage_index_to_group_rank[s] for s in range(2 * v)) == ranks
            # What the runtime executes from the lowered file is the same order.
            runtime._initialize_stages = lambda *a, **k: None  # type: ignore[method-assign]
            runtime._step_microbatches()
            assert tuple(log) == actions[rank]


# ---------------------------------------------------------------------------
# A real 2-rank gloo run of torch's runtime on an exported CSV
# ---------------------------------------------------------------------------

BATCH, WIDTH, BLOCKS, MICROBATCHES = 8, 5, 4, 4

GLOO_CASES: list[tuple[str, str, int]] = [
    # (label, placement kind, stages per rank); the CSV is built in the parent.
    ("1F1B", "loop", 1),
    ("Interleaved1F1B", "loop", 2),
    ("InterleavedZeroBubble", "loop", 2),
    ("ZBVZeroBubble", "vshape", 2),
]


def _blocks() -> list[Any]:
    import torch

    torch.manual_seed(0)
    return [
        torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh()).double()
        for _ in range(BLOCKS)
    ]


def _gloo_worker(rank: int, port: int, cases: list[tuple[str, str, str, int]], tmp: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
        timeout=timedelta(seconds=30),
    )  # fmt: skip
    try:
        gen = torch.Generator().manual_seed(1)
        x = torch.randn(BATCH, WIDTH, generator=gen, dtype=torch.float64)
        y = torch.randn(BATCH, WIDTH, generator=gen, dtype=torch.float64)
        loss_fn = torch.nn.MSELoss()
        for label, csv_text, kind, v in cases:
            blocks = _blocks()
            # Single process, full batch: the gradients the pipeline must reproduce.
            reference = copy.deepcopy(blocks)
            loss_fn(torch.nn.Sequential(*reference)(x), y).backward()

            num_stages = 2 * v
            per = BLOCKS // num_stages
            owners = placement(kind, 2, v)  # type: ignore[arg-type]
            mine = [s for s in range(num_stages) if owners[s] == rank]
            modules = {s: torch.nn.Sequential(*blocks[s * per : (s + 1) * per]) for s in mine}
            stages = [PipelineStage(modules[s], s, num_stages, torch.device("cpu")) for s in mine]
            runtime = _PipelineScheduleRuntime(stages, MICROBATCHES, loss_fn=loss_fn)
            path = Path(tmp) / f"{label}.{rank}.csv"
            path.write_text(csv_text)
            runtime._load_csv(str(path), format="compute_only")
            if 0 in mine:
                runtime.step(x, target=y)
            else:
                runtime.step(target=y)
            for s in mine:
                for b in range(s * per, (s + 1) * per):
                    for (pname, p), q in zip(
                        blocks[b].named_parameters(), reference[b].parameters(), strict=True
                    ):
                        assert p.grad is not None, f"{label}: block {b} {pname} has no gradient"
                        where = f"{label}: block {b} {pname}"
                        torch.testing.assert_close(
                            p.grad, q.grad, rtol=1e-5, atol=1e-12,
                            msg=lambda m, where=where: f"{where}: {m}",  # type: ignore[misc]
                        )  # fmt: skip
            dist.barrier()
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_gloo_runtime_runs_exported_csv(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    import torch.multiprocessing as mp

    generators: dict[str, Callable[[], RankActions]] = {
        "1F1B": lambda: one_f_one_b(2, MICROBATCHES),
        "Interleaved1F1B": lambda: interleaved_1f1b(2, 2, MICROBATCHES),
        "InterleavedZeroBubble": lambda: interleaved_zero_bubble(2, 2, MICROBATCHES),
        "ZBVZeroBubble": lambda: zbv_zero_bubble(2, MICROBATCHES),
    }
    cases = [(label, pipelining_csv(generators[label]()), kind, v) for label, kind, v in GLOO_CASES]
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    ctx = mp.start_processes(
        _gloo_worker, args=(_free_port(), cases, str(tmp_path)), nprocs=2, join=False,
        start_method="spawn",
    )  # fmt: skip
    deadline = time.monotonic() + 90
    try:
        while not ctx.join(timeout=1):
            if time.monotonic() > deadline:
                pytest.fail("the 2-rank gloo run did not finish within 90 s")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
                p.join(5)
    assert torch is not None
