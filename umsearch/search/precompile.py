"""``python -m umsearch.search.precompile``: compile the search's numba kernels once, at install time.

The kernels are cached on disk (``cache=True``), so the first ``umsearch
search`` after install does not spend its time budget compiling (about 20 s
on a 2-core machine). A tiny search on the bundled default touches every
kernel: the list scheduler, the batch evaluator and the reference checks.
"""

from __future__ import annotations

import time

from umsearch.core.bundled import default_space
from umsearch.core.profile import load_profile
from umsearch.search.driver import run_search
from umsearch.search.space import load_space


def main() -> None:
    start = time.perf_counter()
    space = load_space(default_space(), {"ranks": 2, "global_batch": 8, "generations": 1, "population": 8, "time_budget_s": 600})
    run_search(space, load_profile(space.profile))
    print(f"umsearch: search kernels compiled and cached in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
