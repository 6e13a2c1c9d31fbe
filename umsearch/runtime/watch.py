"""Watching a launch's torchrun and ranks, and stopping them all: none outlives the launch.

The watcher polls the files each rank writes in the launch's private folder (``pid{r}``,
``started{r}``, ``result{r}``, ``error{r}.json``, ``stopped{r}.json``) and the ranks' processes. On the
first failure, on the start-up or time limit, or on SIGTERM, SIGHUP or SIGINT (noted by
:class:`Signals`, acted on by the watcher) it stops torchrun and every rank by pid.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from umsearch.errors import Interrupted, RuntimeExecutionError
from umsearch.runtime.config import LaunchConfig
from umsearch.runtime.triage import first_failure, ranks_text
from umsearch.storage.signals import SignalScope

POLL_S = 0.02
"""How often the launcher looks at the ranks."""
_STOP_GRACE_S = 10.0
"""How long torchrun, then each rank, may take to stop after SIGTERM before it is killed."""


class LaunchInterrupted(Interrupted):
    """The launcher got SIGTERM, SIGHUP or SIGINT; every process of the launch was stopped first."""


class Signals(SignalScope):
    """While active, SIGTERM, SIGHUP and SIGINT only note themselves; the supervisor acts on them.

    Raising from the handler could land between starting torchrun and
    remembering it (an orphan); noting and polling cannot.
    """

    CAUGHT = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)

    def __init__(self) -> None:
        super().__init__()
        self.raised = False

    def __enter__(self) -> Signals:
        super().__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        if self.received is not None and not self.raised:
            os.kill(os.getpid(), self.received)  # came too late to act on here: its own handler decides

    def check(self) -> None:
        """Raise :class:`LaunchInterrupted` once a watched signal has come."""
        if self.received is not None:
            self.raised = True
            raise LaunchInterrupted(self.received)


_HAVE_PROC = os.path.isdir("/proc/self")


def _cmdline(pid: int) -> bytes | None:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None


def _children(pid: int) -> list[int]:
    """Every process whose parent is ``pid`` (Linux; empty elsewhere)."""
    found = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for name in entries:
        if not name.isdigit():
            continue
        try:
            text = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        # Fields after the parenthesised command name: state, ppid, ...
        fields = text[text.rfind(")") + 2 :].split()
        if len(fields) > 1 and fields[1] == str(pid):
            found.append(int(name))
    return found


@dataclass
class Watch:
    """One launch's torchrun process and the files its ranks write."""

    proc: subprocess.Popen[bytes]
    world_size: int
    out: Path
    log_path: Path
    cfg: LaunchConfig
    entry: str
    """The module torchrun starts in every rank: how a rank's process is told from others."""

    def __post_init__(self) -> None:
        self.t0 = time.monotonic()
        self.started_at: float | None = None
        self.vanished: dict[int, float] = {}  # rank -> when it was seen gone without a word
        self.pids: dict[int, int] = {}

    def _has(self, name: str, rank: int) -> bool:
        return (self.out / f"{name}{rank}").exists()

    def reported(self, rank: int) -> bool:
        """Whether the rank left a result, an error or a stop note."""
        return self._has("result", rank) or any((self.out / f"{n}{rank}.json").exists() for n in ("error", "stopped"))

    def is_rank(self, pid: int) -> bool:
        """Whether ``pid`` is a live rank of this launch (not a zombie, not a recycled pid)."""
        if not _HAVE_PROC:
            try:
                os.kill(pid, 0)
            except OSError:
                return False
            return True
        cmd = _cmdline(pid)  # a zombie's is empty
        return cmd is not None and self.entry.encode() in cmd and str(self.out).encode() in cmd

    def _read_pids(self) -> None:
        for r in range(self.world_size):
            if r not in self.pids:
                try:
                    self.pids[r] = int((self.out / f"pid{r}").read_text())
                except (OSError, ValueError):
                    pass

    def _look(self) -> None:
        """Note new pids, the moment every rank has started, and ranks gone without a word."""
        self._read_pids()
        if self.started_at is None and all(self._has("started", r) for r in range(self.world_size)):
            self.started_at = time.monotonic()
        for r, pid in self.pids.items():
            if r not in self.vanished and not self.is_rank(pid) and not self.reported(r):
                self.vanished[r] = time.monotonic()

    def _failed(self) -> bool:
        return bool(self.vanished) or any(
            (self.out / f"{n}{r}.json").exists() for r in range(self.world_size) for n in ("error", "stopped"))  # fmt: skip

    def supervise(self, signals: Signals) -> None:
        """Wait for torchrun; raise on a signal, a failure, the start-up limit or the time limit."""
        while True:
            signals.check()
            self._look()
            code = self.proc.poll()
            if code is not None:
                break
            if self._failed():
                # Give torchrun and the others a moment to note what they saw, then stop everything.
                time.sleep(0.2)
                self._look()
                raise self.diagnose(None)
            self._check_limits()
            time.sleep(POLL_S)
        missing = [r for r in range(self.world_size) if not self._has("result", r)]
        if code != 0 or missing:
            self._look()
            raise self.diagnose(code)

    def _check_limits(self) -> None:
        now = time.monotonic()
        if self.started_at is None:
            if now - self.t0 > self.cfg.start_timeout_s:
                waiting = [r for r in range(self.world_size) if not self._has("started", r)]
                raise RuntimeExecutionError(
                    f"rank(s) {ranks_text(waiting)} had not started {self.cfg.start_timeout_s:g} s after torchrun was "
                    f"started (stuck importing or joining the process group); torchrun's last line: {self._last_line()}"
                )
        elif self.cfg.run_timeout_s is not None and now - self.started_at > self.cfg.run_timeout_s:
            running = [r for r in range(self.world_size) if not self.reported(r)]
            raise RuntimeExecutionError(
                f"the run was still going {self.cfg.run_timeout_s:g} s after its ranks started; rank(s) "
                f"{ranks_text(running)} still running were stopped (raise --time-limit, or look for a rank waiting "
                "on a message never sent)"
            )

    def _last_line(self) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return "no output"
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        return lines[-1] if lines else "no output"

    def _reports(self, name: str) -> list[dict[str, Any]]:
        found = []
        for r in range(self.world_size):
            try:
                rep = json.loads((self.out / f"{name}{r}.json").read_text(encoding="utf-8"))
            except (OSError, json.JSONDecodeError):
                continue
            if isinstance(rep, dict) and isinstance(rep.get("time"), (int, float)):
                found.append(rep)
        return found

    def diagnose(self, returncode: int | None) -> RuntimeExecutionError:
        """The first failure as one line (see :func:`first_failure`)."""
        return first_failure(self._reports("error"), self._reports("stopped"), self.vanished,
                             returncode, self._last_line())  # fmt: skip

    # -- stopping --------------------------------------------------------

    def _rank_pids(self) -> set[int]:
        self._read_pids()
        pids = {p for p in self.pids.values() if self.is_rank(p)}
        if self.proc.poll() is None:
            pids.update(p for p in _children(self.proc.pid) if self.is_rank(p))
        return pids

    def stop(self) -> None:
        """End torchrun (it stops its ranks), then every rank that is left; returns when none runs."""
        ranks = self._rank_pids()  # before torchrun goes: its children are found through it
        if self.proc.poll() is None:
            _signal_group(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=_STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                _signal_group(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        ranks |= {p for p in self.pids.values() if self.is_rank(p)}
        self._end(ranks)

    def _end(self, pids: set[int]) -> None:
        """SIGTERM, then SIGKILL, every pid (and its process group) still a rank; wait until gone."""
        for sig, grace in ((signal.SIGTERM, _STOP_GRACE_S), (signal.SIGKILL, 30.0)):
            left = {p for p in pids if self.is_rank(p)}
            if not left:
                return
            for p in left:
                _signal_group(p, sig)
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline and any(self.is_rank(p) for p in left):
                time.sleep(POLL_S)


def _signal_group(pid: int, sig: int) -> None:
    """``sig`` to ``pid``'s process group when it leads one (torchrun and its ranks do), else to ``pid``."""
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
