"""Runtime-cost calibration: the probes are valid, a real run fits every term and reports held-out error."""

from __future__ import annotations

import dataclasses

import pytest

from tests.strategies import uniform_profile
from umsearch.core.deps import find_deadlock
from umsearch.orchestrate.calibration import probe_plans


def test_probes_split_the_layers_evenly() -> None:
    for name, plan in probe_plans(uniform_profile(layers=8)):
        sizes = {st.hi - st.lo for st in plan.stages}
        assert sizes == {8 // plan.num_stages}, name


def test_probes_cover_many_and_few_microbatches_and_the_split_only_when_profiled() -> None:
    names = [n for n, _ in probe_plans(uniform_profile(layers=8))]
    assert names == ["GPipe x2", "GPipe x16", "1F1B x8", "Interleaved1F1B x4 v2", "ZBVZeroBubble x8 v2"]
    no_split = [n for n, _ in probe_plans(uniform_profile(layers=8, split=False))]
    assert "ZBVZeroBubble x8 v2" not in no_split
    for _, plan in probe_plans(uniform_profile(layers=8)):
        assert not find_deadlock(plan) and plan.global_batch == 16


@pytest.mark.slow
def test_calibrating_a_zoo_model_runs_and_fits(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from umsearch.core.profile import Link
    from umsearch.measure.profiler import ProfileConfig, profile_model
    from umsearch.nn.models import ModelSpec, build_model
    from umsearch.orchestrate.calibration import calibrate
    from umsearch.runtime.model_source import spec_factory

    spec = ModelSpec.from_json({"source": "mlp", "args": {"layers": 4, "width": 64}})
    prof = profile_model(build_model(spec), spec, ProfileConfig(sizes=(1, 2, 4, 8), repeats=3),
                         link=Link(latency_ms=0.0, bandwidth_gb_per_s=1.0))  # fmt: skip
    calibrated, report = calibrate(prof, spec_factory(spec, 0), rounds=2)
    rt = calibrated.runtime
    assert rt.op_overhead_ms >= 0 and rt.message_overhead_ms >= 0 and rt.calibration is not None
    assert rt.stage_scale and all(s > 0 for _, s in rt.stage_scale)
    assert dataclasses.replace(calibrated, runtime=prof.runtime) == prof
    assert len(report["probe_rows"]) == 5 and report["actions"] > 50
    assert len(rt.calibration["held_out"]) == 5 and rt.calibration["held_out_mape_percent"] >= 0


@pytest.mark.slow
def test_profile_calibrate_and_calibrate_from_the_command_line(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json
    import subprocess
    import sys

    from umsearch.core.profile import load_profile

    def umsearch(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "umsearch", *args], capture_output=True, text=True, timeout=600,
                              check=False)  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout

    path = tmp_path / "p.json"
    out = umsearch("profile", "mlp", "--arg", "layers=4", "--arg", "width=32", "--sizes", "1,2,4,8,16", "--repeats",
                   "3", "--calibrate", "--out", str(path))  # fmt: skip
    assert "op overhead" in out and load_profile(path).runtime.calibration is not None
    report = json.loads(umsearch("calibrate", str(path), "--rounds", "2", "--out", str(tmp_path / "c.json"), "--json"))
    assert report["op_overhead_ms"] >= 0 and len(report["probe_rows"]) == 5
    assert load_profile(tmp_path / "c.json").runtime.op_overhead_ms == report["op_overhead_ms"]
