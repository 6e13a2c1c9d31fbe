"""A launch's private folder and the sealed files in it: nothing a launch reads is taken on trust.

The folder (:func:`private_dir`) is made by ``tempfile.mkdtemp`` (mode 0700) and removed at the end,
whatever happens. The job and every rank's result are pickled behind an HMAC under a key that exists
only in the environment of the launch's processes (:func:`seal`), and readers accept nothing but such
a folder (:func:`check_private_dir`).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import pickle
import secrets
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from umsearch.errors import RuntimeExecutionError

RUN_DIR_PREFIX = "umsearch-run-"
"""Name prefix of a launch's private folder (in the system's temporary directory)."""
KEY_ENV = "UMSEARCH_LAUNCH_KEY"
"""Environment variable holding the launch's sealing key (hex); set only for the launch's processes."""
JOB_FILE = "job.pkl"
"""The sealed ``(target, args, LaunchConfig)`` of :func:`umsearch.runtime.launch.launch`, in the private folder."""


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
    from umsearch.storage.jsonio import write_bytes_atomic

    write_bytes_atomic(path, seal(pickle.dumps(obj), key))


def read_sealed(path: Path, key: bytes, what: str) -> Any:
    """Unpickle a file :func:`write_sealed` wrote in a private folder, after checking its seal."""
    check_private_dir(path.parent)
    return pickle.loads(unseal(path.read_bytes(), key, what))  # noqa: S301 - sealed by this launch
