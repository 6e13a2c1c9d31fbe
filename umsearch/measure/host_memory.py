"""The CPU allocator while the profiler times layers: freed memory stays in the process, as in training.

glibc's malloc hands large freed blocks back to the kernel (``munmap`` above
its mmap threshold, trimming the heap's top above its trim threshold), so
the next allocation of that size faults in fresh zeroed pages. A training
loop settles into reusing its buffers step after step; the profiler, which
alternates layers, sizes and stage-sized ranges from one burst to the next,
never settles, and on CPU it paid those page faults inside the timed calls.
On the hybrid zoo model (2 ranks' CPU machine) a transformer block's forward
measured 5.0 / 8.8 / 20.0 ms at 8 / 16 / 32 samples that way, against 3.3 /
6.3 / 12.4 ms with freed memory kept, what the same burst took run by
itself; its stage-sized range check went from 16% under the layers' sum to 1.5%.

CUDA needs nothing: torch's caching allocator already keeps device memory.
"""

from __future__ import annotations

import ctypes

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
"""glibc's ``mallopt`` parameters (``malloc.h``)."""

KEEP_BYTES = 2**31 - 1
"""Both thresholds: the largest value ``mallopt`` takes (an ``int``). A block below it is served from
the heap and stays there once freed; the heap's top is never trimmed below it."""

MMAP_FALLBACK = 32 * 2**20
"""The mmap threshold's ceiling in glibc versions that refuse more (64-bit ``DEFAULT_MMAP_THRESHOLD_MAX``)."""


def keep_freed_memory() -> str | None:
    """Make glibc's malloc keep freed memory for reuse in this process (for good: the thresholds stop
    adapting); a description of the thresholds it set, for the profile's measurement record, or None
    where it set none (no ``mallopt``: not glibc, nothing changed)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the process's own C library
    except (OSError, AttributeError, TypeError):
        return None
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    mmap = next((v for v in (KEEP_BYTES, MMAP_FALLBACK) if mallopt(M_MMAP_THRESHOLD, v)), None)
    trim = KEEP_BYTES if mallopt(M_TRIM_THRESHOLD, KEEP_BYTES) else None
    set_ = [f"{name} {v}" for name, v in (("M_MMAP_THRESHOLD", mmap), ("M_TRIM_THRESHOLD", trim)) if v is not None]
    return f"glibc malloc keeps freed memory (mallopt {', '.join(set_)})" if set_ else None
