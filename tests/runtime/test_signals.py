"""Signals and faults: SIGTERM to the launcher, SIGKILL to a rank. Nothing may be left running and no
temporary file behind; the exit says what happened in one line.

Each test starts the launcher as a subprocess with ``TMPDIR`` pointing at a
folder of its own, so that it can find the launch's private folder, wait
until every rank has started (their ``started`` notes), read the ranks'
pids, and check afterwards that the folder is empty and every pid gone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.runtime.test_command import _plan
from umsearch.runtime.sealed import RUN_DIR_PREFIX

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def _pythonpath() -> str:
    """The checkout first (the tests' own modules are model builders and launch targets), then the caller's."""
    return os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
START_WAIT_S = 180.0  # generous: start-up speed is no part of what these tests check


def ping_pong(rank: int, world: int, rounds: int) -> int:
    """Launch target: ranks 0 and 1 trade a tensor ``rounds`` times (a stand-in for a long run)."""
    import torch
    import torch.distributed as dist

    buf = torch.zeros(1)
    for _ in range(rounds):
        if rank == 0:
            dist.send(buf, 1)
            dist.recv(buf, 1)
        else:
            dist.recv(buf, 0)
            dist.send(buf + 1, 0)
        time.sleep(0.01)
    return rank


def _start(args: list[str], tmp: Path) -> subprocess.Popen[str]:
    tmp.mkdir(exist_ok=True)
    env = {**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": _pythonpath()}
    return subprocess.Popen([sys.executable, *args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip


def _launcher(target: str, args: str, cfg: str = "") -> list[str]:
    """``python -c`` running launch(target, 2, args); a failure's one line on stderr, exit 1 or 128 + the signal."""
    code = (
        "import sys\n"
        "from umsearch.runtime.launch import launch, LaunchInterrupted\n"
        "from umsearch.runtime.config import LaunchConfig\n"
        f"from tests.runtime.test_signals import {target}\n"
        "try:\n"
        f"    launch({target}, 2, {args}, LaunchConfig({cfg}))\n"
        "except LaunchInterrupted as exc:\n"
        "    sys.exit(128 + exc.signum)\n"
        "except Exception as exc:\n"
        "    print(exc, file=sys.stderr)\n"
        "    sys.exit(1)\n"
    )
    return ["-c", code]


def _run_dir(tmp: Path) -> Path | None:
    found = [p for p in tmp.glob(f"{RUN_DIR_PREFIX}*") if p.is_dir()]
    return found[0] if found else None


def _wait_started(proc: subprocess.Popen[str], tmp: Path, ranks: int = 2) -> list[int]:
    """Wait until every rank has started; their pids, and the launcher's descendants' pids."""
    deadline = time.monotonic() + START_WAIT_S
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        d = _run_dir(tmp)
        if d is not None and all((d / f"started{r}").exists() for r in range(ranks)):
            return [int((d / f"pid{r}").read_text()) for r in range(ranks)]
        time.sleep(0.1)
    proc.kill()
    raise AssertionError("the ranks did not start")


def _descendants(pid: int) -> Iterator[int]:
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                text = Path(f"/proc/{name}/stat").read_text()
            except OSError:
                continue
            if text[text.rfind(")") + 2 :].split()[1] == str(pid):
                yield int(name)
                yield from _descendants(int(name))


def _running(pid: int) -> bool:
    """Alive and not a zombie (a zombie runs nothing; its parent or init reaps it)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return text[text.rfind(")") + 2 :].split()[0] != "Z"


def _assert_nothing_left(pids: list[int], tmp: Path) -> None:
    deadline = time.monotonic() + 10  # the kernel may take a moment to tear a killed process down
    while time.monotonic() < deadline and any(_running(p) for p in pids):
        time.sleep(0.05)
    assert [p for p in pids if _running(p)] == []
    assert list(tmp.iterdir()) == []  # the private folder, torchrun's own temp folder: all gone


def _finish(proc: subprocess.Popen[str], timeout: float) -> tuple[int, str]:
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    return proc.returncode, err


def test_sigterm_to_the_launcher_stops_torchrun_and_every_rank(tmp_path: Path) -> None:
    proc = _start(_launcher("ping_pong", "(10**9,)"), tmp_path / "tmp")
    ranks = _wait_started(proc, tmp_path / "tmp")
    everything = [*ranks, *_descendants(proc.pid)]
    proc.send_signal(signal.SIGTERM)
    code, err = _finish(proc, timeout=90)
    assert code == 143, err
    _assert_nothing_left(everything, tmp_path / "tmp")


def test_a_rank_killed_mid_run_stops_the_run_within_the_link_timeout(tmp_path: Path) -> None:
    link_timeout = 60.0
    proc = _start(_launcher("ping_pong", "(10**9,)", f"timeout_s={link_timeout}"), tmp_path / "tmp")
    ranks = _wait_started(proc, tmp_path / "tmp")
    everything = [*ranks, *_descendants(proc.pid)]
    killed = time.monotonic()
    os.kill(ranks[1], signal.SIGKILL)
    code, err = _finish(proc, timeout=link_timeout + 60)
    assert time.monotonic() - killed < link_timeout
    assert code == 1
    *progress, line = err.strip().splitlines()
    assert all(p.startswith(("[run] ", "warning: ")) for p in progress), err  # progress lines (no terminal), warnings
    assert line.startswith("rank 1 died without reporting an error (killed by a signal such as SIGKILL"), line
    _assert_nothing_left(everything, tmp_path / "tmp")


def test_sigterm_to_umsearch_run(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    proc = _start(["-m", "umsearch", "run", str(plan), "--steps", "1000000", "--warmup-steps", "0"],
                  tmp_path / "tmp")  # fmt: skip
    ranks = _wait_started(proc, tmp_path / "tmp")
    everything = [*ranks, *_descendants(proc.pid)]
    proc.send_signal(signal.SIGTERM)
    code, err = _finish(proc, timeout=90)
    assert code == 143, err  # 128 + SIGTERM, as a shell reports a process SIGTERM ended
    *progress, line = err.strip().splitlines()
    assert all(p.startswith(("[run] ", "warning: ")) for p in progress), err  # progress lines (no terminal), warnings
    assert line.startswith("error: interrupted by SIGTERM: stopped torchrun and every rank"), line
    _assert_nothing_left(everything, tmp_path / "tmp")


def test_a_rank_killed_under_umsearch_run_is_named_in_one_line(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    proc = _start(["-m", "umsearch", "run", str(plan), "--steps", "1000000", "--timeout", "60"], tmp_path / "tmp")
    ranks = _wait_started(proc, tmp_path / "tmp")
    everything = [*ranks, *_descendants(proc.pid)]
    killed = time.monotonic()
    os.kill(ranks[0], signal.SIGKILL)
    code, err = _finish(proc, timeout=120)
    assert time.monotonic() - killed < 60
    assert code == 1
    *progress, line = err.strip().splitlines()
    assert all(p.startswith(("[run] ", "warning: ")) for p in progress), err  # progress lines (no terminal), warnings
    assert line.startswith("error: rank 0 died without reporting an error"), line
    _assert_nothing_left(everything, tmp_path / "tmp")
