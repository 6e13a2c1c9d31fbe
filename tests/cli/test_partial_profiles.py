"""A partial profile (profiling stopped by Ctrl-C) is refused by search unless --allow-partial, and by
calibrate and tune, each in one line."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tests.cli.helpers import run_cli
from tests.strategies import uniform_profile
from umsearch.core.profile import save_profile


def _partial(tmp_path: Path) -> Path:
    prof = uniform_profile()
    reason = {"reason": "interrupted by Ctrl-C after 3 of 15 rounds", "rounds": 3, "repeats": 15}
    path = tmp_path / "partial.json"
    save_profile(dataclasses.replace(prof, extra={**prof.extra, "partial": reason}), path)
    return path


def test_search_refuses_a_partial_profile_unless_allowed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _partial(tmp_path)
    args = ["search", "--profile", str(path), "--ranks", "2", "--global-batch", "8", "--generations", "1",
            "--quiet", "--out", str(tmp_path / "out")]  # fmt: skip
    code, _, err = run_cli(capsys, *args)
    assert code == 1 and "is partial: interrupted by Ctrl-C after 3 of 15 rounds" in err and len(err.splitlines()) == 1
    assert "--allow-partial" in err and not (tmp_path / "out").exists()
    code, _, err = run_cli(capsys, *args, "--allow-partial")
    assert code == 0, err


def test_calibrate_and_tune_refuse_a_partial_profile(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _partial(tmp_path)
    for args in (["calibrate", str(path)], ["tune", str(path), "--out", str(tmp_path / "t")]):
        code, _, err = run_cli(capsys, *args)
        assert code == 1 and "is partial" in err and "--allow-partial" not in err, (args, err)
