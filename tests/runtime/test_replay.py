"""``umsearch replay``: one rank alone, every receive made up with the true shapes, every send dropped."""

from __future__ import annotations

import functools
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from click.testing import CliRunner, Result

from tests.contract import EXAMPLE3, EXAMPLE4, EXAMPLE5
from tests.runtime.helpers import (
    IN,
    OUT,
    QueueComm,
    QueueHub,
    TinyModel,
    _batch,
    peer_plan,
    plan_of,
    run_threaded,
    tiny_model,
)
from tests.strategies import uniform_profile
from umsearch.cli.replay import replay_command
from umsearch.core.cost import CostModel
from umsearch.core.plan import Plan
from umsearch.core.plan_io import save_plan
from umsearch.core.plan_rules import validate_plan
from umsearch.core.profile import save_profile
from umsearch.errors import RuntimeExecutionError
from umsearch.runtime.replay import REPLAY_SCHEMA, parse_device, predict, replay_rank, untag
from umsearch.runtime.shapes import SampleShape, decode, of_tensor
from umsearch.sim.reference import simulate

MLP: dict[str, Any] = {"source": "mlp", "args": {"layers": 3, "width": 16}}
MLP_LAYERS = 4  # three Linear+Tanh blocks and the classifier

WIDTHS = (IN, 7, 9, 4, OUT)


def varied_model(seed: int = 0) -> TinyModel:
    """Four Linear+Tanh layers of different widths: every cut sends another shape."""
    torch.manual_seed(seed)
    layers: list[torch.nn.Module] = [torch.nn.Sequential(torch.nn.Linear(a, b).double(), torch.nn.Tanh())
                                     for a, b in zip(WIDTHS, WIDTHS[1:], strict=False)]  # fmt: skip
    return TinyModel(layers, _batch, torch.nn.functional.mse_loss)


def three_ranks() -> Plan:
    return plan_of(8, ((0, 1), [2, 6], None, 3), ((1, 3), [4, 4], None, 2), ((3, 4), [3, 5], None, 1))


def labels(plan: Plan, rank: int) -> list[str]:
    return [str(a) for a in plan.actions[rank]]


# ---------------------------------------------------------------------------
# One rank alone
# ---------------------------------------------------------------------------


def test_rank_1_of_a_two_rank_plan_runs_alone_and_follows_its_list() -> None:
    plan = plan_of(8, ((0, 3), [2, 6], None, 2), ((3, 6), [4, 4], None, 1))
    rep = replay_rank(plan, functools.partial(tiny_model, 6), 1, steps=3)
    assert not dist.is_initialized()  # no process group was made or needed
    assert len(rep.steps) == 3 and len(rep.kept) == 2
    for stats in rep.steps:
        assert [r.label for r in stats.actions] == labels(plan, 1)
        assert all(r.end_ms >= r.start_ms for r in stats.actions) and stats.loss is not None
    assert rep.measured_busy_ms > 0 and set(rep.measured_kind_ms) == {"F", "B"}
    assert rep.tally.saved_end_bytes == 0 and rep.tally.saved_peak_bytes > 0
    assert rep.tally.param_bytes == rep.tally.grad_bytes == sum(p.numel() * 8 for m in tiny_model(6).layers[3:]
                                                                for p in m.parameters())  # fmt: skip
    assert rep.device_peak_bytes is None and rep.kind_ratios() == {"F": None, "B": None}  # CPU, no prediction


@pytest.mark.parametrize("name, ranks, v", [("Interleaved1F1B", 2, 2), ("ZBVZeroBubble", 2, 2)])
def test_every_rank_of_a_peer_schedule_replays_its_own_list(name: str, ranks: int, v: int) -> None:
    """Several stages per rank (local hand-offs and made-up messages mixed) and split backwards (I, W)."""
    plan = peer_plan(name, ranks, v, 4, batch=8, layers=8)
    for r in range(ranks):
        rep = replay_rank(plan, functools.partial(tiny_model, 8), r, steps=1)
        assert [a.label for a in rep.steps[0].actions] == labels(plan, r)
        assert rep.tally.saved_end_bytes == 0


