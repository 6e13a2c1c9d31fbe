"""docs/model.md 5's last version 2.3 terms in the profile and the cost model: ``stash_fixed_bytes`` (saved per
microbatch whatever its size) and ``tied_weights`` (a weight several layers share, held once per rank); older
profiles read and predict as before, and every bad value is one line."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from tests.contract import unit_profile
from umsearch.core.cost import CostModel
from umsearch.core.profile import Profile, TiedWeight, profile_from_json
from umsearch.errors import ProfileError


def _doc(**top: Any) -> dict[str, Any]:
    doc = unit_profile(4).to_json()
    doc.update(top)
    return doc


def test_the_fields_round_trip_and_an_older_profile_is_written_as_before() -> None:
    doc = _doc(tied_weights=[{"layers": [3, 0], "bytes": 40}])
    doc["layers"][1]["stash_fixed_bytes"] = 2.5
    profile = profile_from_json(doc)
    assert profile.tied_weights == (TiedWeight(layers=(0, 3), bytes=40.0),)
    assert [x.stash_fixed_bytes for x in profile.layers] == [0.0, 2.5, 0.0, 0.0]
    assert profile_from_json(profile.to_json()) == profile
    old = unit_profile(4).to_json()
    assert profile_from_json(old).to_json() == old  # nothing new written where nothing was measured


@pytest.mark.parametrize(("ties", "match"), [
    ({"layers": [0, 3]}, r"missing field tied_weights\[0\].'bytes'"),
    ({"layers": [0], "bytes": 1}, r"tied_weights\[0\].layers must list two or more distinct layers"),
    ({"layers": [0, 0], "bytes": 1}, r"two or more distinct layers"),
    ({"layers": [0, 4], "bytes": 1}, r"tied_weights\[0\].layers\[1\] = 4 must be between 0 and 3"),
    ({"layers": "0,3", "bytes": 1}, r"must be a list of layer indexes"),
    ({"layers": [0, 3], "bytes": -1}, r"tied_weights\[0\].bytes must be non-negative"),
    ({"layers": [0, 3], "bytes": 101}, r"layer 0's tied weights 101 bytes, more than its param_bytes 100"),
    ({"layers": [0, 3], "bytes": 1, "byts": 2}, r"did you mean 'bytes'"),
])  # fmt: skip
def test_a_bad_tied_weight_is_one_line(ties: dict[str, Any], match: str) -> None:
    with pytest.raises(ProfileError, match=match):
        profile_from_json(_doc(tied_weights=[ties]))


def test_the_ties_of_one_layer_together_stay_within_its_parameters() -> None:
    ties = [{"layers": [0, 3], "bytes": 60}, {"layers": [1, 3], "bytes": 50}]
    with pytest.raises(ProfileError, match=r"tied_weights\[1\].bytes = 50 makes layer 3's tied weights 110 bytes"):
        profile_from_json(_doc(tied_weights=ties))


def test_a_bad_fixed_stash_is_one_line() -> None:
    doc = _doc()
    doc["layers"][2]["stash_fixed_bytes"] = -1
    with pytest.raises(ProfileError, match=r"layers\[2\].stash_fixed_bytes must be non-negative"):
        profile_from_json(doc)


def _tied(*ties: TiedWeight) -> Profile:
    return dataclasses.replace(unit_profile(4), tied_weights=ties)


def test_a_rank_holds_a_tied_weight_once_in_one_stage_or_several() -> None:
    cost = CostModel(_tied(TiedWeight(layers=(0, 2, 3), bytes=30.0)))
    assert cost.rank_param_bytes([(0, 1), (3, 4)]) == 200 - 30  # two of its layers, two stages
    assert cost.rank_param_bytes([(0, 4)]) == 400 - 60  # three layers, one stage
    assert cost.rank_param_bytes([(1, 2)]) == 100  # none of them
    assert cost.rank_param_bytes([(2, 3)]) == 100  # one: its own copy


def test_stage_by_stage_the_first_stage_of_each_plan_and_rank_counts_a_tie() -> None:
    """Two plans side by side (groups 0 and 1): a tie's bytes leave every later stage of the same plan and rank."""
    cost = CostModel(_tied(TiedWeight(layers=(0, 3), bytes=40.0)))
    lo, hi = np.array([0, 1, 2, 3, 0, 2]), np.array([1, 2, 3, 4, 2, 4])
    rank, group = np.array([0, 1, 1, 0, 0, 0]), np.array([0, 0, 0, 0, 1, 1])
    assert cost.stage_params(lo, hi, rank, group).tolist() == [100, 100, 100, 60, 200, 160]
    tables = cost.tables(1)
    assert tables.stage_params(lo, hi, rank, group).tolist() == [100, 100, 100, 60, 200, 160]


def test_without_the_fields_the_terms_are_version_2_2_s_to_the_bit() -> None:
    """No fixed part, no tie: each stage's parameters are the plain prefix difference, a microbatch's sizes the
    per-sample terms times its size."""
    profile = unit_profile(4)
    layers = tuple(dataclasses.replace(x, stash_bytes=0.1 * (i + 1), param_bytes=0.3 * (i + 7))
                   for i, x in enumerate(profile.layers))  # fmt: skip
    cost = CostModel(dataclasses.replace(profile, layers=layers))
    lo, hi = np.array([0, 1, 0, 2]), np.array([1, 4, 3, 4])
    np.testing.assert_array_equal(cost.stage_params(lo, hi, np.array([0, 1, 0, 0]), np.array([0, 0, 1, 1])),
                                  cost.param_prefix[hi] - cost.param_prefix[lo])  # fmt: skip
    np.testing.assert_array_equal(cost.stash_fixed(lo, hi), 0.0)
    for a, b in zip(lo.tolist(), hi.tolist(), strict=True):
        per = cost.stage_memory(a, b, False, False, False)
        assert cost.microbatch_memory(a, b, False, False, False, 3) == tuple(x * 3 for x in per)


def test_a_microbatch_adds_the_fixed_part_to_its_stash_only() -> None:
    profile = unit_profile(4)
    layers = tuple(dataclasses.replace(x, out_bytes=5.0, stash_fixed_bytes=float(i), input_saved_bytes=3.0)
                   for i, x in enumerate(profile.layers))  # fmt: skip
    cost = CostModel(dataclasses.replace(profile, layers=layers))
    # Layers 1 and 2 of a recomputing stage: stash 20 per sample plus 1 + 2, input 5, kept 3, nothing freed.
    assert cost.microbatch_memory(1, 3, True, False, False, 4) == (20 * 4 + 3, 5 * 4, 3 * 4, 0.0)
