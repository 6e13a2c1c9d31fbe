"""``tune`` under a memory limit: a contender whose measured peak exceeds it on any rank is dropped before the
winner is picked, and the report says which, on which rank, measured against what; none fitting is an error."""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.orchestrate.test_tune import PROFILE, TIMES, FakeMachine, _candidates
from tests.runtime.helpers import peer_plan
from tests.runtime.test_distributed import tiny_model
from tests.strategies import uniform_profile
from umsearch.errors import NoFeasiblePlanError
from umsearch.orchestrate.contenders import ContenderMeasurement, Entry, machine
from umsearch.orchestrate.tune import Candidate, TuneConfig, tune
from umsearch.orchestrate.tune_output import document, fill
from umsearch.runtime.config import LaunchConfig, RunConfig

MiB = 2**20
PEAKS = {"GPipe x2": (5 * MiB, 4 * MiB), "1F1B x8": (3 * MiB, 9 * MiB), "Interleaved1F1B x4 v2": (2 * MiB, 2 * MiB),
         "torch GPipe": (6 * MiB, 1 * MiB), "torch ZBVZeroBubble": (3 * MiB, 3 * MiB)}  # fmt: skip


class PeakMachine(FakeMachine):
    """:class:`FakeMachine` that also measures ``PEAKS[name]`` per rank."""

    def __call__(self, entries: Sequence[Entry], rounds: int) -> list[ContenderMeasurement]:
        got = super().__call__(entries, rounds)
        return [ContenderMeasurement(step_ms=m.step_ms, peak_bytes=PEAKS.get(e.name, (MiB, MiB)))
                for e, m in zip(entries, got, strict=True)]  # fmt: skip


def test_contenders_over_the_limit_on_any_rank_are_dropped_before_the_winner_is_picked(tmp_path: Path) -> None:
    cfg = TuneConfig(max_rounds=1, measure_rounds=3, memory_limit=4 * MiB)
    result = tune(PROFILE, _candidates, PeakMachine(TIMES), cfg)
    r = result.rounds[0]
    # 1F1B x8 measured fastest (22 ms) but holds 9 MiB on rank 1; ZBV (23 ms) is the fastest that fits.
    assert result.winner is not None and result.winner.candidate.name == "torch ZBVZeroBubble"
    dropped = {o.result.candidate.name: (o.rank, o.peak_bytes) for o in r.over_limit}
    assert dropped == {"GPipe x2": (0, 5 * MiB), "1F1B x8": (1, 9 * MiB), "torch GPipe": (0, 6 * MiB)}
    assert all(max(c.measured.peak_bytes) <= 4 * MiB for c in r.contenders)
    fill(tmp_path, result, {"seed": 0}, [lay.name for lay in PROFILE.layers])
    doc = json.loads((tmp_path / "tune.json").read_text())
    over = {o["name"]: o for o in doc["rounds"][0]["over_memory_limit"]}
    assert over["1F1B x8"]["rank"] == 1 and over["1F1B x8"]["measured_peak_bytes"] == 9 * MiB
    assert over["1F1B x8"]["limit_bytes"] == 4 * MiB
    assert doc["winner"]["name"] == "torch ZBVZeroBubble"
    assert "of the contenders that fit the memory limit (3 measured over it, dropped)" in doc["verdict"]
    report = (tmp_path / "report.md").read_text()
    assert "1F1B x8 (umsearch) measured a peak of 9.00 MiB (9437184 bytes) on rank 1, over the memory limit of " \
           "4.00 MiB" in report  # fmt: skip


def test_no_limit_keeps_every_contender() -> None:
    result = tune(PROFILE, _candidates, PeakMachine(TIMES), TuneConfig(max_rounds=1, measure_rounds=3))
    assert result.rounds[0].over_limit == () and len(result.rounds[0].contenders) == 5
    assert result.winner is not None and result.winner.candidate.name == "1F1B x8"


def test_when_no_contender_fits_the_error_names_the_limit_and_the_smallest_peak() -> None:
    cfg = TuneConfig(max_rounds=1, measure_rounds=3, memory_limit=MiB)
    with pytest.raises(NoFeasiblePlanError, match=r"--memory-limit 1048576 bytes .* smallest measured peak was "
                                                  r"2097152 bytes \(Interleaved1F1B x4 v2, rank 0\); raise"):  # fmt: skip
        tune(PROFILE, _candidates, PeakMachine(TIMES), cfg)


@pytest.mark.slow
def test_on_two_gloo_ranks_a_limit_between_two_torch_schedules_peaks_keeps_the_one_that_fits() -> None:
    """torch's own 1F1B and GPipe classes on the same 4 layers: GPipe keeps 2 halves of the batch in flight,
    1F1B at most 2 quarters, so GPipe's tallied peak is the larger; a limit halfway keeps 1F1B alone."""
    run = RunConfig(warmup_steps=1, launch=LaunchConfig(timeout_s=60))
    factory = functools.partial(tiny_model, 4)
    cands = [Candidate(name="torch 1F1B", plan=peer_plan("1F1B", 2, 1, 4, 8, 4), runtime="torch", schedule="1F1B"),
             Candidate(name="torch GPipe", plan=peer_plan("GPipe", 2, 1, 2, 8, 4), runtime="torch", schedule="GPipe")]
    measure = machine(factory, run)
    first = measure([Entry(name=c.name, plan=c.plan, runtime=c.runtime, schedule=c.schedule) for c in cands], 2)
    small, large = (max(m.peak_bytes) for m in first)
    assert small < large
    limit = (small + large) / 2
    result = tune(uniform_profile(layers=4), lambda _: cands, measure,
                  TuneConfig(max_rounds=1, measure_rounds=2, memory_limit=limit))  # fmt: skip
    r = result.rounds[0]
    assert [c.candidate.name for c in r.contenders] == ["torch 1F1B"]
    assert result.winner is not None and result.winner.candidate.name == "torch 1F1B"
    (o,) = r.over_limit
    # The tally is deterministic: the same peak as the first launch measured, on the same rank.
    assert o.result.candidate.name == "torch GPipe" and o.peak_bytes == large and o.limit_bytes == limit
    assert o.result.measured.peak_bytes == first[1].peak_bytes
    assert document(result, {})["rounds"][0]["over_memory_limit"][0]["rank"] == o.rank
