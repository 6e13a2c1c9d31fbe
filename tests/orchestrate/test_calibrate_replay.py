"""``calibrate --replay``: the compute terms fitted from ranks replayed alone, the message terms and links kept,
the busy-time error of every probe held out reported; and tune's plain word on GPUs it does not have."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

from tests.strategies import uniform_profile
from umsearch.cli.main import cli
from umsearch.core.model_spec import ModelSpec
from umsearch.core.profile import Link, Profile, load_profile, save_profile
from umsearch.errors import PlanError
from umsearch.orchestrate.calibration import require_this_machine
from umsearch.orchestrate.fit import ActionSample, fit_runtime

MLP: dict[str, Any] = {"source": "mlp", "args": {"layers": 3, "width": 16}}  # 4 layers


def _profile() -> Profile:
    base = uniform_profile(layers=4, fwd=0.02, bwd=0.04, latency=0.3, bandwidth=2.0, message_overhead_ms=0.05)
    return dataclasses.replace(base, device="cpu: test", extra={**base.extra, "model_spec": MLP})


# ---------------------------------------------------------------------------
# The fit with the message terms kept
# ---------------------------------------------------------------------------


def test_kept_message_terms_leave_the_measured_side_and_the_rest_is_recovered_exactly() -> None:
    samples = []
    for i, (lo, hi) in enumerate([(0, 1), (1, 3), (3, 4), (0, 2)]):
        for n, base in enumerate((0.5, 1.0, 2.0)):
            s = 1.0 + 0.25 * (hi - lo - 1)  # s(1) = 1, s(2) = 1.25
            mib = 0.5 * n
            samples.append(ActionSample(plan=f"p{i}", measured_ms=s * base + 0.2 + 0.1 * n + 0.3 * mib, base_ms=base,
                                        lo=lo, hi=hi, messages=n, mib=mib))  # fmt: skip
    fit = fit_runtime(samples, messages=(0.1, 0.3))
    assert (fit.message_overhead_ms, fit.message_overhead_ms_per_mib) == (0.1, 0.3)  # as given
    assert fit.op_overhead_ms == pytest.approx(0.2, abs=1e-9)
    assert [(k, pytest.approx(s)) for k, s in fit.stage_scale] == [(1, 1.0), (2, 1.25)]
    assert fit.rms_residual_ms == pytest.approx(0.0, abs=1e-9)


# ---------------------------------------------------------------------------
# Replayed probes
# ---------------------------------------------------------------------------


def test_calibrating_from_replayed_ranks_fits_finite_compute_terms_and_keeps_the_links() -> None:
    from umsearch.orchestrate.calibration import calibrate_replay
    from umsearch.runtime.model_source import spec_factory

    prof = _profile()
    seen: list[str] = []
    calibrated, report = calibrate_replay(prof, spec_factory(ModelSpec.from_json(MLP), 0), rounds=1,
                                          on_probe=lambda i, n, name: seen.append(name))  # fmt: skip
    assert not torch.distributed.is_initialized()  # no process group: every rank ran alone
    assert seen == [r["probe"] for r in report["probe_rows"]] and len(seen) == 5
    rt = calibrated.runtime
    assert math.isfinite(rt.op_overhead_ms) and rt.op_overhead_ms >= 0
    assert rt.stage_scale and all(math.isfinite(s) and s > 0 for _, s in rt.stage_scale)
    # The link terms are the profile's: the message overheads as they were, the link untouched.
    assert (rt.message_overhead_ms, rt.message_overhead_ms_per_mib) == (0.05, 0.0)
    assert calibrated.link == prof.link and dataclasses.replace(calibrated, runtime=prof.runtime) == prof
    record = rt.calibration
    assert record is not None and record["judged"] == "busy_ms" and record["device"] == "cpu"
    assert "kept from the profile" in record["terms"]["message_overhead_ms"]
    assert "kept from the profile" in record["terms"]["links"]
    assert len(record["held_out"]) == 5 and math.isfinite(record["held_out_mape_percent"])
    assert all(r["measured_ms"] > 0 and math.isfinite(r["predicted_held_out_ms"]) for r in report["probe_rows"])
    assert report["actions"] > 50


def test_calibrate_replay_from_the_command_line(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    save_profile(_profile(), path)
    out = tmp_path / "c.json"
    res = CliRunner().invoke(cli, ["calibrate", str(path), "--replay", "--rounds", "1", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "kept from the profile, not fitted" in res.stdout and "held out (each probe predicted" in res.stdout
    assert "busy-time error of the replayed probes" in res.stdout
    calibrated = load_profile(out)
    assert calibrated.runtime.calibration is not None and calibrated.runtime.message_overhead_ms == 0.05
    doc = json.loads(CliRunner().invoke(cli, ["calibrate", str(path), "--replay", "--rounds", "1", "--out",
                                                            str(out), "--json"]).stdout)  # fmt: skip
    assert doc["judged"] == "busy_ms" and doc["held_out_mape_percent"] is not None


def test_device_without_replay_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    save_profile(_profile(), path)
    res = CliRunner().invoke(cli, ["calibrate", str(path), "--device", "cpu"])
    assert res.exit_code == 1 and "add --replay, or drop --device" in str(res.exception)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_a_cuda_profile_replays_on_cuda_by_default_and_says_there_is_none(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    save_profile(dataclasses.replace(_profile(), device="cuda: NVIDIA H100"), path)
    res = CliRunner().invoke(cli, ["calibrate", str(path), "--replay", "--rounds", "1"])
    assert res.exit_code == 1 and "torch sees no GPU on this machine: run it where one GPU is visible" in str(res.exception)
    res = CliRunner().invoke(cli, ["calibrate", str(path), "--replay", "--device", "cpu", "--rounds", "1"])
    assert res.exit_code == 1 and "calibrate --replay runs its plans on this machine's CPU" in str(res.exception)


# ---------------------------------------------------------------------------
# A CUDA profile without a GPU per rank
# ---------------------------------------------------------------------------


def test_a_cuda_profile_on_cpu_processes_points_at_replay() -> None:
    gpu = dataclasses.replace(_profile(), device="cuda: NVIDIA H200", link=Link(latency_ms=0.0, bandwidth_gb_per_s=1.0))
    with pytest.raises(PlanError, match="tune runs its plans on this machine's CPU, but the profile was measured on "
                                        "cuda: NVIDIA H200") as err:  # fmt: skip
        require_this_machine(gpu, "tune")
    assert "`umsearch replay PLAN --device cuda` times one rank at a time" in str(err.value)


def test_tune_on_cuda_with_fewer_gpus_than_ranks_says_how_many_it_needs(monkeypatch: pytest.MonkeyPatch) -> None:
    import umsearch.orchestrate.calibration as calibration

    gpu = dataclasses.replace(_profile(), device="cuda: NVIDIA H200")
    monkeypatch.setattr(calibration, "gpu_count", lambda: 1)
    with pytest.raises(PlanError) as err:
        require_this_machine(gpu, "tune", device_type="cuda", gpus_needed=4)
    assert str(err.value).startswith("tune runs every plan with one GPU per rank: it needs 4 GPUs, and torch sees 1 "
                                     "on this machine")  # fmt: skip
    assert "umsearch replay" in str(err.value) and "umsearch calibrate PROFILE --replay" in str(err.value)
    monkeypatch.setattr(calibration, "gpu_count", lambda: 4)
    require_this_machine(gpu, "tune", device_type="cuda", gpus_needed=4)  # enough: no error
