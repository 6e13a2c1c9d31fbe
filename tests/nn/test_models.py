"""A user model ``module:function`` is looked up in the current folder first, as ``python -m`` does: the
``umsearch`` console script (unlike ``python -m umsearch``) does not put that folder on the path, so
``umsearch profile examples.hf_gpt2:build`` from the repository root said ``No module named 'examples'``.
The trust rule stays: a spec a data file names is not imported without ``--trust-model-code``."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from umsearch.core.model_spec import ModelSpec
from umsearch.errors import ModelSpecError
from umsearch.nn.models import build_model

PACKAGE, SPEC = "umsearch_cwd_models", "umsearch_cwd_models.tiny:build"
"""As ``examples.hf_gpt2:build``: a package in the folder; a name nothing installed answers to."""

CODE = (
    "import torch\n"
    "def build(width=8):\n"
    "    layers = torch.nn.Sequential(torch.nn.Linear(3, width), torch.nn.Tanh(), torch.nn.Linear(width, 2))\n"
    "    return layers, lambda b, g: (torch.randn(b, 3, generator=g), torch.randn(b, 2, generator=g))\n"
)


def _write_package(folder: Path, code: str = CODE) -> None:
    (folder / PACKAGE).mkdir(exist_ok=True)
    (folder / PACKAGE / "__init__.py").write_text("")
    (folder / PACKAGE / "tiny.py").write_text(code)


@pytest.fixture
def in_model_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The current folder is a fresh one holding a package with the model, on no import path; sys.path and
    sys.modules are restored afterwards."""
    _write_package(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    yield tmp_path
    for name in (PACKAGE, f"{PACKAGE}.tiny"):
        sys.modules.pop(name, None)


def test_a_model_module_in_the_current_folder_builds(in_model_folder: Path) -> None:
    built = build_model(ModelSpec(source=SPEC, args={"width": 5}))
    assert len(built.layers) == 3
    x, y = built.make_batch(2, torch.Generator().manual_seed(0))
    assert torch.nn.Sequential(*built.layers)(x).shape == y.shape


def test_an_untrusted_model_in_the_current_folder_is_not_imported(in_model_folder: Path) -> None:
    _write_package(in_model_folder, "raise SystemExit('imported')\n")
    with pytest.raises(ModelSpecError, match="--trust-model-code"):
        build_model(ModelSpec(source=SPEC, trusted=False))
    assert PACKAGE not in sys.modules


@pytest.mark.slow
def test_the_console_script_profiles_searches_and_runs_a_model_of_the_current_folder(tmp_path: Path) -> None:
    """The documented form (examples/hf_gpt2.py) with a plain-torch module: ``umsearch`` as installed, in
    bash, from the folder holding the module, which is on no path; the ranks of ``run`` find it too, and a
    plan naming it is still run only when the user names the model (or trusts the file)."""
    _write_package(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONSAFEPATH"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"

    def sh(line: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", "-c", line], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=300, check=False)  # fmt: skip

    for line in (f"umsearch profile {SPEC} --arg width=8 --sizes 1,2 --repeats 3 --out runs/p.json",
                 "umsearch search --profile runs/p.json --ranks 2 --batch 4 --time-budget 10 --quiet --out runs/r",
                 f"umsearch run runs/r/plan.json --model {SPEC} --arg width=8 --steps 1"):  # fmt: skip
        done = sh(line)
        assert done.returncode == 0, f"{line}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    refused = sh("umsearch run runs/r/plan.json --steps 1")
    assert refused.returncode == 1 and "--trust-model-code" in refused.stderr, refused.stderr
