"""The memory-bound benchmark: full activation checkpointing of a runner, and its rehearsal at tiny sizes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch


def _stack() -> torch.nn.ModuleList:
    torch.manual_seed(0)
    return torch.nn.ModuleList(torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh()) for _ in range(3))


def _run(layers: torch.nn.ModuleList, x: torch.Tensor) -> tuple[list[torch.Tensor], int]:
    from umsearch.runtime.memory_tally import MemoryTally

    for p in layers.parameters():
        p.grad = None
    tally = MemoryTally(layers.parameters())
    with tally:
        h = x
        for layer in layers:
            h = layer(h)
        h.sum().backward()
    return [p.grad.clone() for p in layers.parameters() if p.grad is not None], tally.result().saved_peak_bytes


def test_checkpointed_layers_keep_their_inputs_only_and_give_the_same_gradients() -> None:
    from benchmarks.memory_bound import checkpointed

    layers, x = _stack(), torch.randn(8, 16)
    plain, plain_saved = _run(layers, x)
    with checkpointed([*layers, layers[0]]):  # a layer named twice is wrapped once
        ac, ac_saved = _run(layers, x)
    assert all(torch.equal(a, b) for a, b in zip(plain, ac, strict=True))
    # Plain: the input and every Tanh output (each Linear's input is the Tanh output before it); checkpointed:
    # each layer's input only (the last output is saved by nothing).
    assert (plain_saved, ac_saved) == (4 * 8 * 16 * 4, 3 * 8 * 16 * 4)
    assert all("forward" not in vars(layer) for layer in layers)  # restored on leaving


@pytest.mark.slow
def test_the_quick_rehearsal_measures_every_torch_schedule_with_and_without_checkpointing(tmp_path: Path) -> None:
    from benchmarks.memory_bound import FRACTION, SCREEN_MARGIN, SCREEN_ROUNDS, SCREENED, main
    from umsearch.core.schedules import PEER_SCHEDULES

    main(["--quick", "--out", str(tmp_path)])
    doc = json.loads((tmp_path / "memory_bound_quick.json").read_text())
    sec = doc["models"]["gpt_tiny"]
    assert sec["limit_bytes"] == FRACTION * max(sec["unconstrained_best"]["measured_peak_bytes"])
    rows = sec["contenders"]
    assert rows[0]["name"] == "tuned" and rows[0]["fits"] == sec["tuned_fits"]
    limit = sec["limit_bytes"]
    for r in rows:
        assert len(r["measured_ms"]) == doc["settings"]["rounds"] and len(r["measured_peak_bytes"]) == 2
        assert r["fits"] == all(p <= limit for p in r["measured_peak_bytes"])
    torch_rows = rows[1:]
    assert {(r["schedule"], r["full_activation_checkpointing"]) for r in torch_rows} == {
        (s, ac) for s in PEER_SCHEDULES for ac in (False, True)}  # fmt: skip
    assert sec["fitting_torch"] == [r["name"] for r in torch_rows if r["fits"]]
    assert sec["beats_every_fitting_torch"] == (sec["tuned_fits"] and all(
        r["ratio_over_tuned"]["interval_above_1"] for r in torch_rows if r["fits"]))  # fmt: skip
    # A checkpointed twin (same schedule, cuts and microbatches) never holds more than its plain self.
    def twin(r: dict) -> tuple:
        return r["schedule"], r.get("origin"), r["stages"], r["microbatches"]

    searched = [r for r in torch_rows if r["origin"] != SCREENED]  # the screen's twins are checked below
    for rows_ in (searched, sec["screen"]):
        plain = {twin(r): r for r in rows_ if not r["full_activation_checkpointing"]}
        for r in rows_:
            if r["full_activation_checkpointing"]:
                assert all(a <= b for a, b in zip(r["measured_peak_bytes"], plain[twin(r)]["measured_peak_bytes"],
                                                  strict=True))  # fmt: skip
                assert r.get("tally_may_miss_bytes", 1) > 0
    # The screen: every torch schedule at every microbatch count; a checkpointed twin only where the plain one
    # does not fit; what fits and kept up with the tuned plan runs in the side-by-side.
    screened = sec["screen"]
    assert {r["schedule"] for r in screened} | {r["schedule"] for r in torch_rows} == set(PEER_SCHEDULES)
    plain_fits = {twin(r): r["fits"] for r in screened if not r["full_activation_checkpointing"]}
    names = {r["name"] for r in torch_rows}
    for r in screened:
        assert r["fits"] == all(p <= limit for p in r["measured_peak_bytes"])
        assert len(r["screen_ms"]) == SCREEN_ROUNDS
        assert r["joins_side_by_side"] == (r["fits"] and r["over_first"] <= SCREEN_MARGIN)
        assert (r["name"] in names) == r["joins_side_by_side"]
        if r["full_activation_checkpointing"]:
            assert plain_fits[twin(r)] is False
