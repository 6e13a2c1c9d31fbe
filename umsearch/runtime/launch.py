"""Start one local process per rank through torchrun, watch them, and stop them all.

A local run is ``python -m torch.distributed.run --standalone --nproc-per-node R
-m umsearch.runtime.torchrun ... --result-dir DIR``: the launcher, rendezvous,
entry point and rank start-up a cluster uses (``umsearch run --print-launch``),
on one node. ``--standalone`` lets torchrun pick a free port, so concurrent
launches never race for one.

The launch's files live in a private folder (:func:`private_dir`: mode 0700,
made by ``tempfile.mkdtemp``, removed at the end, whatever happens). Nothing
there is taken on trust: the job (:func:`launch`'s pickled target) and every
rank's result are sealed with a key that exists only in the environment of
this launch's processes (:func:`seal`), and the entry point's hidden
``--job``/``--result-dir`` flags accept nothing but such a folder
(:func:`check_private_dir`). Each rank writes there, in order:
``pid{r}`` when it starts, ``started{r}`` once it has joined the process group,
then ``result{r}`` when it succeeds, ``error{r}.json`` (type, message,
traceback, time) when it fails, or ``stopped{r}.json`` when it is told to stop
(SIGTERM). A rank that vanishes with none of these was killed (SIGKILL, the
out-of-memory killer) or crashed.

The launcher (:func:`launch`, :func:`launch_entry`) polls those files and the
ranks' processes; on the first failure, on the time limit (counted from when
every rank has started, so start-up speed does not matter), on SIGTERM, SIGHUP
or SIGINT it stops torchrun and every rank (by pid; none outlives the launch),
then raises one line naming the rank that failed first
(:class:`RankFailure`), or :class:`LaunchInterrupted` (a
``KeyboardInterrupt``) for a signal.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import pickle
import re
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from umsearch.core.errors import RuntimeExecutionError
from umsearch.runtime.config import LaunchConfig

__all__ = ["ENTRY_MODULE", "LaunchConfig", "LaunchInterrupted", "RankFailure", "launch", "launch_entry"]

ENTRY_MODULE = "umsearch.runtime.torchrun"
"""The module torchrun starts in every rank, locally and on clusters."""
RUN_DIR_PREFIX = "umsearch-run-"
"""Name prefix of a launch's private folder (in the system's temporary directory)."""
KEY_ENV = "UMSEARCH_LAUNCH_KEY"
"""Environment variable holding the launch's sealing key (hex); set only for the launch's processes."""
LAUNCHER_PID_ENV = "UMSEARCH_LAUNCHER_PID"
"""Environment variable holding the launcher's pid: a rank whose launcher is gone stops itself."""
JOB_FILE = "job.pkl"
"""The sealed ``(target, args, LaunchConfig)`` of :func:`launch`, inside the private folder."""
POLL_S = 0.02
"""How often the launcher looks at the ranks."""
_STOP_GRACE_S = 10.0
"""How long torchrun, then each rank, may take to stop after SIGTERM before it is killed."""


class RankFailure(RuntimeExecutionError):
    """A rank failed; ``str()`` is one line naming it; its traceback, if any, is attached as a note."""


