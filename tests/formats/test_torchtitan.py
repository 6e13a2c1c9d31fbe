"""Plans as torchtitan settings: torchtitan's own names, named schedules recognised, CSV otherwise."""

from __future__ import annotations

import json
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest

from tests.contract import example8
from tests.runtime.helpers import peer_plan, placed
from umsearch.core.plan_rules import validate_plan
from umsearch.core.schedules import PEER_SCHEDULES
from umsearch.errors import PlanError
from umsearch.formats.torch_csv import parse_pipelining_csv
from umsearch.formats.torchtitan import (
    PARALLELISM_KEYS,
    TRAINING_KEYS,
    module_names,
    named_schedule,
    torchtitan_export,
)

# The fields of torchtitan's ``Parallelism`` job config (torchtitan/config/job_config.py) that concern
# the pipeline, as spelled there; NeMo Automodel's pipelining config takes the same names.
TORCHTITAN_PIPELINE_FIELDS = {
    "pipeline_parallel_degree", "pipeline_parallel_split_points", "module_fqns_per_model_part",
    "pipeline_parallel_first_stage_less_layers", "pipeline_parallel_last_stage_less_layers",
    "pipeline_parallel_layers_per_stage", "pipeline_parallel_schedule", "pipeline_parallel_schedule_csv",
    "pipeline_parallel_microbatch_size",
}  # fmt: skip
# Its data-parallel fields: plain replication (DDP) and sharding (FSDP; -1 takes the devices left over).
TORCHTITAN_DATA_PARALLEL_FIELDS = {"data_parallel_replicate_degree", "data_parallel_shard_degree"}
# The batch fields of its ``Training`` job config: per-device batch, and the global one (-1: local x DP degree).
TORCHTITAN_TRAINING_FIELDS = {"local_batch_size", "global_batch_size"}
# torch.distributed.pipelining.schedules.get_schedule_class's names (2.13), which torchtitan passes on.
TORCH_SCHEDULE_NAMES = {"1F1B", "Interleaved1F1B", "GPipe", "LoopedBFS", "InterleavedZeroBubble",
                        "PipelineScheduleSingle", "PipelineScheduleMulti", "ZBVZeroBubble", "DualPipeV"}  # fmt: skip


def test_every_key_written_is_one_of_torchtitans() -> None:
    assert set(PARALLELISM_KEYS) <= TORCHTITAN_PIPELINE_FIELDS | TORCHTITAN_DATA_PARALLEL_FIELDS
    assert set(TRAINING_KEYS) <= TORCHTITAN_TRAINING_FIELDS
    assert set(PEER_SCHEDULES) <= TORCH_SCHEDULE_NAMES


def test_torchs_schedule_class_names_are_the_ones_recorded_here() -> None:
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    for name in TORCH_SCHEDULE_NAMES:
        assert schedules.get_schedule_class(name).__name__


@pytest.mark.parametrize("name, ranks, v, m", [("GPipe", 2, 1, 4), ("1F1B", 4, 1, 8), ("Interleaved1F1B", 2, 2, 4),
                                               ("LoopedBFS", 2, 3, 4), ("InterleavedZeroBubble", 2, 2, 4),
                                               ("ZBVZeroBubble", 2, 2, 4)])  # fmt: skip
def test_a_peer_schedule_exports_by_name(name: str, ranks: int, v: int, m: int) -> None:
    plan = peer_plan(name, ranks, v, m, batch=2 * m, layers=ranks * v)
    found = named_schedule(plan)
    # Where two schedules coincide for a shape, the first registered is named; its order is the same.
    assert found is not None and PEER_SCHEDULES[found].generate(ranks, v, m) == plan.actions
    exp = torchtitan_export(plan, [f"layers.{i}" for i in range(plan.num_layers)])
    assert exp.csv is None and exp.training == {"local_batch_size": 2 * m}
    par = exp.parallelism
    assert par["pipeline_parallel_degree"] == ranks and par["pipeline_parallel_microbatch_size"] == 2
    assert par["module_fqns_per_model_part"] == [[f"layers.{i}" for i in range(s.lo, s.hi)] for s in plan.stages]
    assert tomllib.loads(exp.toml("a header"))["parallelism"] == par


def test_another_order_exports_as_a_csv_with_the_placements_schedule_name() -> None:
    plan = placed(4, [0, 1, 2, 3, 4], [0, 1, 1, 0], [[2, 2]] * 4,
                  ["0F0 0F1 3F0 3I0 3F1 3I1 3W0 3W1 0I0 0I1 0W0 0W1",
                   "1F0 1F1 2F0 2I0 2F1 2I1 1I0 1I1 2W0 2W1 1W0 1W1"])  # fmt: skip
    assert named_schedule(plan) is None
    exp = torchtitan_export(plan, ["a", "b", "c", "d"], csv_path="s.csv")
    assert exp.parallelism["pipeline_parallel_schedule"] == "ZBVZeroBubble"  # makes torchtitan place it V-shaped
    assert exp.parallelism["pipeline_parallel_schedule_csv"] == "s.csv"
    assert exp.csv is not None and parse_pipelining_csv(exp.csv) == plan.actions


