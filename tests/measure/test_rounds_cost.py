"""What the timing rounds cost: windows that time pooled groups once, adaptive stopping, partial profiles.

Every burst here is a fake with known times (no timing is asserted): the tests count bursts and samples.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from umsearch.core.profile import Link, check_not_partial, profile_from_json, profile_partial
from umsearch.errors import ProfileError
from umsearch.measure import profiler
from umsearch.measure.burst import Unit
from umsearch.measure.rounds import cover_windows, windows_holding
from umsearch.measure.stopping import converged, median_half_width, relative_half_width
from umsearch.nn.models import ModelSpec, build_model

LINK = Link(latency_ms=0.0, bandwidth_gb_per_s=1.0)
SPEC = ModelSpec(source="mlp", args={"layers": 7, "width": 8})
"""linear0 (from the inputs), linear1..linear6 (identical: one pooled group), classifier: 8 layers."""


class FakeBursts:
    """Stands in for the profiler's bursts: logs every window burst, gives each call ``value(n)`` ms."""

    def __init__(self, value: Any = None, interrupt_at: int | None = None) -> None:
        self.windows: list[tuple[int, int, int, tuple[int, ...]]] = []  # (size, lo, hi, timed positions)
        self.spans = 0
        self.value = value or (lambda n: 1.0)
        self.interrupt_at = interrupt_at
        self.layers: list[torch.nn.Module] = []  # the model's, to tell a window's first layer

    def _tick(self) -> float:
        n = len(self.windows) + self.spans
        if self.interrupt_at is not None and n >= self.interrupt_at:
            raise KeyboardInterrupt
        return float(self.value(n))

    @staticmethod
    def _times(v: float, in_flight: int) -> dict[str, list[float]]:
        k = in_flight - in_flight // 2
        return {"fwd": [v] * in_flight, "bwd": [2 * v] * k, "bwd_input": [v] * (in_flight - k),
                "bwd_weight": [v] * (in_flight - k)}  # fmt: skip

    def window(self, unit: Unit, *, device: torch.device, in_flight: int, split: bool,
               timed: tuple[int, ...]) -> dict[int, dict[str, list[float]]]:  # fmt: skip
        v = self._tick()
        b = int(unit.x.shape[0])
        lo = next(i for i, m in enumerate(self.layers) if m is unit.module)
        self.windows.append((b, lo, lo + len(unit.window), timed))
        return {p: self._times(v, in_flight) for p in timed}

    def span(self, unit: Unit, *, device: torch.device, in_flight: int, split: bool) -> dict[str, list[float]]:
        v = self._tick()
        self.spans += 1
        return self._times(v * 4, in_flight)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeBursts]:
    f = FakeBursts()
    monkeypatch.setattr(profiler, "burst_window", f.window)
    monkeypatch.setattr(profiler, "burst", f.span)
    yield f


def _profile(fake: FakeBursts, **config: Any) -> Any:
    built = build_model(SPEC)
    fake.layers = list(built.layers)
    cfg = profiler.ProfileConfig(sizes=(1, 2, 4), **config)
    return profiler.profile_model(built, SPEC, cfg, link=LINK)


# ------------------------------------------------------------------------------ windows and pooling
def test_the_cover_holds_every_group_with_few_windows() -> None:
    groups = [[0], [1, 2, 3, 4, 5, 6], [7]]
    assert cover_windows(groups, 8, 4) == [(0, 4), (4, 8)]  # the pooled group needs no window of its own
    assert cover_windows([[i] for i in range(8)], 8, 4) == [(0, 4), (4, 8)]  # distinct layers: a tiling
    alone = [cover_windows(groups, 8, 1, rotation=r) for r in range(8)]
    assert all(len(w) == 3 for w in alone)
    # Timed alone, the pooled group is one burst a round, at every member over the rounds.
    assert {next(lo for lo, _ in w if 1 <= lo <= 6) for w in alone} == {1, 2, 3, 4, 5, 6}
    assert windows_holding(0, 8, 4) == [(0, 4)] and windows_holding(5, 8, 4) == [(2, 6), (3, 7), (4, 8)]


