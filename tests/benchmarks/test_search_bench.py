"""The search benchmark's bookkeeping (its measurements are benchmarks, not tests)."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.search import kept_sections


def test_seeds_only_keeps_the_workers_and_rereads_the_rest(tmp_path: Path) -> None:
    out = tmp_path / "search.json"
    old = {"schema": "s/2", "environment": {"commit": "old"}, "runs": [1], "workers": {"scoring": 1.9},
           "memory_bound": {"commit": "stale"}}  # fmt: skip
    out.write_text(json.dumps(old))
    fresh = {"schema": "s/3", "environment": {"commit": "new"}, "runs": [2], "memory_bound": {"commit": "reread"},
             "evaluator": None}  # fmt: skip
    doc = kept_sections(out, fresh)
    assert doc["workers"] == {"scoring": 1.9, "environment": {"commit": "old"}}  # measured there, then
    assert {k: doc[k] for k in fresh} == fresh
    assert kept_sections(tmp_path / "absent.json", fresh) == fresh
