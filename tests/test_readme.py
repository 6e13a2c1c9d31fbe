"""The README's commands and library example are real: flags exist, the Python block runs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README, flags=re.S)


def _commands() -> list[tuple[str, list[str]]]:
    out = []
    for block in _blocks("sh"):
        for line in block.splitlines():
            line = line.split("#")[0].strip()
            if line.startswith("umsearch "):
                words = line.split()
                out.append((words[1], [w.split("=")[0] for w in words[2:] if w.startswith("--")]))
    return out


@pytest.mark.parametrize("command, flags", _commands())
def test_every_readme_command_and_flag_exists(command: str, flags: list[str]) -> None:
    from click.testing import CliRunner

    from umsearch.cli.main import cli

    result = CliRunner().invoke(cli, [command, "--help"])
    assert result.exit_code == 0, result.output
    for flag in flags:
        assert flag in result.output, f"umsearch {command} has no {flag}"


def test_the_library_example_runs() -> None:
    code = _blocks("python")[0]
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert " ms; peers:" in done.stdout and "busy per rank:" in done.stdout