@pytest.mark.parametrize(("context", "bursts_per_size"), [(1, 3), (4, 2)])
def test_a_pooled_group_costs_one_burst_a_round_at_most(fake: FakeBursts, context: int,
                                                        bursts_per_size: int) -> None:  # fmt: skip
    prof = _profile(fake, repeats=3, warmup_rounds=1, calibration_rounds=0, stop_precision_pct=0,
                    context_layers=context)  # fmt: skip
    assert prof.extra["pooled"] == [[1, 2, 3, 4, 5, 6]]
    rounds = 1 + 3
    assert len(fake.windows) == rounds * 3 * bursts_per_size  # (warm-up + timed) x sizes x windows
    for b in (1, 2, 4):
        per_round = [w for w in fake.windows if w[0] == b]
        assert len(per_round) == rounds * bursts_per_size
        # Every layer of every window is timed (no untimed context layers).
        assert all(timed == tuple(range(hi - lo)) for _, lo, hi, timed in per_round)
    if context == 1:  # the pooled group: one member a round, never two
        members = [lo for b, lo, _, _ in fake.windows if b == 1 and 1 <= lo <= 6]
        assert len(members) == rounds
    stopping = prof.extra["measurement"]["stopping"]
    assert stopping["rounds_per_cell"] == {"min": 3, "median": 3, "max": 3}
    # Identical layers get identical estimates.
    assert len({prof.layers[i].fwd_ms for i in range(1, 7)}) == 1


# -------------------------------------------------------------------------------- stopping rule
def test_the_median_is_known_to_z_times_its_standard_error() -> None:
    # IQR of 1..5 (inclusive quartiles) is 2: half-width 1.645 * 0.93 * 2 / sqrt(5) at 90%.
    assert median_half_width([3.0, 1.0, 2.0, 5.0, 4.0]) == pytest.approx(1.6449 * 0.93 * 2 / math.sqrt(5), rel=1e-4)
    assert median_half_width([3.0, 1.0, 2.0, 5.0, 4.0], 0.95) > median_half_width([3.0, 1.0, 2.0, 5.0, 4.0])
    # One round a burst of load hit barely moves it.
    assert median_half_width([1.0, 1.0, 1.0, 1.0, 9.0]) == 0.0
    assert relative_half_width([0.0] * 6) == 0.0  # a layer without backward is known exactly
    assert math.isinf(relative_half_width([1.0]))


def _spread(n: int, width: float) -> list[float]:
    """``n`` samples evenly over ``1 +- width`` (known spread; their order does not matter)."""
    return [1.0 + width * (2 * k / (n - 1) - 1) for k in range(n)]


def test_a_steady_cell_stops_after_the_minimum_rounds_and_not_before() -> None:
    steady = _spread(5, 0.02)  # +-2% evenly: IQR 2%, half-width 1.645 * 0.93 * 2% / sqrt(5) = 1.4%
    assert not converged({"fwd": steady[:4]}, precision=0.05, min_rounds=5)
    assert converged({"fwd": steady}, precision=0.05, min_rounds=5)
    assert not converged({"fwd": steady}, precision=0.01, min_rounds=5)
    assert not converged({"fwd": steady}, precision=0.0, min_rounds=5)  # 0: never stops early


def test_a_noisy_cell_runs_until_its_median_is_known() -> None:
    # +-20% evenly: IQR 20%, half-width 1.645 * 0.93 * 20% / sqrt(n): known to 10% from n = 10 on.
    runs = {n: converged({"fwd": _spread(n, 0.2)}, precision=0.1, min_rounds=5) for n in range(5, 40)}
    first = min(n for n, ok in runs.items() if ok)
    for n in range(5, first):
        assert relative_half_width(_spread(n, 0.2)) > 0.1
    assert relative_half_width(_spread(first, 0.2)) <= 0.1 and first == 10
    # A quantity far below the floor (1% of the model) is judged against the floor.
    assert converged({"fwd": _spread(5, 0.2), "bwd": [0.001 * x for x in _spread(5, 0.5)]}, precision=0.25,
                     floor_ms=0.1)  # fmt: skip
    assert not converged({"fwd": _spread(5, 0.2), "bwd": [0.001 * x for x in _spread(5, 0.5)]}, precision=0.25)


