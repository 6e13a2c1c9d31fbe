"""The profiler's allocator setting: freed memory stays in the process, as a training loop reuses it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from umsearch.measure.host_memory import keep_freed_memory

# Allocates and touches 64 MiB through torch, frees it, and prints how much of it the process gave back.
_PROBE = """
import os, sys, torch
if sys.argv[1] == "keep":
    from umsearch.measure.host_memory import keep_freed_memory
    assert keep_freed_memory() is not None
page = os.sysconf("SC_PAGE_SIZE")
rss = lambda: int(open("/proc/self/statm").read().split()[1]) * page
x = torch.ones(16 * 2**20)  # 64 MiB, every page touched
held = rss()
del x
print((held - rss()) / 2**20)
"""


def _given_back_mib(mode: str) -> float:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, check=True
    )
    return float(out.stdout.strip())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")
def test_freed_memory_stays_in_the_process_once_kept() -> None:
    if keep_freed_memory() is None:
        pytest.skip("not glibc: the profiler leaves the allocator alone")
    assert _given_back_mib("default") > 48  # glibc hands a freed 64 MiB block straight back
    assert _given_back_mib("keep") < 16  # kept for the next burst: no fresh pages to fault in


def test_the_setting_is_described_for_the_profile_record_and_can_be_repeated() -> None:
    first = keep_freed_memory()
    if first is None:
        pytest.skip("not glibc")
    assert first.startswith("glibc malloc keeps freed memory") and keep_freed_memory() == first
