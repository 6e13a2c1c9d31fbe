"""The profiler on tiny models: real stash bytes, valid JSON, clean failures."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from umsearch.cli.profile_model import profile_command
from umsearch.core.profile import Link, profile_from_json
from umsearch.errors import ProfilingError
from umsearch.measure.stash import saved_bytes
from umsearch.nn.models import ModelSpec, build_model


def test_linear_saves_its_input() -> None:
    x = torch.randn(3, 5, requires_grad=True)
    _, n = saved_bytes(torch.nn.Linear(5, 7), x)
    assert n == 3 * 5 * 4


def test_relu_saves_its_output() -> None:
    x = torch.randn(4, 6, requires_grad=True)
    _, n = saved_bytes(torch.nn.ReLU(), x)
    assert n == 4 * 6 * 4


def test_shared_storage_counted_once() -> None:
    x = torch.randn(2, 8, requires_grad=True)
    _, n = saved_bytes(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh()), x)
    assert n == 2 * 8 * 4 * 2  # Linear's input + Tanh's output


def test_cli_writes_valid_profile(tmp_path: Path) -> None:
    out = tmp_path / "mlp.json"
    res = CliRunner().invoke(profile_command, ["mlp", "--arg", "layers=2", "--arg", "width=16", "--sizes", "1,2,4",
                                               "--repeats", "1", "--link-latency-ms", "0.1", "--link-bandwidth-gbps", "5", "--out", str(out)])  # fmt: skip
    assert res.exit_code == 0, res.output
    prof = profile_from_json(json.loads(out.read_text()))
    assert prof.microbatch_sizes == (1, 2, 4) and prof.num_layers == 3
    assert all(t > 0 for lay in prof.layers for t in lay.fwd_ms)
    assert prof.layers[0].stash_bytes == 64 * 4 + 16 * 4  # Linear input (in=64) + Tanh output
    assert prof.extra["model_spec"] == {"source": "mlp", "args": {"layers": 2, "width": 16}}


def test_user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "mymod_ums.py").write_text(
        "import torch\n"
        "def build(width=4):\n"
        "    layers = torch.nn.Sequential(torch.nn.Linear(3, width), torch.nn.Linear(width, 2))\n"
        "    return layers, lambda b, g: (torch.randn(b, 3, generator=g), torch.randn(b, 2, generator=g))\n"
        "def bad():\n    return 3\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    built = build_model(ModelSpec(source="mymod_ums:build", args={"width": 5}))
    assert len(built.layers) == 2
    x, y = built.make_batch(2, torch.Generator().manual_seed(0))
    assert built.loss(built.layers[1](built.layers[0](x)), y).ndim == 0
    with pytest.raises(ProfilingError, match="must return"):
        build_model(ModelSpec(source="mymod_ums:bad"))
    with pytest.raises(ProfilingError, match="has no function 'nope'"):
        build_model(ModelSpec(source="mymod_ums:nope"))
    with pytest.raises(ProfilingError, match="cannot import 'no_such_mod_xyz'"):
        build_model(ModelSpec(source="no_such_mod_xyz:build"))
    sys.modules.pop("mymod_ums", None)


def test_unknown_zoo_and_bad_arg() -> None:
    with pytest.raises(ProfilingError, match="unknown model 'resnet'"):
        build_model(ModelSpec(source="resnet"))
    with pytest.raises(ProfilingError, match="bad argument for zoo model mlp: .*'depth'.*it takes layers, width, inputs, classes"):
        build_model(ModelSpec(source="mlp", args={"depth": 3}))


@pytest.mark.parametrize("name", ["gpt", "vgg16", "mlp"])
def test_zoo_split_batch_gradient_equals_full(name: str) -> None:
    small = {"gpt": {"layers": 2, "width": 16, "heads": 2, "seq": 8, "vocab": 32}, "vgg16": {"width": 2}, "mlp": {"layers": 2, "width": 8}}
    built = build_model(ModelSpec(source=name, args=small[name]), seed=1)
    model = torch.nn.Sequential(*built.layers).double()
    x, y = built.make_batch(6, torch.Generator().manual_seed(0))
    if x.is_floating_point():
        x = x.double()
    built.loss(model(x), y).backward()
    full = []
    for p in model.parameters():
        assert p.grad is not None
        full.append(p.grad.clone())
    model.zero_grad()
    for lo, hi in ((0, 2), (2, 6)):
        (built.loss(model(x[lo:hi]), y[lo:hi]) * (hi - lo) / 6).backward()
    for a, p in zip(full, model.parameters(), strict=True):
        torch.testing.assert_close(p.grad, a, rtol=1e-9, atol=1e-12)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_profile(tmp_path: Path) -> None:
    """No link flags: one GPU states the default preset (and says so), two or more measure NCCL."""
    res = CliRunner().invoke(profile_command, ["mlp", "--device", "cuda", "--sizes", "1,2", "--repeats", "1",
                                               "--dtype", "bf16", "--out", str(tmp_path / "p.json")])  # fmt: skip
    assert res.exit_code == 0, res.output
    doc = json.loads((tmp_path / "p.json").read_text())
    assert doc["device"].startswith("cuda: ") and doc["precision"] == "bf16"
    assert doc["measurement"]["timing"].startswith("CUDA events")
    assert doc["link_source"]["measured"] == (torch.cuda.device_count() >= 2)
    if torch.cuda.device_count() < 2:
        assert res.output.count("stated, not measured") == 1


def test_cuda_without_gpu_is_a_clear_error() -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    res = CliRunner().invoke(profile_command, ["mlp", "--device", "cuda"])
    assert isinstance(res.exception, ProfilingError) and "no CUDA GPU" in str(res.exception)


def test_fit_link_recovers_known_values() -> None:
    from umsearch.measure.link import fit_link

    sizes = [1e3, 1e5, 1e6, 4e6]
    times = [0.2 + n / (5.0 * 1e6) for n in sizes]  # 0.2 ms, 5 GB/s
    lat, bw = fit_link(sizes, times)
    assert lat == pytest.approx(0.2, rel=1e-9) and bw == pytest.approx(5.0, rel=1e-9)
    with pytest.raises(ProfilingError, match="two different sizes"):
        fit_link([10, 10], [1, 2])
    with pytest.raises(ProfilingError, match="outside what a profile holds"):  # 1e12 GB/s: no real link
        fit_link([1e3, 1e6], [0.2, 0.2 + 1e-12])


def test_fit_link_is_not_swayed_by_the_largest_message() -> None:
    from umsearch.measure.link import fit_link

    # Times this machine measured under load (fastest of 10 rounds, ms): a plain least-squares line
    # through them crosses zero below the smallest message (latency -0.09 ms, clamped to 0); the fit
    # on relative errors keeps the latency the small messages show.
    raw = {1 << 10: 0.093, 1 << 14: 0.06, 1 << 18: 0.175, 1 << 20: 0.357, 1 << 22: 1.77, 1 << 24: 9.23}
    lat, bw = fit_link(list(raw), list(raw.values()))
    assert 0.03 < lat < 0.1 and 1.5 < bw < 3.5


@pytest.mark.slow
def test_measure_link_two_processes() -> None:
    from umsearch.measure.link import link_times

    # The mechanics only: two processes time every size. Whether the times grow with the size is
    # the machine's business (under load, a median once reversed even 1 KiB vs 4 MiB); fit_link is
    # tested on known and measured values above.
    raw = link_times("gloo", sizes=(1 << 10, 1 << 22), repeats=3)
    assert set(raw) == {1 << 10, 1 << 22} and all(t > 0 for t in raw.values())


class _GradProbe(torch.nn.Linear):
    """A Linear that records whether each input it sees requires grad."""

    def __init__(self) -> None:
        super().__init__(4, 3)
        self.seen: list[bool] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(x.requires_grad)
        return super().forward(x)


def _unit(module: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, *, first: bool, last: bool = False):  # type: ignore[no-untyped-def]
    from umsearch.measure.burst import Unit

    return Unit(module=module, x=x, y=y, loss=torch.nn.functional.mse_loss, first=first, last=last)


@pytest.mark.parametrize("first", [True, False])
def test_only_the_first_layer_gets_a_data_input(first: bool) -> None:
    from umsearch.measure.burst import burst

    probe = _GradProbe()
    got = burst(_unit(probe, torch.randn(2, 4), torch.randn(2, 3), first=first), device=torch.device("cpu"),
                in_flight=2, split=False)  # fmt: skip
    # Stage 0 gets data: no input gradient is computed (or timed); later layers get activations.
    assert probe.seen and set(probe.seen) == {not first}
    assert len(got["fwd"]) == 2 and all(t > 0 for t in got["fwd"]) and len(got["bwd"]) == 2


def test_last_layer_stash_includes_what_the_loss_saves() -> None:
    from umsearch.measure.stash import saved_bytes

    b = 2
    x, y = torch.randn(b, 5, requires_grad=True), torch.randn(b, 3)
    lin = torch.nn.Linear(5, 3)
    _, inner = saved_bytes(lin, x)
    _, last = saved_bytes(lin, x, lambda out: torch.nn.functional.mse_loss(out, y))
    # Linear keeps its input (b*5 floats); mse_loss keeps the output and the target (b*3 each).
    assert inner == b * 5 * 4
    assert last == b * (5 + 3 + 3) * 4


class _AliveCounter(torch.nn.Linear):
    """Counts how many of its outputs are alive at once, and how many backwards ran."""

    def __init__(self) -> None:
        super().__init__(4, 4)
        self.alive: set[int] = set()
        self.most_alive = 0
        self.backwards = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import weakref

        out = super().forward(x)
        key = id(out)
        self.alive.add(key)
        self.most_alive = max(self.most_alive, len(self.alive))
        weakref.finalize(out, self.alive.discard, key)

        def counted(g: torch.Tensor) -> torch.Tensor:
            self.backwards += 1
            return g

        out.register_hook(counted)
        return out


def test_forwards_are_timed_with_earlier_graphs_alive_as_in_a_pipeline() -> None:
    from umsearch.measure.burst import burst
    from umsearch.measure.profiler import IN_FLIGHT

    probe = _AliveCounter()
    got = burst(_unit(probe, torch.randn(3, 4), torch.randn(3, 4), first=False), device=torch.device("cpu"),
                in_flight=IN_FLIGHT, split=True)  # fmt: skip
    # Every forward's graph stays alive until the backwards, as on a pipeline stage; each is back-propagated.
    assert probe.most_alive == IN_FLIGHT
    # (a W seeded at the layer's own node passes its output hook again, so split ones count twice)
    assert probe.backwards >= IN_FLIGHT
    assert len(got["bwd"]) + len(got["bwd_input"]) == IN_FLIGHT and len(got["bwd_weight"]) == len(got["bwd_input"])
    assert all(t > 0 for q in ("fwd", "bwd", "bwd_input", "bwd_weight") for t in got[q])


def test_parameter_free_first_layer_has_no_backward() -> None:
    from umsearch.measure.burst import burst

    got = burst(_unit(torch.nn.Tanh(), torch.randn(3, 4), torch.randn(3, 4), first=True), device=torch.device("cpu"),
                in_flight=2, split=True)  # fmt: skip
    assert all(t > 0 for t in got["fwd"]) and set(got["bwd"] + got["bwd_input"] + got["bwd_weight"]) == {0.0}


def test_isotonic_fit_never_decreases_and_keeps_the_raw_medians() -> None:
    from umsearch.measure.curves import fit_curve

    curve = fit_curve([[1.0, 1.2, 0.9], [3.0, 0.5, 0.6], [2.0, 2.1, 1.9], [4.0]])
    assert curve.raw == (1.0, 0.6, 2.0, 4.0)
    assert all(a <= b for a, b in zip(curve.fitted, curve.fitted[1:], strict=False))
    # Sizes 1 and 2 violate the order: one block, the median of their six samples.
    assert curve.fitted == (0.95, 0.95, 2.0, 4.0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.floats(0.0, 100.0), min_size=1, max_size=5), min_size=1, max_size=8))
def test_isotonic_fit_is_monotone(samples: list[list[float]]) -> None:
    from umsearch.measure.curves import isotonic_median

    fitted = isotonic_median(samples)
    assert len(fitted) == len(samples) and all(a <= b for a, b in zip(fitted, fitted[1:], strict=False))


def test_structurally_identical_layers_are_pooled() -> None:
    from umsearch.measure.pooling import module_signature, pool_groups

    torch.manual_seed(0)
    layers = [torch.nn.Linear(4, 4), torch.nn.Linear(4, 4), torch.nn.Linear(4, 8), torch.nn.Linear(4, 4)]
    # Same types and shapes pool whatever the weights; another shape does not.
    assert pool_groups([module_signature(m) for m in layers]) == [[0, 1, 3], [2]]


def test_a_profile_of_identical_blocks_gives_identical_estimates() -> None:
    from umsearch.measure.profiler import ProfileConfig, profile_model
    from umsearch.nn.models import ModelSpec, build_model

    spec = ModelSpec.from_json({"source": "mlp", "args": {"layers": 4, "width": 32}})
    prof = profile_model(build_model(spec), spec, ProfileConfig(sizes=(1, 2, 4), repeats=3),
                         link=Link(latency_ms=0.0, bandwidth_gb_per_s=1.0))  # fmt: skip
    blocks = prof.layers[1:4]
    assert all(lay.fwd_ms == blocks[0].fwd_ms and lay.bwd_ms == blocks[0].bwd_ms for lay in blocks)
    assert [1, 2, 3] in prof.extra["pooled"]
    for lay in prof.layers:
        for curve in (lay.fwd_ms, lay.bwd_ms):
            assert all(a <= b for a, b in zip(curve, curve[1:], strict=False))
    assert prof.extra["quality"]["verdict"] in {"good", "noisy", "unjudged", "inconsistent"}
    assert prof.extra["quality"]["message"]


def test_the_verdict_tells_a_busy_machine_from_layers_that_vary_by_themselves() -> None:
    from umsearch.measure.quality import Thresholds, verdict

    rows = [{"layer": 0, "name": "conv", "share": 1.0, "spread": {"fwd": 0.4, "bwd": 0.05}, "fit_change": 0.0}]
    cal = {"ranges": 0, "worst_error": 0.0, "limit": 0.15, "ok": True}
    word, busy = verdict(rows, cal, rounds=15, cpu_share=0.45, t=Thresholds())
    assert word == "noisy" and "the machine is busy" in busy and "--repeats" in busy
    word, own = verdict(rows, cal, rounds=15, cpu_share=1.0, t=Thresholds())
    assert word == "noisy" and "busy" not in own and "100% of a CPU" in own and "good to about 10%" in own


class _FakeEvent:
    """Stands in for ``torch.cuda.Event``: records when it was recorded, in host syncs so far."""

    log: list[tuple[str, int]] = []
    syncs = 0

    def __init__(self, enable_timing: bool = False) -> None:
        assert enable_timing
        self.at = -1

    def record(self) -> None:
        self.at = len(_FakeEvent.log)
        _FakeEvent.log.append(("record", _FakeEvent.syncs))

    def elapsed_time(self, end: _FakeEvent) -> float:
        return float(end.at - self.at)


def test_gpu_bursts_time_calls_back_to_back_without_host_syncs(monkeypatch: pytest.MonkeyPatch) -> None:
    """On CUDA every call sits between two events and the host waits only before the burst and when it
    reads the times: no sync between layers (the CPU path keeps one per call)."""
    from umsearch.measure import burst as burst_module

    def sync(device: torch.device) -> None:
        _FakeEvent.syncs += 1

    _FakeEvent.log, _FakeEvent.syncs = [], 0
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(burst_module, "_sync", sync)
    unit = burst_module.Unit(module=torch.nn.Linear(4, 4), x=torch.randn(3, 4), y=torch.randn(3, 4),
                             loss=torch.nn.functional.mse_loss, first=False, last=False)  # fmt: skip
    got = burst_module.burst(unit, device=torch.device("cuda", 0), in_flight=4, split=True)
    assert {q: len(v) for q, v in got.items()} == {"fwd": 4, "bwd": 2, "bwd_input": 2, "bwd_weight": 2}
    assert len(_FakeEvent.log) == 2 * 10  # a start and an end event around every call
    assert {syncs for _, syncs in _FakeEvent.log} == {1}  # every event recorded after the one sync before
    assert _FakeEvent.syncs == 1 + 1  # ... and one when the times are read
    assert all(t == 1.0 for ts in got.values() for t in ts)  # each interval spans exactly its own call


@pytest.mark.parametrize(("layer", "width", "window"), [(0, 4, (0, 4)), (5, 4, (4, 8)), (9, 4, (6, 10)),
                                                      (3, 1, (3, 4)), (2, 30, (0, 10))])  # fmt: skip
def test_the_context_window_holds_the_layer_centred_within_the_model(layer: int, width: int,
                                                                      window: tuple[int, int]) -> None:  # fmt: skip
    from umsearch.measure.profiler import context_window

    assert context_window(layer, 10, width) == window


class _Calls(torch.nn.Linear):
    """Counts its forwards and the backwards that reach it."""

    def __init__(self) -> None:
        super().__init__(4, 4)
        self.forwards = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.forwards += 1
        return super().forward(x)


def test_a_burst_among_neighbours_runs_them_all_and_times_only_its_layer() -> None:
    from umsearch.measure.burst import Unit, burst

    before, timed, after = _Calls(), _Calls(), _Calls()
    unit = Unit(module=timed, x=torch.randn(3, 4), y=torch.randn(3, 4), loss=torch.nn.functional.mse_loss,
                first=True, last=True, before=(before,), after=(after,))  # fmt: skip
    reached: list[int] = []
    before.weight.register_hook(lambda g: reached.append(1))  # type: ignore[arg-type,return-value]
    got = burst(unit, device=torch.device("cpu"), in_flight=4, split=True)
    # Every microbatch runs through the window, the loss after its last layer; one sample per call of
    # the timed layer only.
    assert before.forwards == timed.forwards == after.forwards == 4
    assert {q: len(v) for q, v in got.items()} == {"fwd": 4, "bwd": 2, "bwd_input": 2, "bwd_weight": 2}
    assert all(t > 0 for v in got.values() for t in v)
    # Every backward reached the first layer's weights (two B, two W), and nothing is left behind.
    assert len(reached) == 4
    assert all(p.grad is None for m in (before, timed, after) for p in m.parameters())
