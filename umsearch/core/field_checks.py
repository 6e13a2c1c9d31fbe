"""Field checks shared by the profile and plan loaders: every rejection names the field and the fix.

JSON can hold what Python cannot use: integers too large for a float, floats
whose sums overflow, misspelled keys that would otherwise be dropped. These
helpers turn each of those into one domain error, so that a loader never
raises anything but its own error type.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Collection, Mapping
from typing import Any

from umsearch.errors import UmsearchError

MAX_MS = 1e9
"""Largest time a profile may state (about 11 days): sums of such times stay finite."""
MAX_BYTES = 1e18
"""Largest byte count a profile may state (an exabyte)."""
MAX_INT = 2**31 - 1
"""Largest integer (microbatch size, batch, layer index) any input may hold."""


def check_keys(obj: Mapping[str, Any], known: Collection[str], where: str, error: type[UmsearchError]) -> None:
    """Raise ``error`` for the first key of ``obj`` not in ``known``, suggesting the nearest known one."""
    for key in obj:
        if key not in known:
            close = difflib.get_close_matches(str(key), sorted(known), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; known keys: {', '.join(sorted(known))}"
            raise error(f"unknown field {where}{key!r}{hint}")


def number(value: Any, where: str, error: type[UmsearchError], *, positive: bool = False,
           limit: float = MAX_MS) -> float:  # fmt: skip
    """A finite number in ``[0, limit]`` (``(0, limit]`` when ``positive``), else ``error`` naming ``where``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise error(f"field {where} must be a number, got {value!r}")
    if isinstance(value, int) and abs(value) > limit:
        raise error(f"field {where} = {value} is above the limit {limit:g}; check the units")
    v = float(value)
    if not math.isfinite(v):
        raise error(f"field {where} must be finite, got {value!r}")
    if v < 0 or (positive and v == 0):
        raise error(f"field {where} must be {'positive' if positive else 'non-negative'}, got {value!r}")
    if v > limit:
        raise error(f"field {where} = {v:g} is above the limit {limit:g}; check the units")
    return v


def integer(value: Any, where: str, error: type[UmsearchError], *, lo: int = 0, hi: int = MAX_INT) -> int:
    """An integer in ``[lo, hi]`` (JSON booleans are not integers), else ``error`` naming ``where``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise error(f"field {where} must be an integer, got {value!r}")
    if not lo <= value <= hi:
        raise error(f"field {where} = {value} must be between {lo} and {hi}")
    return value


def text(value: Any, where: str, error: type[UmsearchError]) -> str:
    """A string, else ``error`` naming ``where``."""
    if not isinstance(value, str):
        raise error(f"field {where} must be a string, got {value!r}")
    return value


def required(obj: Mapping[str, Any], key: str, where: str, error: type[UmsearchError], see: str) -> Any:
    """``obj[key]``, else ``error`` saying which field is missing and where it is documented."""
    if key not in obj:
        raise error(f"missing field {where}{key!r}; add it (see {see})")
    return obj[key]


def mapping(value: Any, where: str, error: type[UmsearchError]) -> dict[str, Any]:
    """A JSON object, else ``error`` naming ``where``."""
    if not isinstance(value, dict):
        raise error(f"field {where} must be an object, got {type(value).__name__}")
    return value
