"""docs/model.md section 9's plan fields: read, written and refused with one line naming the value and the fix."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.contract import EXAMPLE3, example8
from umsearch.core.loader import load_plan_file
from umsearch.core.plan import Plan
from umsearch.core.plan_io import save_plan
from umsearch.errors import PlanError


def _example8_json(**changes: Any) -> dict[str, Any]:
    obj = example8().to_json()
    for key, value in changes.items():
        if value is None:
            obj.pop(key, None)
        else:
            obj[key] = value
    return obj


def _read(obj: dict[str, Any], tmp: Path) -> Plan:
    """The plan of ``obj`` written to a file and read through the gate."""
    path = tmp / "plan.json"
    path.write_text(json.dumps(obj))
    return load_plan_file(path).plan


def test_fields_round_trip(tmp_path: Path) -> None:
    for plan in (example8("dp_inner"), example8("pp_inner", zero1=True)):
        assert _read(plan.to_json(), tmp_path) == plan


def test_fields_as_written() -> None:
    obj = example8("pp_inner", zero1=True).to_json()
    assert obj["data_parallel"] == 2 and obj["layout"] == "pp_inner" and obj["zero1"] is True
    assert obj["cluster"] == {"gpus_per_node": 2, "intra": {"latency_ms": 0.5, "bandwidth_gb_per_s": 1.0},
                              "inter": {"latency_ms": 1.0, "bandwidth_gb_per_s": 0.1}}  # fmt: skip


def test_absent_fields_mean_one_replica_and_are_not_written(tmp_path: Any) -> None:
    plan = _read(EXAMPLE3.to_json(), tmp_path)
    assert (plan.data_parallel, plan.cluster, plan.layout, plan.zero1) == (1, None, "dp_inner", False)
    assert set(EXAMPLE3.to_json()) == {"schema", "global_batch", "ranks", "stages", "actions"}
    path = save_plan(EXAMPLE3, tmp_path / "p.json")
    assert not {"data_parallel", "cluster", "layout", "zero1"} & set(json.loads(path.read_text()))


def test_defaults_written_out_read_the_same(tmp_path: Path) -> None:
    """Spelling out the defaults changes nothing: ``data_parallel: 1``, ``layout: dp_inner``, ``zero1: false``."""
    obj = {**EXAMPLE3.to_json(), "data_parallel": 1, "layout": "dp_inner", "zero1": False}
    assert _read(obj, tmp_path) == EXAMPLE3


def _refused(obj: dict[str, Any], tmp: Path) -> str:
    with pytest.raises(PlanError) as info:
        _read(obj, tmp)
    message = str(info.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize(("changes", "names"), [
    ({"data_parallel": 3}, ["data_parallel = 3", "global_batch = 8", "divides"]),
    ({"data_parallel": 0}, ["data_parallel = 0", "between 1"]),
    ({"data_parallel": True}, ["data_parallel", "integer", "True"]),
    ({"data_parallel": 4}, ["sums to 4", "global_batch / data_parallel = 8 / 4 is 2"]),
    ({"data_parallel": None}, ["sums to 4", "global_batch is 8"]),
    ({"layout": "ring"}, ["layout = 'ring'", "'dp_inner' or 'pp_inner'"]),
    ({"zero1": "yes"}, ["zero1", "true or false", "'yes'"]),
    ({"cluster": {"gpus_per_node": 0, "intra": {}, "inter": {}}}, ["cluster.gpus_per_node = 0", "at least 1"]),
    ({"cluster": {"gpus_per_node": 2, "intra": {"latency_ms": 0, "bandwidth_gb_per_s": 1}}},
     ["cluster.", "'inter'", "add it"]),
    ({"cluster": {"gpus_per_node": 2, "intra": {"latency_ms": 0, "bandwidth_gb_per_s": 0},
                  "inter": {"latency_ms": 0, "bandwidth_gb_per_s": 1}}},
     ["cluster.intra.bandwidth_gb_per_s", "positive", "0"]),
    ({"cluster": {"gpus_per_node": 2, "intra": {"latency_ms": -1, "bandwidth_gb_per_s": 1},
                  "inter": {"latency_ms": 0, "bandwidth_gb_per_s": 1}}},
     ["cluster.intra.latency_ms", "non-negative", "-1"]),
    ({"cluster": {"gpus_per_node": 2, "intra": {"latency_ms": 0, "bandwidth_gb_per_s": 1},
                  "inter": {"latency_ms": 0, "bandwidth_gb_per_s": 1}, "nodes": 4}},
     ["cluster.", "'nodes'"]),
    ({"cluster": [2]}, ["cluster", "object"]),
    ({"cluster": {"gpus_per_node": 2, "intra": {"latency_ms": 0, "bandwidth_gb_per_s": 1e-300},
                  "inter": {"latency_ms": 0, "bandwidth_gb_per_s": 1}}},
     ["cluster.intra.bandwidth_gb_per_s = 1e-300 GB/s", "from 0.001 to 1e9 GB/s", "state bandwidth in GB/s"]),
    ({"cluster": {"gpus_per_node": 2, "intra": {"latency_ms": 0, "bandwidth_gb_per_s": 1},
                  "inter": {"latency_ms": 0, "bandwidth_gb_per_s": 1e300}}},
     ["cluster.inter.bandwidth_gb_per_s = 1e300 GB/s", "from 0.001 to 1e9 GB/s"]),
    ({"cluster": {"gpus_per_node": 2, "intra": {"latency_ms": 0, "bandwidth_gb_per_s": 1},
                  "inter": {"latency_ms": 1e300, "bandwidth_gb_per_s": 1}}},
     ["cluster.inter.latency_ms = 1e300 ms", "from 0 to 10000 ms"]),
])  # fmt: skip
def test_bad_fields_refused_in_one_line(changes: dict[str, Any], names: list[str], tmp_path: Path) -> None:
    message = _refused(_example8_json(**changes), tmp_path)
    for part in names:
        assert part in message, (part, message)


@pytest.mark.parametrize(("changes", "part"), [
    ({"data_parallel": 3}, "data_parallel = 3 does not divide"),
    ({"layout": "ring"}, "layout = 'ring'"),
])  # fmt: skip
def test_validate_plan_checks_plans_built_in_code(changes: dict[str, Any], part: str) -> None:
    import dataclasses

    from umsearch.core.plan_rules import validate_plan

    with pytest.raises(PlanError, match=part):
        validate_plan(dataclasses.replace(example8(), **changes))


def test_validate_plan_checks_the_cluster_built_in_code() -> None:
    import dataclasses

    from tests.contract import EXAMPLE8_CLUSTER
    from umsearch.core.plan_rules import validate_plan

    bad = dataclasses.replace(example8(), cluster=dataclasses.replace(EXAMPLE8_CLUSTER, gpus_per_node=0))
    with pytest.raises(PlanError, match="gpus_per_node = 0 must be at least 1"):
        validate_plan(bad)


def test_a_plan_file_with_a_bad_cluster_link_is_named(tmp_path: Any) -> None:
    obj = _example8_json()
    obj["cluster"]["inter"]["bandwidth_gb_per_s"] = 1e-300
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(obj))
    with pytest.raises(PlanError, match="cluster.inter.bandwidth_gb_per_s = 1e-300 GB/s is out of range") as info:
        load_plan_file(path)
    assert str(info.value).startswith(f"{path}: ")


# ---------------------------------------------------------------------------
# bucket_mib (version 2.3): absent means 2.2 in a replicated file, the default otherwise
# ---------------------------------------------------------------------------


def test_a_replicated_plan_file_without_bucket_mib_is_version_2_2(tmp_path: Path) -> None:
    obj = example8().to_json()
    assert obj["bucket_mib"] == 25
    del obj["bucket_mib"]
    assert _read(obj, tmp_path).bucket_mib is None


def test_bucket_mib_round_trips(tmp_path: Path) -> None:
    from dataclasses import replace

    for mib in (None, 0.5, 25.0, 100.0):
        for plan in (replace(example8(), bucket_mib=mib), replace(EXAMPLE3, bucket_mib=mib)):
            assert _read(plan.to_json(), tmp_path) == plan
    assert "bucket_mib" not in EXAMPLE3.to_json()  # one replica, the default: written as before
    assert replace(EXAMPLE3, bucket_mib=None).to_json()["bucket_mib"] is None


@pytest.mark.parametrize("bad", [0, -1, "25", True, float("inf"), 1e10])
def test_a_bad_bucket_mib_is_refused_in_one_line(bad: Any, tmp_path: Path) -> None:
    obj = {**example8().to_json(), "bucket_mib": bad}
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(obj).replace("Infinity", "1e999"))
    with pytest.raises(PlanError, match="bucket_mib"):
        load_plan_file(path)


@pytest.mark.parametrize("bad", [0, -1, float("inf"), 1e10])
def test_a_plan_built_in_code_with_a_bad_bucket_mib_is_refused(bad: float) -> None:
    from dataclasses import replace

    from umsearch.core.plan_rules import validate_plan

    with pytest.raises(PlanError, match="bucket_mib"):
        validate_plan(replace(example8(), bucket_mib=bad))
