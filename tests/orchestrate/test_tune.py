"""The tune loop's decisions, with a stand-in for the machine (no timing): it hands over the contender that
measured fastest, stops per its rule, keeps what was measured on Ctrl-C and is reproducible."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.strategies import uniform_profile
from umsearch.core.cost import CostModel
from umsearch.core.loader import load_plan_file
from umsearch.core.profile import Profile, RuntimeCosts, load_profile
from umsearch.orchestrate.calibration import probe_plans
from umsearch.orchestrate.contenders import ContenderMeasurement, Entry
from umsearch.orchestrate.tune import (
    STOP_BUDGET,
    STOP_INTERRUPTED,
    STOP_REPEAT,
    STOP_ROUNDS,
    Candidate,
    TuneConfig,
    TuneResult,
    distinct,
    tune,
)
from umsearch.orchestrate.tune_output import document, fill
from umsearch.sim.reference import simulate

PROFILE = uniform_profile(layers=8, out_bytes=2**20, bandwidth=1e9)
PLANS = dict(probe_plans(PROFILE))


def _candidates(_: Profile) -> list[Candidate]:
    """A fixed proposal: three plans on umsearch's runtime and two torch schedules."""
    names = ["GPipe x2", "1F1B x8", "Interleaved1F1B x4 v2"]
    out = [Candidate(name=n, plan=PLANS[n], runtime="umsearch") for n in names]
    return out + [Candidate(name="torch GPipe", plan=PLANS["GPipe x16"], runtime="torch", schedule="GPipe"),
                  Candidate(name="torch ZBVZeroBubble", plan=PLANS["ZBVZeroBubble x8 v2"], runtime="torch",
                            schedule="ZBVZeroBubble")]  # fmt: skip


class FakeMachine:
    """Measures ``times[name]`` ms per round (a list cycles through loop rounds), with a spread of +-1%."""

    def __init__(self, times: dict[str, float | list[float]], interrupt_at: int | None = None) -> None:
        self.times, self.calls, self.interrupt_at = times, 0, interrupt_at
        self.seen: list[list[str]] = []

    def __call__(self, entries: Sequence[Entry], rounds: int) -> list[ContenderMeasurement]:
        if self.calls == self.interrupt_at:
            raise KeyboardInterrupt
        self.seen.append([e.name for e in entries])
        out = []
        for e in entries:
            # A torch schedule's own plan through PlanSchedule (the model check) runs as fast as torch's class.
            name = "torch " + e.name.removesuffix(" via PlanSchedule") if e.name not in self.times else e.name
            t = self.times[name]
            ms = t[self.calls % len(t)] if isinstance(t, list) else t
            out.append(ContenderMeasurement(step_ms=tuple(ms * (1 + 0.01 * ((r % 3) - 1)) for r in range(rounds))))
        self.calls += 1
        return out


TIMES: dict[str, float | list[float]] = {"GPipe x2": 30.0, "1F1B x8": 22.0, "Interleaved1F1B x4 v2": 25.0,
                                         "torch GPipe": 24.0, "torch ZBVZeroBubble": 23.0}  # fmt: skip


def test_the_loop_hands_over_the_contender_that_measured_fastest_and_stops_when_it_repeats() -> None:
    machine = FakeMachine(TIMES)
    result = tune(PROFILE, _candidates, machine, TuneConfig(max_rounds=5, measure_rounds=3))
    assert result.stopped == STOP_REPEAT and len(result.rounds) == 2 and not result.interrupted
    assert result.winner is not None and result.winner.candidate.name == "1F1B x8"
    assert result.winner.median_ms == pytest.approx(22.0)
    lo, hi = result.winner.ci95_ms
    assert lo <= 22.0 <= hi
    # The prediction is the simulator's under the profile searched on (no refit: nothing brought records).
    assert result.winner.predicted_before_ms == simulate(PLANS["1F1B x8"], CostModel(PROFILE)).iteration_ms


def test_a_torch_schedule_that_measured_fastest_wins_and_is_exported(tmp_path: Path) -> None:
    times = {**TIMES, "torch ZBVZeroBubble": 20.0}
    result = tune(PROFILE, _candidates, FakeMachine(times), TuneConfig(max_rounds=5, measure_rounds=3))
    assert result.winner is not None and result.winner.candidate.schedule == "ZBVZeroBubble"
    meta = {"profile": "p.json", "ranks": 2, "global_batch": 16, "seed": 0}
    fill(tmp_path, result, meta, [lay.name for lay in PROFILE.layers])
    doc = json.loads((tmp_path / "tune.json").read_text())
    assert doc["schema"] == "umsearch.tune/1" and doc["winner"]["runtime"] == "torch"
    assert "torch's schedule ZBVZeroBubble is as good as or better" in doc["verdict"]
    assert (tmp_path / "torchtitan.toml").is_file() and (tmp_path / "schedule.csv").is_file()
    assert load_plan_file(tmp_path / "plan.json").plan == PLANS["ZBVZeroBubble x8 v2"]


