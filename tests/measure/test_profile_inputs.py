"""``umsearch profile`` refuses what it cannot use before it measures anything (issue 24's profile
findings, one line each), states links from presets, and records the precision it measured in."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from umsearch.cli.profile_model import link_choice, profile_command
from umsearch.core.links import ONE_GPU_DEFAULT, PRESETS
from umsearch.core.profile import load_profile, profile_from_json, profile_precision
from umsearch.errors import OutputError, ProfilingError, UmsearchError

LINK = ["--link-latency-ms", "0.1", "--link-bandwidth-gbps", "5"]
TINY = ["mlp", "--arg", "layers=2", "--arg", "width=8", "--sizes", "1,2", "--repeats", "1"]

# (arguments, the refusal's words). Every one is refused before the model is measured.
REFUSED = [
    (["mlp", "--link-latency-ms", "0.1", "--link-bandwidth-gbps", "inf"], "--link-bandwidth-gbps inf must be a finite number"),
    (["mlp", "--link-latency-ms", "nan", "--link-bandwidth-gbps", "5"], "--link-latency-ms nan must be a finite number"),
    (["mlp", "--link-latency-ms", "1e300", "--link-bandwidth-gbps", "5"], "--link-latency-ms 1e+300 must be a finite number from 0 to 10000"),
    (["mlp", "--link-latency-ms", "0.1", "--link-bandwidth-gbps", "1e-300"], "--link-bandwidth-gbps 1e-300 must be a finite number from 0.001 to 1e+09"),
    (["mlp", "--link-latency-ms", "-1", "--link-bandwidth-gbps", "5"], "--link-latency-ms -1.0 must be a finite number from 0"),
    (["mlp", "--link-latency-ms", "0.1", "--link-bandwidth-gbps", "0"], "--link-bandwidth-gbps 0.0 must be a finite number from 0.001"),
    (["mlp", "--link-latency-ms", "0.1"], "give both --link-latency-ms and --link-bandwidth-gbps"),
    (["mlp", "--link-preset", "nvlink4", *LINK], "--link-preset nvlink4 and --link-latency-ms/--link-bandwidth-gbps both"),
    (["gpt", "--arg", "heads=0", *LINK], "zoo model gpt: --arg heads=0 must be an integer from 1 to 1024"),
    (["gpt", "--arg", "layers=-1", *LINK], "zoo model gpt: --arg layers=-1 must be an integer from 1 to"),
    (["gpt", "--arg", "heads=3", *LINK], "heads=3 must divide width=128"),
    (["gpt", "--arg", "width=2.5", *LINK], "--arg width=2.5 must be an integer"),
    (["vgg16", "--arg", "image=40", *LINK], "image=40 must be a multiple of 32"),
    (["mlp", "--sizes", "1,3000000000", *LINK], "has size 3000000000, above the largest microbatch size"),
    (["mlp", "--dtype", "tf32", *LINK], "--dtype tf32 is a GPU mode"),
    (["mlp", "--memory-limit-gb", "-1", *LINK], "--memory-limit-gb -1.0 must be a finite number above 0"),
    (["mlp", "--memory-limit-gb", "inf", *LINK], "--memory-limit-gb inf must be a finite number above 0"),
    (["mlp", "--dtype", "bf16", "--calibrate", *LINK], "--calibrate runs its probe plans in fp32 on CPU ranks"),
]


@pytest.fixture
def no_measuring(monkeypatch: pytest.MonkeyPatch) -> None:
    """Measuring anything (a layer or the link) fails the test: refusals must come first."""

    def boom(*args: object, **kwargs: object) -> None:
        raise AssertionError("measured before refusing")

    monkeypatch.setattr("umsearch.measure.profiler.profile_model", boom)
    monkeypatch.setattr("umsearch.measure.link.measure_link", boom)


@pytest.mark.parametrize(("args", "words"), REFUSED, ids=[" ".join(a) for a, _ in REFUSED])
def test_refused_before_measuring(args: list[str], words: str, tmp_path: Path, no_measuring: None) -> None:
    res = CliRunner().invoke(profile_command, [*args, "--out", str(tmp_path / "p.json")])
    assert isinstance(res.exception, UmsearchError), res.output
    assert words in str(res.exception) and "\n" not in str(res.exception)
    assert not (tmp_path / "p.json").exists()


def test_an_output_inside_a_regular_file_is_refused_before_measuring(tmp_path: Path, no_measuring: None) -> None:
    (tmp_path / "file").write_text("mine")
    res = CliRunner().invoke(profile_command, [*TINY, *LINK, "--out", str(tmp_path / "file" / "p.json")])
    assert isinstance(res.exception, OutputError) and "is a file, not a folder" in str(res.exception)
    assert (tmp_path / "file").read_text() == "mine"


def test_a_size_that_cannot_fit_is_refused_from_its_estimate(tmp_path: Path) -> None:
    """1,000,000,000 samples are never allocated: size 1's bytes per sample say it would not fit."""
    res = CliRunner().invoke(profile_command, [*TINY[:5], "--sizes", "1,1000000000", *LINK,
                                               "--out", str(tmp_path / "p.json")])  # fmt: skip
    assert isinstance(res.exception, ProfilingError), res.output
    message = str(res.exception)
    assert "size 1000000000 would need about" in message and "e.g. --sizes 1," in message and "\n" not in message


