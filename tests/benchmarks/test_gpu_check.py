"""The GPU check's steps work together: its CPU rehearsal passes every step and records its figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

HF_LLAMA = ["profile hf:llama fp32", "hf:llama 2-rank plan", "hf:llama replay --all-ranks", "hf:llama 1-rank plan",
            "hf:llama 1-rank run"]  # fmt: skip
"""The hf:llama case's steps (issue 40), last."""


@pytest.mark.slow
def test_the_cpu_rehearsal_passes_every_step(tmp_path: Path) -> None:
    from benchmarks.gpu_check import main

    assert main(["--cpu", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "gpu_check_cpu.json").read_text())
    names = [c["name"] for c in doc["checks"]]
    assert names == ["profile gpt layers=4 fp32", "2 x 2 cluster plan", "replay --all-ranks", "section 5 vs tally peak",
                     "calibrate --replay", "1-rank run, memory", *HF_LLAMA]  # fmt: skip
    assert all(c["ok"] for c in doc["checks"]), doc["checks"]
    replay = doc["checks"][2]["figures"]
    assert replay["busy_measured_over_predicted"] and all(r > 0 for r in replay["tally_over_predicted_peak"])
    by_name = {c["name"]: c["figures"] for c in doc["checks"]}
    assert by_name["1-rank run, memory"]["measured_over_predicted_peak"][0] > 0
    # The CPU rehearsal measures section 5 against the tally: every rank of the seven plan shapes on 2 ranks.
    section5 = by_name["section 5 vs tally peak"]
    rows = section5["rows"]
    assert section5["measured_by"] == "the tally" and section5["ranks"] == len(rows) == 14
    assert all(r["measured_peak_bytes"] == r["tally_peak_bytes"] > r["predicted_state_bytes"] > 0 for r in rows)
    assert all(r["measured_over_predicted"] == r["measured_peak_bytes"] / r["predicted_peak_bytes"] for r in rows)
    # The hf:llama case: a profile of the tiny Llama, a 2-rank plan replayed rank by rank, a 1-rank run timed.
    hf = [by_name[n] for n in HF_LLAMA]
    assert hf[0]["sizes"] == [1, 2] and hf[0]["decoder_fwd_bwd_ms_at_largest"] > 0
    assert len(hf[2]["busy_measured_over_predicted"]) == 2 and all(r > 0 for r in hf[2]["busy_measured_over_predicted"])
    run = hf[4]
    assert run["measured_over_predicted"] == run["measured_iteration_ms"] / run["predicted_iteration_ms"] > 0
