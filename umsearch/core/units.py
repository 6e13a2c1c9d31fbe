"""How a size is written for people: one formatter for tables, reports and error lines alike."""

from __future__ import annotations


def format_bytes(n: float) -> str:
    """Human-readable binary size (``1.50 GiB``; whole bytes below 1 KiB)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
