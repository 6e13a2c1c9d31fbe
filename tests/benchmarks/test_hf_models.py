"""benchmarks/hf_models.py: its families are the models it says, and its steps run together (a tiny rehearsal)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from benchmarks.hf_models import FAMILIES, LAYERS, QUICK_FAMILIES, hf_args, main  # noqa: E402
from umsearch.core.model_spec import ModelSpec  # noqa: E402
from umsearch.nn.models import build_model  # noqa: E402
from umsearch.nn.tied import tied_layers  # noqa: E402


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_each_family_builds_with_its_layers_and_ties(name: str) -> None:
    built = build_model(ModelSpec(source=f"hf:{name}", args=dict(FAMILIES[name])), seed=0)
    assert len(built.layers) == LAYERS + 2  # embeddings, the decoder layers, norm + head
    tied = [tied_layers(p) for p in built.layers[-1].parameters() if tied_layers(p)]
    assert tied == ([(0, LAYERS + 1)] if name == "gpt2" else [])
    x, _ = built.make_batch(2, torch.Generator().manual_seed(0))
    assert x.shape == (2, FAMILIES[name]["seq"])


def test_hf_args_are_the_commands_arg_flags() -> None:
    assert hf_args({"hidden_size": 8, "seq": 4}) == ["--arg", "hidden_size=8", "--arg", "seq=4"]


@pytest.mark.slow
def test_the_quick_run_profiles_calibrates_and_tunes_every_family(tmp_path: Path) -> None:
    main(["--quick", "--out", str(tmp_path)])
    doc = json.loads((tmp_path / "hf_models_quick.json").read_text())
    assert doc["quick"] and sorted(doc["families"]) == sorted(QUICK_FAMILIES)
    assert doc["environment"]["loadavg_1m_at_start"] is not None
    for name, sec in doc["families"].items():
        p = sec["profile"]
        assert sec["model"] == {"source": f"hf:{name}", "args": QUICK_FAMILIES[name]}
        assert p["sizes"] == [1, 2] and p["decoder_layer"].endswith(".0")
        assert p["profile_and_calibrate_wall_s"] == pytest.approx(p["profile_wall_s"] + p["calibrate_wall_s"])
        assert p["calibration_held_out_mape_percent"] >= 0
        s = sec["tuned"]["summary"]
        assert s["best_torch"] is not None
        if "measured_ratio" in s:  # the tuned plan won: its ratio over torch's best lies in its interval
            lo, hi = s["measured_ratio_ci95"]
            assert lo <= s["measured_ratio"] <= hi
        else:
            assert s["winner_runtime"] == "torch"
