"""Running the CLI in-process the way a user's shell would, for the CLI and fuzz tests."""

from __future__ import annotations

import pytest

from umsearch.cli.main import main


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``umsearch ARGS...``: exit code, stdout, stderr."""
    with pytest.raises(SystemExit) as exc:
        main(list(args))
        raise SystemExit(0)
    out = capsys.readouterr()
    return int(exc.value.code or 0), out.out, out.err