def test_a_data_parallel_plans_rank_replays_its_replicas_share() -> None:
    plan = validate_plan(replace(plan_of(8, ((0, 3), [2, 6], None, 2), ((3, 6), [4, 4], None, 1)),
                                 global_batch=16, data_parallel=2))  # fmt: skip
    for r in (0, 1):
        rep = replay_rank(plan, functools.partial(tiny_model, 6), r, steps=2)
        assert [a.label for a in rep.steps[-1].actions] == labels(plan, r)
        assert all(s.replica == 0 and s.allreduce_end_ms is not None for s in rep.steps)


# ---------------------------------------------------------------------------
# Made-up messages have the true shapes
# ---------------------------------------------------------------------------


def test_headers_are_what_a_real_run_exchanges(monkeypatch: pytest.MonkeyPatch) -> None:
    plan = three_ranks()
    sent: dict[int, SampleShape] = {}

    class Recording(QueueComm):
        def isend(self, dst: int, tensor: torch.Tensor, tag: int) -> Any:
            stage, gradient, mb = untag(tag, plan.num_stages)
            if mb < 0:
                assert not gradient
                sent[stage] = decode(tensor)
            return super().isend(dst, tensor, tag)

    monkeypatch.setattr(QueueHub, "comm", lambda hub, rank: Recording(hub, rank))
    run_threaded(plan, varied_model(), batch_seed=0)  # every rank at once, over queues
    assert set(sent) == {0, 1}
    told: dict[int, SampleShape] = {}
    for r in (1, 2):
        told.update(replay_rank(plan, varied_model, r, steps=1).headers)
    assert told == sent
    # And they are the model's own: its first lo layers on one sample.
    x, _ = _batch(1, torch.Generator().manual_seed(0))
    net = torch.nn.Sequential(*varied_model().layers)
    for j in (0, 1):
        out = net[: plan.stages[j].hi](x)
        assert told[j] == of_tensor(out, "probe") == SampleShape(dims=(WIDTHS[plan.stages[j].hi],), dtype=torch.float64)


def _on_four_layers(plan: Plan) -> Plan:
    """The plan's stages cut evenly from the varied model's four layers."""
    n = plan.num_stages
    cuts = [round(j * 4 / n) for j in range(n + 1)]
    return replace(plan, stages=tuple(replace(s, layers=(cuts[j], cuts[j + 1])) for j, s in enumerate(plan.stages)))


SHAPE_PLANS = {
    "interleaved": _on_four_layers(EXAMPLE3),
    "v-shape split": _on_four_layers(EXAMPLE4),
    "unequal interleaved": _on_four_layers(EXAMPLE5),
    "recompute, per-stage lists": plan_of(12, ((0, 2), [4, 8], [6, 6], 2), ((2, 4), [3, 9], [12], 2)),
    "three ranks unequal": three_ranks(),
    "four ranks 1F1B": peer_plan("1F1B", 4, 1, 4, 8, 4),
}


