"""The evaluator benchmark's bookkeeping: which contenders it times and pairs (its rates are benchmarks, not tests)."""

from __future__ import annotations

import numba
import pytest

from benchmarks.evaluator import run_workload


@pytest.mark.slow  # compiles the old evaluator without a disk cache
def test_each_contender_is_timed_with_pack_and_alone_and_paired_with_its_old_twin() -> None:
    res = run_workload("r8_v2", plans=3, rounds=2)
    threads = sorted({1, numba.get_num_threads()})
    names = {f"{who}{alone}_{n}thread" for who in ("old", "new") for alone in ("", "_evaluate") for n in threads}
    assert set(res["plans_per_s"]) == names == set(res["plans_per_cpu_s"])
    assert all(v["n"] == 2 and v["median"] > 0 for v in res["plans_per_s"].values())
    assert set(res["ratios"]) == {f"new_over_old{alone}_{n}thread" for alone in ("", "_evaluate") for n in threads}
    assert res["plans_per_round"] == 3
