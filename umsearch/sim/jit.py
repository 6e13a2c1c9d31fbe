"""numba's on-disk kernel cache, kept from going stale.

numba keys each cached function on the file that defines it, but a compiled
loop also holds what it inlined from other files: the action rules of
:mod:`umsearch.core.actions`, the shared kernels of :mod:`umsearch.sim.kernels`
and the constants it read from modules' globals. After an edit of such a file
numba would keep serving the old machine code. So every compiled module imports
:func:`njit` from here, and importing this module first compares one key over
*every* source the kernels compile (and numba's version) with the key stored
beside the caches; on a mismatch it deletes the caches of all of them, and the
next call compiles afresh (about 20 s on 2 cores). Users who never edit the
package pay nothing; an edit costs one recompile instead of a wrong answer.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numba

PACKAGE = Path(__file__).resolve().parent.parent
"""The ``umsearch`` package folder."""
SOURCES = ("core/actions.py", "core/cluster.py", "core/cost.py", "sim/action_rows.py", "sim/jit.py", "sim/kernels.py",
           "sim/population.py", "search/orders.py")
"""Every file whose code or globals the compiled kernels hold, relative to :data:`PACKAGE`."""
KEY_FILE = "umsearch-kernels.key"
"""The stored key, in ``sim/__pycache__`` (beside the caches it guards)."""


def sources_key(root: Path, sources: Iterable[str]) -> str:
    """One SHA-256 over numba's version and the bytes of every source (a missing one counts as empty)."""
    h = hashlib.sha256(numba.__version__.encode())
    for name in sources:
        h.update(b"\0" + name.encode() + b"\0")
        with contextlib.suppress(OSError):
            h.update((root / name).read_bytes())
    return h.hexdigest()


def drop_stale_caches(root: Path, sources: Iterable[str] = SOURCES) -> bool:
    """Delete the numba caches of ``sources``' folders when their key changed; True when it deleted.

    The key lives in ``root/sim/__pycache__``; a folder that cannot be written
    (a read-only install) is left alone, as numba then keeps no cache there.
    """
    names = list(sources)
    key = sources_key(root, names)
    stamp = root / "sim" / "__pycache__" / KEY_FILE
    try:
        if stamp.read_text() == key:
            return False
    except OSError:
        pass
    for folder in sorted({(root / n).parent / "__pycache__" for n in names}):
        with contextlib.suppress(OSError):
            for p in folder.iterdir():
                if p.suffix in (".nbi", ".nbc"):
                    p.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        stamp.parent.mkdir(exist_ok=True)
        tmp = stamp.with_name(f"{KEY_FILE}.{os.getpid()}.tmp")
        tmp.write_text(key)
        os.replace(tmp, stamp)
    return True


drop_stale_caches(PACKAGE)


def njit(*args: Any, **kwargs: Any) -> Callable[..., Any]:
    """``numba.njit`` with ``cache=True`` by default (the caches this module keeps fresh)."""
    kwargs.setdefault("cache", True)
    return numba.njit(*args, **kwargs)