@pytest.mark.parametrize("name", list(SHAPE_PLANS))
def test_every_message_a_replayed_rank_gets_has_the_shape_the_real_run_sends(
        name: str, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    from umsearch.runtime.replay import ReplayComm

    plan = SHAPE_PLANS[name]
    real: dict[int, dict[int, tuple[tuple[int, ...], torch.dtype]]] = {r: {} for r in range(plan.ranks)}

    class Recording(QueueComm):
        def isend(self, dst: int, tensor: torch.Tensor, tag: int) -> Any:
            real[dst][tag] = (tuple(tensor.shape), tensor.dtype)
            return super().isend(dst, tensor, tag)

    monkeypatch.setattr(QueueHub, "comm", lambda hub, rank: Recording(hub, rank))
    run_threaded(plan, varied_model(), batch_seed=0)
    made: dict[int, tuple[tuple[int, ...], torch.dtype]] = {}
    fill = ReplayComm.fill

    def recording_fill(comm: ReplayComm, buffer: torch.Tensor, tag: int) -> None:
        made[tag] = (tuple(buffer.shape), buffer.dtype)
        fill(comm, buffer, tag)

    monkeypatch.setattr(ReplayComm, "fill", recording_fill)
    for r in range(plan.ranks):
        made.clear()
        replay = replay_rank(plan, varied_model, r, steps=1)
        assert made == real[r], f"{name}: rank {r}"
        assert [str(a.label) for a in replay.steps[0].actions] == labels(plan, r)  # every action timed


def test_untag_inverts_the_executors_tag() -> None:
    from umsearch.runtime.executor import tag

    for S in (1, 3, 8):
        for stage in range(S):
            for gradient in (False, True):
                for mb in (-1, 0, 5, 1000):
                    assert untag(tag(stage, gradient, mb, S), S) == (stage, gradient, mb)


# ---------------------------------------------------------------------------
# The prediction beside it
# ---------------------------------------------------------------------------


def test_the_prediction_is_the_simulators() -> None:
    plan = peer_plan("ZBVZeroBubble", 2, 2, 4, batch=8, layers=8)
    cost = CostModel(uniform_profile(layers=8, op_overhead_ms=0.1, message_overhead_ms=0.05))
    sim = simulate(plan, cost)
    assert sim.busy_ms is not None and sim.peak_memory_bytes is not None
    for r, p in enumerate(predict(plan, cost)):
        assert p.busy_ms == sim.busy_ms[r] and p.peak_bytes == sim.peak_memory_bytes[r]
        assert sum(p.action_ms) == pytest.approx(p.busy_ms) and sum(p.kind_ms.values()) == pytest.approx(p.busy_ms)
        assert set(p.kind_ms) == {"F", "I", "W"} and p.state_bytes == 4 * 4 * 100  # 4 layers of 100 bytes
        assert p.activation_bytes == pytest.approx(p.peak_bytes - p.state_bytes)


# ---------------------------------------------------------------------------
# The command
# ---------------------------------------------------------------------------


def _plan_file(tmp: Path, *, profile: bool = True, data_parallel: int = 1) -> Path:
    plan = plan_of(8, ((0, 2), [2, 6], None, 2), ((2, MLP_LAYERS), [4, 4], None, 1))
    if data_parallel > 1:
        plan = validate_plan(replace(plan, global_batch=8 * data_parallel, data_parallel=data_parallel))
    meta: dict[str, Any] = {"model": MLP}
    if profile:
        save_profile(uniform_profile(layers=MLP_LAYERS, fwd=0.5, bwd=1.0), tmp / "prof.json")
        meta["profile"] = "prof.json"
    return save_plan(plan, tmp / "plan.json", **meta)


def _one_line(res: Result) -> str:
    lines = [ln for ln in res.stderr.splitlines() if ln.strip() and not ln.startswith("warning:")]
    assert res.exit_code == 1 and len(lines) == 1 and lines[0].startswith("error: "), res.output
    return lines[0][len("error: ") :]


def test_replay_json_of_every_rank(tmp_path: Path) -> None:
    path = _plan_file(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    res = CliRunner().invoke(replay_command, [str(path), "--all-ranks", "--steps", "2", "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert json.loads((out / "replay.json").read_text()) == doc
    assert (out / "notes.txt").read_text() == "mine"  # the user's file stays
    assert doc["schema"] == REPLAY_SCHEMA and doc["steps"] == 2 and doc["warmup_steps"] == 1
    assert doc["device"] == "cpu" and doc["precision"] == "fp32" and doc["model"] == MLP
    assert [r["rank"] for r in doc["ranks"]] == [0, 1]
    for r in doc["ranks"]:
        for key in ("predicted_busy_ms", "measured_busy_ms", "predicted_peak_bytes", "measured_peak_bytes"):
            assert isinstance(r[key], (int, float)) and r[key] > 0, key
        assert "device_peak_bytes" not in r  # CUDA only
        assert set(r["kind_ratios"]) == {"F", "B"} and all(v > 0 for v in r["kind_ratios"].values())
        assert r["kinds"]["F"]["predicted_ms"] == pytest.approx(0.5 * 2 * 2)  # two layers, two microbatches
        assert [a["action"] for a in r["actions"]] == [str(a) for a in plan_of(8, ((0, 2), [2, 6], None, 2), (
            (2, MLP_LAYERS), [4, 4], None, 1)).actions[r["rank"]]]  # fmt: skip
        # The uniform profile's 10 bytes of stash per layer and sample are far below the MLP's: reported, no failure.
        assert r["memory_over_prediction"] is True
        assert r["measured_memory"]["saved_end_bytes"] == 0 and len(r["measured_busy_all_ms"]) == 2
    # Again into the same folder: replay.json is umsearch's now, so it is replaced.
    again = CliRunner().invoke(replay_command, [str(path), "--rank", "1", "--steps", "1", "--out", str(out)])
    assert again.exit_code == 0, again.output
    assert [r["rank"] for r in json.loads((out / "replay.json").read_text())["ranks"]] == [1]
    assert "wrote replay.json" in again.stdout and "ratio" in again.stdout


def test_replay_of_a_data_parallel_plan_from_the_command(tmp_path: Path) -> None:
    res = CliRunner().invoke(replay_command, [str(_plan_file(tmp_path, data_parallel=2)), "--rank", "1", "--steps",
                                              "1", "--json"])  # fmt: skip
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["data_parallel"] == 2 and doc["replica_batch"] == 8 and doc["ranks"][0]["replica"] == 0


def test_without_a_profile_it_measures_only(tmp_path: Path) -> None:
    res = CliRunner().invoke(replay_command, [str(_plan_file(tmp_path, profile=False)), "--steps", "1", "--json"])
    assert res.exit_code == 0, res.output
    r = json.loads(res.stdout)["ranks"][0]
    assert r["predicted_busy_ms"] is None and r["measured_busy_ms"] > 0 and r["kind_ratios"] == {"F": None, "B": None}
    assert "names no profile" in res.stderr


@pytest.mark.parametrize("args, message", [
    (["--rank", "2"], "--rank 2 is not a rank of the plan, which has 2 rank(s): give 0..1, or --all-ranks"),
    (["--rank", "-1"], "--rank -1 is not a rank"),
    (["--rank", "0", "--all-ranks"], "give one of them"),
    (["--device", "gpu"], "--device 'gpu' is not a device; give cpu, cuda or cuda:N"),
    (["--steps", "0"], "--steps 0: replay at least one iteration"),
])  # fmt: skip
def test_mistakes_are_one_line_with_the_fix(tmp_path: Path, args: list[str], message: str) -> None:
    res = CliRunner().invoke(replay_command, [str(_plan_file(tmp_path)), *args])
    assert message in _one_line(res)


def test_a_file_of_yours_named_replay_json_is_kept(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "replay.json").write_text("mine")
    res = CliRunner().invoke(replay_command, [str(_plan_file(tmp_path)), "--steps", "1", "--out", str(out)])
    assert "was not written by umsearch" in _one_line(res)
    assert (out / "replay.json").read_text() == "mine"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_cuda_without_a_gpu_says_so() -> None:
    with pytest.raises(RuntimeExecutionError, match="sees none on this machine; replay on --device cpu"):
        parse_device("cuda:0")


def test_devices_parse() -> None:
    assert parse_device("cpu") == torch.device("cpu") and parse_device(" CPU ") == torch.device("cpu")
    for bad in ("cpu:0", "cuda:x", "tpu", ""):
        with pytest.raises(RuntimeExecutionError, match="is not a device"):
            parse_device(bad)