class LaunchInterrupted(KeyboardInterrupt):
    """The launcher got SIGTERM, SIGHUP or SIGINT; every process of the launch was stopped first."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


# ---------------------------------------------------------------------------
# The private folder and sealed files
# ---------------------------------------------------------------------------


@contextlib.contextmanager
def private_dir() -> Iterator[Path]:
    """A fresh folder only this user can enter (mode 0700); removed with everything in it at the end."""
    path = Path(tempfile.mkdtemp(prefix=RUN_DIR_PREFIX))
    try:
        os.chmod(path, 0o700)  # mkdtemp's mode already; said again so the rule is visible here
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def check_private_dir(path: str | os.PathLike[str]) -> Path:
    """``path`` if it is a launch's private folder: a real directory (no symlink) named
    ``umsearch-run-*``, owned by this user, mode 0700; else RuntimeExecutionError."""
    p = Path(path)
    try:
        info = p.lstat()
    except OSError as exc:
        raise RuntimeExecutionError(f"the launch folder {str(p)!r} cannot be used: {exc.strerror}") from None
    ok = (stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and stat.S_IMODE(info.st_mode) == 0o700
          and p.name.startswith(RUN_DIR_PREFIX))  # fmt: skip
    if not ok:
        raise RuntimeExecutionError(
            f"{str(p)!r} is not a private launch folder (a directory {RUN_DIR_PREFIX}* of this user with mode "
            "0700); --job and --result-dir are only for umsearch's own launcher: start a plan with "
            "PLAN.json and its flags instead"
        )
    return p


def new_key() -> bytes:
    """A fresh sealing key."""
    return secrets.token_bytes(32)


def env_key() -> bytes:
    """This launch's key from the environment; RuntimeExecutionError when there is none."""
    raw = os.environ.get(KEY_ENV, "")
    try:
        key = bytes.fromhex(raw)
    except ValueError:
        key = b""
    if len(key) < 16:
        raise RuntimeExecutionError(
            "--job and --result-dir are only for umsearch's own launcher (launch(), umsearch run), which "
            "passes their key; start a plan with PLAN.json and its flags instead"
        )
    return key


def seal(data: bytes, key: bytes) -> bytes:
    """``data`` behind its HMAC-SHA256 under ``key``."""
    return hmac.new(key, data, hashlib.sha256).digest() + data


def unseal(blob: bytes, key: bytes, what: str) -> bytes:
    """The data :func:`seal` sealed; RuntimeExecutionError if it was not sealed with ``key``."""
    mac, data = blob[:32], blob[32:]
    if len(blob) < 32 or not hmac.compare_digest(mac, hmac.new(key, data, hashlib.sha256).digest()):
        raise RuntimeExecutionError(f"{what} was not written by this launch (its seal does not match); refusing to read it")
    return data


def write_sealed(path: Path, obj: Any, key: bytes) -> None:
    """Pickle ``obj`` sealed to ``path`` (inside a private folder), atomically."""
    from umsearch.core.jsonio import write_bytes_atomic

    write_bytes_atomic(path, seal(pickle.dumps(obj), key))


def read_sealed(path: Path, key: bytes, what: str) -> Any:
    """Unpickle a file :func:`write_sealed` wrote in a private folder, after checking its seal."""
    check_private_dir(path.parent)
    return pickle.loads(unseal(path.read_bytes(), key, what))  # noqa: S301 - sealed by this launch


# ---------------------------------------------------------------------------
# Starting torchrun
# ---------------------------------------------------------------------------


def launch(target: Callable[..., Any], world_size: int, args: Sequence[Any] = (),
           config: LaunchConfig | None = None) -> list[Any]:  # fmt: skip
    """Run ``target(rank, world_size, *args)`` in ``world_size`` torchrun ranks; their results by rank.

    ``target`` and ``args`` travel pickled (sealed, in the private folder), so
    ``target`` must be a module-level function and the arguments picklable (a
    model factory: a module-level function or a ``functools.partial`` of one).
    Each rank has the default process group initialised before ``target`` runs.
    """
    cfg = config or LaunchConfig()
    _check_backend(cfg, world_size)
    try:
        job = pickle.dumps((target, tuple(args), cfg))
    except Exception as exc:  # noqa: BLE001 - pickling raises many types; all mean the same
        raise RuntimeExecutionError(
            f"cannot hand the job to the rank processes: {type(exc).__name__}: {exc}; the target and its "
            "arguments (e.g. the model factory) must be picklable: a module-level function or a "
            "functools.partial of one, not a lambda or a local function"
        ) from None
    key = new_key()
    with private_dir() as out:
        from umsearch.core.jsonio import write_bytes_atomic

        write_bytes_atomic(out / JOB_FILE, seal(job, key))
        (out / JOB_FILE).chmod(0o600)
        return _torchrun(world_size, ["--job", str(out / JOB_FILE)], cfg, out, key)