def test_what_torchtitan_cannot_run_is_refused_with_the_reason() -> None:
    unequal = placed(6, [0, 1, 2], [0, 1], [[2, 4], [3, 3]], ["0F0 0F1 0B0 0B1", "1F0 1F1 1B0 1B1"])
    with pytest.raises(PlanError, match="equal microbatches only"):
        torchtitan_export(unequal, ["a", "b"])
    uneven = placed(5, [0, 1, 2], [0, 1], [[3, 2], [3, 2]], ["0F0 0F1 0B0 0B1", "1F0 1F1 1B0 1B1"])
    with pytest.raises(PlanError, match="one microbatch size that divides the batch"):
        torchtitan_export(uneven, ["a", "b"])
    odd = placed(2, [0, 1, 2, 3], [0, 1, 0], [[2]] * 3, ["0F0 2F0 2B0 0B0", "1F0 1B0"])
    with pytest.raises(PlanError, match="places its 3 stages on ranks"):
        torchtitan_export(odd, ["a", "b", "c"])


def test_module_names() -> None:
    assert module_names(["embedding", "block0"], sequential=True) == ["0", "1"]
    assert module_names(["tok_embeddings", "layers.0"], sequential=False) == ["tok_embeddings", "layers.0"]


def test_data_parallel_replicas_export_as_fsdp_beside_the_pipeline_with_a_note() -> None:
    plan = peer_plan("1F1B", 2, 1, 4, batch=8, layers=2)  # one replica's lists: B / D = 8
    dp = validate_plan(replace(plan, global_batch=24, data_parallel=3))
    exp = torchtitan_export(dp, ["a", "b"])
    assert exp.training == {"local_batch_size": 8, "global_batch_size": 24}
    par = exp.parallelism
    assert par["pipeline_parallel_degree"] == 2 and par["pipeline_parallel_microbatch_size"] == 2
    assert par["data_parallel_shard_degree"] == 3 and par["data_parallel_replicate_degree"] == 1
    assert par["pipeline_parallel_schedule"] == "1F1B"
    assert set(par) <= set(PARALLELISM_KEYS) and set(exp.training) <= set(TRAINING_KEYS)
    assert tomllib.loads(exp.toml())["training"] == exp.training
    (note,) = exp.notes
    assert "does not run beside pipeline parallelism" in note and "data_parallel_shard_degree = 3" in note
    # One replica: the export is what it always was, no data-parallel key, no note.
    single = torchtitan_export(plan, ["a", "b"])
    assert single.notes == () and not any(k.startswith("data_parallel") for k in single.parallelism)
    assert single.training == {"local_batch_size": 8}


def test_zero1_and_pp_inner_plans_say_what_torchtitan_does_instead() -> None:
    exp = torchtitan_export(example8("pp_inner", zero1=True), ["a", "b", "c", "d"])
    assert exp.parallelism["data_parallel_shard_degree"] == 2 and exp.training["local_batch_size"] == 4
    text = " ".join(exp.notes)
    assert "torchtitan has no ZeRO-1 setting" in text and "shards parameters and gradients too" in text
    assert "layout is pp_inner" in text and "(dp_inner) instead" in text


def test_the_export_command_writes_the_data_parallel_settings_and_says_what_differs(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from tests.strategies import uniform_profile
    from umsearch.cli.export import export_command
    from umsearch.core.plan_io import save_plan
    from umsearch.core.profile import save_profile

    save_profile(uniform_profile(layers=2), tmp_path / "prof.json")
    plan = validate_plan(replace(peer_plan("1F1B", 2, 1, 4, batch=8, layers=2), global_batch=16, data_parallel=2,
                                 zero1=True))  # fmt: skip
    save_plan(plan, tmp_path / "plan.json", profile="prof.json")
    res = CliRunner().invoke(export_command, [str(tmp_path / "plan.json"), "--format", "torchtitan", "--out",
                                              str(tmp_path / "tt"), "--json"])  # fmt: skip
    assert res.exit_code == 0, res.output
    cfg = tomllib.loads((tmp_path / "tt" / "torchtitan.toml").read_text())
    assert cfg["training"] == {"local_batch_size": 8, "global_batch_size": 16}
    assert cfg["parallelism"]["data_parallel_shard_degree"] == 2
    notes = " ".join(json.loads(res.stdout)["notes"])
    assert "exported as FSDP (data_parallel_shard_degree = 2)" in notes and "no ZeRO-1 setting" in notes
