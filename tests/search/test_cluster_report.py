"""The cluster search's report and CLI: hidden all-reduce time, and --cluster FILE."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.cli.helpers import run_cli
from tests.contract import example8, example8_profile
from umsearch.cli.report import allreduce_overlap, verdict
from umsearch.core.cost import CostModel
from umsearch.search.baselines import GREEDY
from umsearch.sim.reference import simulate

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("layout,total,hidden", [("dp_inner", 6.0, 1.98), ("pp_inner", 44.0, 4.0)])
def test_hidden_allreduce_is_the_part_overlapping_computation(layout: str, total: float, hidden: float) -> None:
    """docs/model.md 8.8: dp_inner's all-reduces run 15.02-18.02 (rank 0 computes from 16.04) and 20.04-23.04
    (after every action): 6 ms, 1.98 ms of it hidden."""
    sim = simulate(example8(layout), CostModel(example8_profile()))
    assert allreduce_overlap(sim) == (pytest.approx(total), pytest.approx(hidden))


def test_search_with_a_cluster_file_writes_a_data_parallel_plan(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    c = tmp_path / "c.toml"
    c.write_text("[cluster]\nnodes = 2\ngpus_per_node = 2\nintra = 'nvlink4'\ninter = 'ib-ndr'\n")
    out = tmp_path / "out"
    code, stdout, err = run_cli(capsys, "search", str(ROOT / "search_spaces" / "gpt_cpu.toml"), "--cluster", str(c),
                                "--ranks", "2", "--batch", "8", "--population", "8", "--generations", "1", "--peers",
                                "1F1B", "--out", str(out), "--json")  # fmt: skip
    assert code == 0, err
    summary = json.loads(stdout.strip().splitlines()[-1])
    plan = json.loads((out / "plan.json").read_text())
    assert (summary["ranks"], summary["data_parallel"], plan["ranks"], plan["data_parallel"]) == (2, 2, 2, 2)
    assert plan["cluster"]["gpus_per_node"] == 2 and plan["cluster"]["inter"]["bandwidth_gb_per_s"] == 50.0
    assert "## Cluster" in (out / "report.md").read_text()


def _result(best: tuple[str, float], peers: dict[str, float | None]) -> Any:
    """The fields :func:`verdict` reads of a search result."""
    scored = lambda name, ms: SimpleNamespace(name=name, iteration_ms=ms)  # noqa: E731
    return SimpleNamespace(best=scored(*best), baselines={n: None if t is None else scored(n, t) for n, t in peers.items()})


def test_the_verdict_names_the_fastest_peer_that_fits_and_never_claims_a_loss_as_a_win() -> None:
    peers = {"1F1B": 12.0, "Interleaved1F1B": 10.5, "GPipe": None, GREEDY: 9.0}  # the greedy plan is no torch schedule
    assert verdict(_result(("umsearch", 10.0), peers)) == "1.050x Interleaved1F1B, the fastest torch schedule that fits"
    handed = verdict(_result(("Interleaved1F1B", 10.5), peers))
    assert handed.startswith("no plan faster than Interleaved1F1B found") and "x " not in handed
    assert verdict(_result(("umsearch", 10.0), {"GPipe": None})) == "no torch schedule fits the memory limit"
