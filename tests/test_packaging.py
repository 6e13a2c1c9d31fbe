"""The package as users install it: every package listed, the bundled data inside the wheel."""

from __future__ import annotations

import configparser
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_directory_is_listed_in_setup_cfg() -> None:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    listed = set(cfg["options"]["packages"].split())
    found = {".".join(p.relative_to(ROOT).parts[:-1]) for p in (ROOT / "umsearch").rglob("__init__.py")}
    assert found | {"umsearch.data"} == listed


def test_public_api_names_resolve() -> None:
    import umsearch

    for name in umsearch.__all__:
        assert getattr(umsearch, name) is not None


@pytest.mark.slow
def test_wheel_runs_the_default_search_from_anywhere(tmp_path: Path) -> None:
    """Build a wheel, install it (without dependencies) into a fresh venv that borrows this venv's
    site-packages for numpy & co, and run `umsearch search` with no space from an empty folder."""
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist),
                    str(ROOT)], check=True, timeout=300)  # fmt: skip
    wheel = next(dist.glob("umsearch-*.whl"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    # The dependencies come from this venv; a plain path line adds no editable finder of umsearch.
    Path(site, "borrowed.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "-q", str(wheel)],
                   check=True, timeout=300)  # fmt: skip
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([str(py), "-m", "umsearch", "search", "--generations", "2", "--time-budget", "120", "--quiet"],
                         cwd=work, env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert out.returncode == 0, out.stderr
    found = subprocess.run([str(py), "-c", "import umsearch, umsearch.data; print(umsearch.__file__)"], cwd=work,
                           env=env, capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert str(venv) in found
    assert (work / "results" / "default" / "plan.json").is_file()