def test_the_rounds_stop_when_every_cell_is_known(fake: FakeBursts) -> None:
    prof = _profile(fake, repeats=15, warmup_rounds=1, calibration_rounds=2, context_layers=4)
    stopping = prof.extra["measurement"]["stopping"]
    assert stopping["rounds_run"] == 5 and stopping["rounds_per_cell"]["max"] == 5
    assert stopping["cells_stopped_early"] == stopping["cells"] == 9
    assert len(fake.windows) == (1 + 5) * 3 * 2 and fake.spans > 0  # calibration within the minimum rounds
    assert prof.extra["quality"]["rounds"] == 5 and "partial" not in prof.extra
    assert prof.layers[1].fwd_ms == (1.0, 1.0, 1.0)


def test_noisy_cells_run_every_round(monkeypatch: pytest.MonkeyPatch) -> None:
    f = FakeBursts(value=lambda n: 1.0 + 0.5 * ((n * 7919) % 13) / 13)
    monkeypatch.setattr(profiler, "burst_window", f.window)
    monkeypatch.setattr(profiler, "burst", f.span)
    prof = _profile(f, repeats=7, warmup_rounds=0, calibration_rounds=0, context_layers=4, stop_precision_pct=2)
    assert prof.extra["measurement"]["stopping"]["rounds_per_cell"]["min"] == 7


# ------------------------------------------------------------------------------- partial profiles
def test_ctrl_c_keeps_what_was_measured_as_a_partial_profile(monkeypatch: pytest.MonkeyPatch) -> None:
    per_round = 3 * 2  # sizes x windows
    f = FakeBursts(interrupt_at=per_round * 3 + 2)  # warm-up, two whole timed rounds, two bursts of the third
    monkeypatch.setattr(profiler, "burst_window", f.window)
    monkeypatch.setattr(profiler, "burst", f.span)
    with pytest.raises(profiler.ProfileInterrupted) as stop:
        _profile(f, repeats=15, warmup_rounds=1, calibration_rounds=0, context_layers=4, stop_precision_pct=0)
    prof = stop.value.profile
    assert isinstance(stop.value, KeyboardInterrupt) and type(stop.value.cause) is KeyboardInterrupt
    reason = profile_partial(prof)
    assert reason is not None and "interrupted (Ctrl-C) after 3 of at most 15 timed rounds" in reason
    assert prof.microbatch_sizes == (1, 2, 4) and prof.extra["partial"]["rounds"] == 3
    assert prof.extra["measurement"]["stopping"]["rounds_per_cell"]["min"] == 2  # some: the two whole rounds
    assert prof.extra["quality"]["rounds"] == 3
    back = profile_from_json(json.loads(json.dumps(prof.to_json())))
    assert profile_partial(back) == reason and back.layers == prof.layers
    with pytest.raises(ProfileError, match="is partial: interrupted .*--allow-partial"):
        check_not_partial(back, allow=False, where="p.json")
    check_not_partial(back, allow=True)


def test_ctrl_c_before_any_timed_round_keeps_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    f = FakeBursts(interrupt_at=2)  # during the warm-up
    monkeypatch.setattr(profiler, "burst_window", f.window)
    monkeypatch.setattr(profiler, "burst", f.span)
    with pytest.raises(KeyboardInterrupt) as stop:
        _profile(f, repeats=5, warmup_rounds=1, calibration_rounds=0)
    assert not isinstance(stop.value, profiler.ProfileInterrupted)


def _old_profile_json() -> dict[str, Any]:
    return {"schema": "umsearch.profile/2", "model": "m", "device": "cpu", "dtype": "float32",
            "microbatch_sizes": [1, 2], "input_bytes": 4.0, "link": {"latency_ms": 0.1, "bandwidth_gb_per_s": 1.0},
            "layers": [{"name": "a", "fwd_ms": [1.0, 2.0], "bwd_ms": [1.0, 2.0], "out_bytes": 4.0,
                        "stash_bytes": 4.0, "param_bytes": 4.0}]}  # fmt: skip


def test_a_profile_without_the_field_is_whole() -> None:
    prof = profile_from_json(_old_profile_json())
    assert profile_partial(prof) is None
    check_not_partial(prof, allow=False)
    assert profile_partial(profile_from_json({**_old_profile_json(), "partial": None})) is None
    assert "partial" not in profile_from_json({**_old_profile_json(), "partial": None}).to_json()


@pytest.mark.parametrize("bad", [True, "yes", {"rounds": 3}, {"reason": 3}])
def test_a_malformed_partial_field_is_refused(bad: Any) -> None:
    with pytest.raises(ProfileError, match="partial"):
        profile_from_json({**_old_profile_json(), "partial": bad})
