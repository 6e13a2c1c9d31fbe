"""Profile loading of docs/model.md (version 2.1)'s runtime terms and of the link: they round-trip, and every bad value is
one line."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.contract import unit_profile
from umsearch.core.links import (
    MAX_BANDWIDTH_GB_PER_S,
    MAX_LATENCY_MS,
    MIN_BANDWIDTH_GB_PER_S,
    PRESETS,
)
from umsearch.core.profile import RuntimeCosts, load_profile, profile_from_json
from umsearch.errors import ProfileError


def _with_runtime(**runtime: Any) -> dict[str, Any]:
    doc = unit_profile(4).to_json()
    doc["runtime"] = {"op_overhead_ms": 0.0, "message_overhead_ms": 0.0, **runtime}
    return doc


def test_v21_terms_round_trip() -> None:
    doc = _with_runtime(message_overhead_ms_per_mib=0.25, stage_scale=[[1, 1.0], [3, 1.5]],
                        ranges=[{"lo": 2, "hi": 4, "scale": 0.9}])  # fmt: skip
    profile = profile_from_json(doc)
    assert profile.runtime == RuntimeCosts(message_overhead_ms_per_mib=0.25, stage_scale=((1, 1.0), (3, 1.5)),
                                           ranges=((2, 4, 0.9),))  # fmt: skip
    assert profile_from_json(profile.to_json()) == profile


def test_a_v2_profile_stays_v2_when_saved() -> None:
    """Without the 2.1 terms nothing new is written, so older readers keep reading it."""
    out = profile_from_json(_with_runtime(op_overhead_ms=0.1)).to_json()["runtime"]
    assert set(out) == {"op_overhead_ms", "message_overhead_ms"}


@pytest.mark.parametrize(("runtime", "match"), [
    ({"stage_scale": [[2, 1.0], [2, 1.1]]}, r"k = 2 after k = 2; list the layer counts k strictly ascending"),
    ({"stage_scale": [[3, 1.0], [1, 1.1]]}, r"strictly ascending"),
    ({"stage_scale": [[0, 1.0]]}, r"stage_scale\[0\]\[0\] = 0 must be between 1"),
    ({"stage_scale": [[1, 0.0]]}, r"stage_scale\[0\]\[1\] must be positive"),
    ({"stage_scale": [[1, -1.0]]}, r"must be positive"),
    ({"stage_scale": []}, r"non-empty list of \[k, s\] pairs"),
    ({"stage_scale": [[1, 1.0, 2.0]]}, r"must be a \[k, s\] pair"),
    ({"ranges": [{"lo": 0, "hi": 5, "scale": 1.0}]}, r"\[0, 5\) is not a layer range of this 4-layer model"),
    ({"ranges": [{"lo": 2, "hi": 2, "scale": 1.0}]}, r"is not a layer range"),
    ({"ranges": [{"lo": 0, "hi": 2, "scale": 0}]}, r"ranges\[0\].scale must be positive"),
    ({"ranges": [{"lo": 0, "hi": 2, "scale": 1.0}, {"lo": 0, "hi": 2, "scale": 1.1}]},
     r"ranges\[1\] repeats the range \[0, 2\) of runtime.ranges\[0\]"),
    ({"ranges": [{"lo": 0, "hi": 2}]}, r"missing field runtime.ranges\[0\].'scale'"),
    ({"ranges": [{"lo": 0, "hi": 2, "scale": 1.0, "sclae": 2}]}, r"unknown field"),
    ({"message_overhead_ms_per_mib": -0.1}, r"message_overhead_ms_per_mib must be non-negative"),
    ({"message_overhead_ms_per_mib": float("nan")}, r"must be finite"),
    ({"stage_scael": [[1, 1.0]]}, r"did you mean 'stage_scale'"),
])  # fmt: skip
def test_bad_v21_terms_are_one_line(runtime: dict[str, Any], match: str) -> None:
    with pytest.raises(ProfileError, match=match) as info:
        profile_from_json(_with_runtime(**runtime))
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(("link", "match"), [
    ({"latency_ms": 0.0, "bandwidth_gb_per_s": 1e-300}, r"link.bandwidth_gb_per_s = 1e-300 GB/s is out of range"),
    ({"latency_ms": 0.0, "bandwidth_gb_per_s": 1e300}, r"link.bandwidth_gb_per_s = 1e300 GB/s is out of range"),
    ({"latency_ms": 0.0, "bandwidth_gb_per_s": 10**400}, r"bandwidth_gb_per_s = a number over 1e308 GB/s"),
    ({"latency_ms": 1e300, "bandwidth_gb_per_s": 1.0}, r"link.latency_ms = 1e300 ms is out of range: a link's "
                                                        r"latency is from 0 to 10000 ms"),
])  # fmt: skip
def test_the_link_has_physical_bounds(tmp_path: Any, link: dict[str, Any], match: str) -> None:
    """A bandwidth of 1e-300 GB/s made a 300-digit time; the bounds are in the message, with the fix."""
    doc = {**unit_profile(4).to_json(), "link": link}
    with pytest.raises(ProfileError, match=match) as info:
        profile_from_json(doc)
    assert "\n" not in str(info.value) and "state bandwidth in GB/s" in str(info.value)
    if "bandwidth" in match:
        assert "a link's bandwidth is from 0.001 to 1e9 GB/s" in str(info.value)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ProfileError, match=match) as info:
        load_profile(path)
    assert str(info.value).startswith(f"{path}: ")
    # The bounds themselves, and every preset, load.
    for latency, bandwidth in [(0.0, MIN_BANDWIDTH_GB_PER_S), (MAX_LATENCY_MS, MAX_BANDWIDTH_GB_PER_S),
                               *((p.latency_ms, p.bandwidth_gb_per_s) for p in PRESETS.values())]:  # fmt: skip
        doc = {**unit_profile(4).to_json(), "link": {"latency_ms": latency, "bandwidth_gb_per_s": bandwidth}}
        assert profile_from_json(doc).link.bandwidth_gb_per_s == bandwidth


# ------------------------------------------------------------------------------------------------ issue 38
def _with_layer_fields(**fields: float) -> dict[str, Any]:
    doc = unit_profile(4).to_json()
    for i, lay in enumerate(doc["layers"]):
        lay.update({k: v for k, v in fields.items() if i or k != "boundary_shared_bytes"})
    return doc


def test_the_measured_sharing_fields_round_trip_and_older_profiles_read_as_before() -> None:
    profile = profile_from_json(_with_layer_fields(boundary_shared_bytes=4.0, input_saved_bytes=6.0,
                                                   weight_stash_bytes=7.0))  # fmt: skip
    assert [lay.boundary_shared_bytes for lay in profile.layers] == [0.0, 4.0, 4.0, 4.0]
    assert [lay.input_saved_bytes for lay in profile.layers] == [6.0] * 4
    assert [lay.weight_stash_bytes for lay in profile.layers] == [7.0] * 4
    assert profile_from_json(profile.to_json()) == profile
    older = profile_from_json(unit_profile(4).to_json())
    assert all(lay.boundary_shared_bytes == 0.0 and lay.input_saved_bytes is None and lay.weight_stash_bytes is None
               for lay in older.layers)  # fmt: skip
    assert not {"boundary_shared_bytes", "weight_stash_bytes"} & set(older.to_json()["layers"][1])


@pytest.mark.parametrize(("fields", "match"), [
    ({"boundary_shared_bytes": 11.0}, r"layers\[1\].boundary_shared_bytes = 11 is more than the layer's stash_bytes 10"),
    ({"input_saved_bytes": -1.0}, r"input_saved_bytes"),
    ({"weight_stash_bytes": 10.5}, r"layers\[0\].weight_stash_bytes = 10.5 is more than the layer's stash_bytes 10"),
])  # fmt: skip
def test_sharing_fields_beyond_the_stash_are_refused_in_one_line(fields: dict[str, float], match: str) -> None:
    with pytest.raises(ProfileError, match=match):
        profile_from_json(_with_layer_fields(**fields))


def test_the_first_layer_shares_nothing_with_a_layer_before_it() -> None:
    doc = unit_profile(4).to_json()
    doc["layers"][0]["boundary_shared_bytes"] = 1.0
    with pytest.raises(ProfileError, match=r"must be 0 for the first layer"):
        profile_from_json(doc)