def test_a_preset_states_the_link_and_says_so_once(tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    res = CliRunner().invoke(profile_command, [*TINY, "--link-preset", "ib-ndr", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert res.output.count("stated, not measured") == 1
    prof = load_profile(out)
    ndr = PRESETS["ib-ndr"]
    assert (prof.link.latency_ms, prof.link.bandwidth_gb_per_s) == (ndr.latency_ms, ndr.bandwidth_gb_per_s)
    assert prof.extra["link_source"]["measured"] is False and prof.extra["link_source"]["preset"] == "ib-ndr"


def test_stated_numbers_are_recorded_as_stated(tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    res = CliRunner().invoke(profile_command, [*TINY, *LINK, "--out", str(out)])
    assert res.exit_code == 0, res.output
    source = json.loads(out.read_text())["link_source"]
    assert source["measured"] is False and source["latency_ms"] == 0.1 and source["bandwidth_gb_per_s"] == 5.0


def test_every_preset_names_its_source() -> None:
    for preset in PRESETS.values():
        assert preset.latency_ms > 0 and preset.bandwidth_gb_per_s > 0 and preset.source and preset.what


def test_one_gpu_takes_the_default_preset_and_two_measure(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda = torch.device("cuda", 0)  # a device object needs no GPU
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert link_choice(None, None, None, cuda).preset == ONE_GPU_DEFAULT
    assert link_choice(None, None, "pcie5", cuda).preset == "pcie5"
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    two = link_choice(None, None, None, cuda)
    assert two.preset is None and not two.stated  # measured over NCCL, as before
    assert not link_choice(None, None, None, torch.device("cpu")).stated  # CPU: measured over gloo


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_the_precision_is_a_field_of_its_own(dtype: str, tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    res = CliRunner().invoke(profile_command, [*TINY, *LINK, "--dtype", dtype, "--out", str(out)])
    assert res.exit_code == 0, res.output
    prof = load_profile(out)
    switches = prof.extra["measurement"]["precision"]
    assert profile_precision(prof) == dtype and switches["precision"] == dtype
    assert switches["matmul_allow_tf32"] is False and switches["cudnn_allow_tf32"] is False  # set, not defaults
    assert switches["autocast"] == {"bf16": "bfloat16", "fp16": "float16", "fp32": None}[dtype]
    assert (switches["loss_scaling"] is not None) == (dtype == "fp16")


def test_a_profile_without_precision_loads_as_unknown(tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    assert CliRunner().invoke(profile_command, [*TINY, *LINK, "--out", str(out)]).exit_code == 0
    doc = json.loads(out.read_text())
    del doc["precision"]
    assert profile_precision(profile_from_json(doc)) is None
    doc["precision"] = "fp8"
    with pytest.raises(UmsearchError, match="'precision' is 'fp8'; it takes one of fp32, tf32, bf16, fp16"):
        profile_precision(profile_from_json(doc))
