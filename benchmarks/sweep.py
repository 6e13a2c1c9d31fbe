"""``make sweep``: gather every ``results/sweep/<space>/baselines.json`` into ``summary.md``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from umsearch.storage.jsonio import write_text_atomic


def summarize(root: Path) -> str:
    """One row per space: plan time, each baseline's, speedups and the lower-bound gap."""
    lines = ["| space | umsearch ms | gpipe ms | 1f1b ms | greedy ms | vs best equal | lower-bound gap |",
             "|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for f in sorted(root.glob("*/baselines.json")):
        doc = json.loads(f.read_text())
        rows = {r["name"]: r for r in doc["rows"]}
        plan = rows["umsearch"]["iteration_ms"]
        cells = [f"{rows[n]['iteration_ms']:.3f}" if rows.get(n, {}).get("iteration_ms") else "-" for n in ("gpipe", "1f1b", "greedy")]
        equal = [rows[n]["iteration_ms"] for n in ("gpipe", "1f1b") if rows.get(n, {}).get("iteration_ms")]
        vs = f"{min(equal) / plan:.3f}x" if equal else "-"
        lines.append(f"| {f.parent.name} | {plan:.3f} | {' | '.join(cells)} | {vs} | {plan / doc['lower_bound_ms'] - 1:.1%} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "results/sweep")
    text = summarize(root)
    write_text_atomic(root / "summary.md", text)
    print(text)