def test_the_loop_stops_when_the_rounds_are_spent_if_the_fastest_keeps_changing() -> None:
    times = {**TIMES, "1F1B x8": [22.0, 26.0], "Interleaved1F1B x4 v2": [25.0, 21.0]}
    result = tune(PROFILE, _candidates, FakeMachine(times), TuneConfig(max_rounds=3, measure_rounds=3))
    assert result.stopped == STOP_ROUNDS and len(result.rounds) == 3
    assert [r.fastest.candidate.name for r in result.rounds] == ["1F1B x8", "Interleaved1F1B x4 v2", "1F1B x8"]
    assert result.winner is not None and result.winner.candidate.name == "1F1B x8"


def test_the_loop_stops_at_the_budget() -> None:
    times = {**TIMES, "1F1B x8": [22.0, 26.0], "Interleaved1F1B x4 v2": [25.0, 21.0]}
    result = tune(PROFILE, _candidates, FakeMachine(times), TuneConfig(max_rounds=9, measure_rounds=3,
                                                                       budget_min=1e-9))  # fmt: skip
    assert result.stopped == STOP_BUDGET and len(result.rounds) == 1


def test_the_champion_defends_its_place_when_the_search_drops_it() -> None:
    calls = [0]

    def propose(p: Profile) -> list[Candidate]:
        calls[0] += 1
        cands = _candidates(p)
        return cands if calls[0] == 1 else [c for c in cands if c.name != "1F1B x8"]

    machine = FakeMachine(TIMES)
    result = tune(PROFILE, propose, machine, TuneConfig(max_rounds=4, measure_rounds=3))
    assert "1F1B x8" in machine.seen[1] and result.stopped == STOP_REPEAT
    assert result.winner is not None and result.winner.candidate.name == "1F1B x8"


def test_a_contender_keeps_one_name_across_rounds_and_names_stay_unique() -> None:
    calls = [0]

    def propose(p: Profile) -> list[Candidate]:
        calls[0] += 1
        cands = _candidates(p)
        if calls[0] == 2:  # a new plan under an old plan's name, and an old plan under a new name
            cands[0] = dataclasses.replace(cands[0], plan=PLANS["GPipe x16"])
            cands[1] = dataclasses.replace(cands[1], name="renamed")
        return cands

    machine = FakeMachine({**TIMES, "GPipe x2 #2": 40.0})
    tune(PROFILE, propose, machine, TuneConfig(max_rounds=2, measure_rounds=3))
    # Round 2 adds the plan of round 1's fastest torch schedule through PlanSchedule (the model check).
    assert machine.seen[1] == ["GPipe x2 #2", "1F1B x8", "Interleaved1F1B x4 v2", "torch GPipe", "torch ZBVZeroBubble",
                               "ZBVZeroBubble via PlanSchedule"]  # fmt: skip


def test_ctrl_c_keeps_the_rounds_measured_before_it() -> None:
    times = {**TIMES, "1F1B x8": [22.0, 26.0], "Interleaved1F1B x4 v2": [25.0, 21.0]}
    result = tune(PROFILE, _candidates, FakeMachine(times, interrupt_at=1), TuneConfig(max_rounds=5, measure_rounds=3))
    assert result.interrupted and result.stopped == STOP_INTERRUPTED and len(result.rounds) == 1
    assert result.winner is not None and result.winner.candidate.name == "1F1B x8"
    nothing = tune(PROFILE, _candidates, FakeMachine(times, interrupt_at=0), TuneConfig(measure_rounds=3))
    assert nothing.rounds == () and nothing.winner is None


def _strip(doc: dict) -> dict:  # type: ignore[type-arg]
    doc = dict(doc, wall_s=0)
    doc["rounds"] = [dict(r, wall_s=0) for r in doc["rounds"]]
    return doc


def test_same_measurements_same_result() -> None:
    def run() -> TuneResult:
        return tune(PROFILE, _candidates, SimulatedMachine(), TuneConfig(max_rounds=3, measure_rounds=3))

    meta = {"seed": 0}
    assert _strip(document(run(), meta)) == _strip(document(run(), meta))


TRUTH = RuntimeCosts(op_overhead_ms=0.3, message_overhead_ms=0.2, message_overhead_ms_per_mib=0.5,
                     stage_scale=((2, 1.2), (4, 0.9)))  # fmt: skip