def launch_entry(world_size: int, entry_args: Sequence[str], config: LaunchConfig) -> list[Any]:
    """Run the entry point with ``entry_args`` (a plan file and its flags) in ``world_size`` ranks."""
    _check_backend(config, world_size)
    with private_dir() as out:
        return _torchrun(world_size, list(entry_args), config, out, new_key())


def torchrun_command(world_size: int, entry_args: Sequence[str]) -> list[str]:
    """The local torchrun command line (one node, ``world_size`` ranks)."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
            f"--nproc-per-node={world_size}", "--max-restarts=0", "-m", ENTRY_MODULE, *entry_args]  # fmt: skip


def _check_backend(cfg: LaunchConfig, world_size: int) -> None:
    if cfg.backend not in ("gloo", "nccl"):
        raise RuntimeExecutionError(f"unknown backend {cfg.backend!r}; use 'gloo' (CPU) or 'nccl' (GPUs)")
    if cfg.backend == "nccl":
        import torch

        if torch.cuda.device_count() < world_size:
            raise RuntimeExecutionError(
                f"backend nccl needs one GPU per rank: {world_size} ranks but {torch.cuda.device_count()} "
                "GPU(s) here; use --backend gloo or a plan with fewer ranks"
            )


def _environment(cfg: LaunchConfig, key: bytes, out: Path) -> dict[str, str]:
    env = dict(os.environ)
    # torchrun's own temporary files (its log folder) and the ranks' go into the private folder too,
    # so that removing it leaves nothing behind.
    env["TMPDIR"] = str(out)
    # The ranks import what the caller can (tests, user modules): hand them its module path.
    env["PYTHONPATH"] = os.pathsep.join(p for p in [os.getcwd(), *sys.path] if p)
    if cfg.threads is not None:
        env["OMP_NUM_THREADS"] = str(cfg.threads)
    elif "OMP_NUM_THREADS" not in env:
        env["OMP_NUM_THREADS"] = str(os.cpu_count() or 1)  # torch's default; keeps torchrun quiet
    env[KEY_ENV] = key.hex()
    env[LAUNCHER_PID_ENV] = str(os.getpid())
    return env


class _Signals:
    """While active, SIGTERM, SIGHUP and SIGINT only note themselves; the supervisor acts on them.

    Raising from the handler could land between starting torchrun and
    remembering it (an orphan); noting and polling cannot. Handlers can only
    be set in the main thread; elsewhere the signals keep their own handlers.
    """

    WATCHED = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)

    def __init__(self) -> None:
        self.received: int | None = None
        self.raised = False
        self._old: dict[int, Any] = {}

    def _note(self, signum: int, frame: FrameType | None) -> None:
        if self.received is None:
            self.received = signum

    def __enter__(self) -> _Signals:
        if threading.current_thread() is threading.main_thread():
            for s in self.WATCHED:
                self._old[s] = signal.signal(s, self._note)
        return self

    def __exit__(self, *exc: object) -> None:
        for s, old in self._old.items():
            signal.signal(s, old)
        if self.received is not None and not self.raised:
            os.kill(os.getpid(), self.received)  # came too late to act on here: its own handler decides

    def check(self) -> None:
        """Raise :class:`LaunchInterrupted` once a watched signal has come."""
        if self.received is not None:
            self.raised = True
            raise LaunchInterrupted(self.received)


def _torchrun(world_size: int, entry_args: list[str], cfg: LaunchConfig, out: Path, key: bytes) -> list[Any]:
    log_path = out / "torchrun.log"
    with _Signals() as signals, open(log_path, "wb") as log:
        # A session of its own: a Ctrl-C in the terminal reaches only us, and stop() ends it in order.
        proc = subprocess.Popen(torchrun_command(world_size, [*entry_args, f"--result-dir={out}"]),
                                stdout=log, stderr=subprocess.STDOUT, env=_environment(cfg, key, out),
                                start_new_session=True)  # fmt: skip
        watch = _Watch(proc=proc, world_size=world_size, out=out, log_path=log_path, cfg=cfg)
        try:
            watch.supervise(signals)
        finally:
            watch.stop()
    return [read_sealed(out / f"result{r}", key, f"the result of rank {r}") for r in range(world_size)]


# ---------------------------------------------------------------------------
# Watching and stopping the ranks
# ---------------------------------------------------------------------------


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
class _Watch:
    """One launch's torchrun process and the files its ranks write."""

    proc: subprocess.Popen[bytes]
    world_size: int
    out: Path
    log_path: Path
    cfg: LaunchConfig

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
        return cmd is not None and ENTRY_MODULE.encode() in cmd and str(self.out).encode() in cmd

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

    def supervise(self, signals: _Signals) -> None:
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
                    f"rank(s) {_ranks(waiting)} had not started {self.cfg.start_timeout_s:g} s after torchrun was "
                    f"started (stuck importing or joining the process group); torchrun's last line: {self._last_line()}"
                )
        elif self.cfg.run_timeout_s is not None and now - self.started_at > self.cfg.run_timeout_s:
            running = [r for r in range(self.world_size) if not self.reported(r)]
            raise RuntimeExecutionError(
                f"the run was still going {self.cfg.run_timeout_s:g} s after its ranks started; rank(s) "
                f"{_ranks(running)} still running were stopped (raise --time-limit, or look for a rank waiting "
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


def _ranks(ranks: Sequence[int]) -> str:
    return ", ".join(map(str, ranks)) or "none"


_PEER_LOST = re.compile(r"closed by peer|reset by peer|broken pipe|connection closed|connection refused|"
                        r"ECONNRESET|EPIPE|communicator was aborted|remote process exited|peer .* gone", re.I)  # fmt: skip
"""Errors a rank raises because another one went away: a consequence, never the cause."""


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def first_failure(errors: Sequence[dict[str, Any]], stopped: Sequence[dict[str, Any]], vanished: dict[int, float],
                  returncode: int | None, last_line: str) -> RuntimeExecutionError:  # fmt: skip
    """The failure that came first, as one line naming its rank.

    Causes before consequences: an error of a rank's own (earliest first);
    else a rank that vanished without a word (killed, out of memory, crashed;
    earliest seen first); else a rank stopped by a signal from outside the run;
    else an error about a lost peer; else torchrun's exit and last line.
    """
    own = sorted((e for e in errors if not _PEER_LOST.search(str(e.get("message", "")))), key=lambda e: e["time"])
    lost = sorted((e for e in errors if _PEER_LOST.search(str(e.get("message", "")))), key=lambda e: e["time"])
    others = len(errors) + len(stopped) + len(vanished) - 1
    tail = f" ({others} other rank(s) failed or were stopped after it)" if others > 0 else ""
    if own or (lost and not vanished and not stopped):
        rep = (own or lost)[0]
        err = RankFailure(_error_line(rep) + tail)
        err.add_note(f"traceback of rank {rep['rank']}:\n{rep.get('traceback', '')}")
        return err
    if vanished:
        r = min(vanished, key=lambda k: vanished[k])
        return RankFailure(f"rank {r} died without reporting an error (killed by a signal such as SIGKILL, by the "
                           f"out-of-memory killer, or crashed); the other ranks were stopped{tail}")  # fmt: skip
    if stopped:
        rep = min(stopped, key=lambda e: e["time"])
        return RankFailure(f"rank {rep['rank']} was stopped by {rep.get('signal', 'a signal')} from outside the run; "
                           f"the other ranks were stopped too{tail}")  # fmt: skip
    code = "no exit code" if returncode is None else f"code {returncode}"
    return RuntimeExecutionError(f"torchrun exited with {code} and no rank reported an error; its last line: "
                                 f"{_one_line(last_line)}")  # fmt: skip


def _error_line(rep: dict[str, Any]) -> str:
    rank, message = rep.get("rank"), _one_line(rep.get("message", ""))
    if rep.get("domain"):
        # Runtime errors often name their rank already ("rank 1 gave up waiting ...").
        return message if message.startswith(f"rank {rank} ") else f"rank {rank}: {message}"
    return f"rank {rank} failed: {rep.get('type', 'Exception')}: {message}"


def local_rank_device(backend: str) -> Any:
    """``cuda:LOCAL_RANK`` for NCCL, else the CPU (a ``torch.device``)."""
    import torch

    if backend == "nccl":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")