class SimulatedMachine:
    """A machine that runs plans exactly as the simulator predicts them under :data:`TRUTH`, with records."""

    def __call__(self, entries: Sequence[Entry], rounds: int) -> list[ContenderMeasurement]:
        truth = CostModel(dataclasses.replace(PROFILE, runtime=TRUTH))
        out = []
        for e in entries:
            res = simulate(e.plan, truth)
            assert res.iteration_ms is not None
            steps = ()
            if e.runtime == "umsearch":
                from umsearch.runtime.run_plan import StepResult

                steps = tuple(StepResult(iteration_ms=res.iteration_ms, step_ms=res.iteration_ms, loss=None,
                                         records=res.records) for _ in range(rounds))  # fmt: skip
            out.append(ContenderMeasurement(step_ms=(res.iteration_ms,) * rounds, steps=steps))
        return out


def test_the_refit_learns_the_machine_and_predicts_it_after(tmp_path: Path) -> None:
    result = tune(PROFILE, _candidates, SimulatedMachine(), TuneConfig(max_rounds=3, measure_rounds=3))
    rt = result.profile.runtime
    assert rt.message_overhead_ms_per_mib == pytest.approx(0.5, abs=1e-9)
    assert [s for _, s in rt.stage_scale] == pytest.approx([1.2, 0.9], abs=1e-9)
    for c in result.rounds[-1].contenders:
        assert c.predicted_after_ms == pytest.approx(c.median_ms, rel=1e-9)
    assert rt.calibration is not None and rt.calibration["held_out_mape_percent"] == pytest.approx(0, abs=1e-6)
    fill(tmp_path, result, {"seed": 0}, [lay.name for lay in PROFILE.layers])
    assert load_profile(tmp_path / "profile.json").runtime == rt
    plan_doc = load_plan_file(tmp_path / "plan.json").document
    assert result.winner is not None and plan_doc.plan == result.winner.candidate.plan
    assert "95% interval" in plan_doc.meta["source"] and plan_doc.meta["profile"] == "profile.json"


def test_distinct_plans_differ_in_more_than_their_order() -> None:
    a = PLANS["1F1B x8"]
    reordered = dataclasses.replace(a, actions=(a.actions[0], a.actions[1][::-1]))  # not even valid: order only
    picked = distinct([(1.0, a), (1.5, reordered), (2.0, PLANS["GPipe x2"]), (3.0, PLANS["GPipe x16"])], 2)
    assert picked == [a, PLANS["GPipe x2"]]


def test_the_search_proposer_fills_k_from_a_search_per_structure(tmp_path: Path) -> None:
    """When the front holds fewer than K distinct plans, one short search per structure adds more."""
    from umsearch.core.profile import save_profile
    from umsearch.measure.synthetic import bimodal_profile
    from umsearch.orchestrate.tune import search_proposer, structure
    from umsearch.search.space import build_space

    profile = bimodal_profile(layers=4)
    save_profile(profile, tmp_path / "p.json")
    space = build_space({"profile": str(tmp_path / "p.json"), "ranks": 2, "global_batch": 8, "generations": 1,
                         "population": 8, "time_budget_s": 60, "stages_per_rank": [1, 2]})  # fmt: skip
    candidates = search_proposer(space, k=8)(profile)
    plans = [c for c in candidates if c.runtime == "umsearch"]
    peers = [c for c in candidates if c.runtime == "torch"]
    assert plans and len({structure(c.plan) for c in plans}) == len(plans)
    assert {c.schedule for c in peers} <= set(space.schedule.peers) and peers


def test_the_model_is_checked_on_the_best_torch_schedules_own_plan_through_plan_schedule() -> None:
    result = tune(PROFILE, _candidates, FakeMachine(TIMES), TuneConfig(max_rounds=5, measure_rounds=3))
    winner = document(result, {})["winner"]
    check = winner["model_check"]
    assert winner["name"] == "1F1B x8" and check["peer_plan"] == "ZBVZeroBubble via PlanSchedule"
    assert check["measured_ratio_over_tuned"]["median"] == pytest.approx(23.0 / 22.0)
    want = simulate(PLANS["ZBVZeroBubble x8 v2"], CostModel(result.profile)).iteration_ms / \
        simulate(PLANS["1F1B x8"], CostModel(result.profile)).iteration_ms  # fmt: skip
    assert check["predicted_ratio_over_tuned"] == pytest.approx(want)


def test_where_a_torch_schedule_wins_the_model_is_checked_against_the_fastest_other_plan() -> None:
    times = {**TIMES, "torch ZBVZeroBubble": 20.0}
    result = tune(PROFILE, _candidates, FakeMachine(times), TuneConfig(max_rounds=5, measure_rounds=3))
    winner = document(result, {})["winner"]
    assert winner["runtime"] == "torch" and winner["schedule"] == "ZBVZeroBubble"
    check = winner["model_check"]
    assert check["peer_plan"] == "ZBVZeroBubble via PlanSchedule" and check["tuned_plan"] == "1F1B x8"
    assert check["measured_ratio_over_tuned"]["median"] == pytest.approx(20.0 / 22.0)
