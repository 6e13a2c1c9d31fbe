"""The search space: what to search, read from TOML (``search_spaces/*.toml``) and CLI flags.

Every key is documented in ``search_spaces/README.md``. Unknown keys and bad
values raise :class:`SearchSpaceError` naming the key and the fix.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from umsearch.core.errors import SearchSpaceError

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}  # fmt: skip


def parse_bytes(value: Any, key: str = "memory_limit") -> float:
    """``80GiB``, ``16GB``, ``512MiB`` or a number of bytes."""
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return float(value)
    if isinstance(value, str):
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", value)
        if m and m.group(2).lower() in _UNITS and float(m.group(1)) > 0:
            return float(m.group(1)) * _UNITS[m.group(2).lower()]
    raise SearchSpaceError(f"{key} = {value!r} is not a size; write e.g. '80GiB', '16GB' or a byte count")


@dataclass(frozen=True, kw_only=True)
class SearchSpace:
    """Everything one search needs."""

    name: str
    """Space name; outputs default to ``results/<name>/``."""
    profile: str
    """Path of the ``umsearch.core.profile/1`` file (relative to the TOML file)."""
    stages: int
    """Pipeline stages S (devices)."""
    global_batch: int
    """Samples per iteration B."""
    min_microbatch: int = 1
    """Smallest microbatch size allowed."""
    max_microbatch: int = 0
    """Largest microbatch size allowed (0: the global batch)."""
    multiple_of: int = 1
    """Microbatch sizes must be multiples of this (remainders excepted)."""
    max_microbatches: int = 64
    """Most microbatches per stage."""
    schedule: str = "any"
    """``gpipe`` (warmup = all), ``1f1b`` (warmup = S - s) or ``any`` (warmup searched)."""
    recompute: bool = True
    """Whether stages may recompute activations."""
    memory_limit: float = float(80 * 2**30)
    """Per-device memory limit in bytes."""
    state_factor: float = 4.0
    """Bytes of training state per parameter byte."""
    population: int = 96
    """NSGA-II population size."""
    generations: int = 120
    """NSGA-II generations."""
    time_budget_s: float = 30.0
    """Stop the search after this many seconds, keeping the best found."""
    seed: int = 0
    """Random seed: same seed, same plan."""

    @property
    def microbatch_sizes(self) -> list[int]:
        """Allowed sizes, ascending."""
        hi = self.max_microbatch or self.global_batch
        return [b for b in range(self.min_microbatch, min(hi, self.global_batch) + 1) if b % self.multiple_of == 0]

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


_SECTIONS = {
    "": {"name", "profile", "stages", "global_batch", "memory_limit", "state_factor"},
    "microbatch": {"min", "max", "multiple_of", "max_count"},
    "schedule": {"family", "recompute"},
    "search": {"population", "generations", "time_budget_s", "seed"},
}
_FLAT: dict[tuple[str, str], str] = {("microbatch", "min"): "min_microbatch", ("microbatch", "max"): "max_microbatch",
         ("microbatch", "multiple_of"): "multiple_of", ("microbatch", "max_count"): "max_microbatches",
         ("schedule", "family"): "schedule", ("schedule", "recompute"): "recompute"}  # fmt: skip


def _flatten(doc: dict[str, Any]) -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in doc.items():
        if isinstance(value, dict):
            section = _SECTIONS.get(key) if key else None
            if section is None:
                raise SearchSpaceError(f"unknown table [{key}]; known tables: microbatch, schedule, search")
            for sub, v in value.items():
                if sub not in section:
                    raise SearchSpaceError(f"unknown key {key}.{sub}; known: {', '.join(sorted(section))}")
                flat[_FLAT.get((key, sub)) or sub] = v
        elif key in _SECTIONS[""]:
            flat[key] = value
        else:
            raise SearchSpaceError(f"unknown key {key!r}; known top-level keys: {', '.join(sorted(_SECTIONS['']))}")
    return flat


def _int(key: str, v: Any, lo: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise SearchSpaceError(f"{key} = {v!r}: must be an integer >= {lo}")
    return v


def build_space(values: dict[str, Any], base_dir: Path | None = None) -> SearchSpace:
    """Validate flat values (TOML keys flattened, or CLI flags) into a :class:`SearchSpace`."""
    for required in ("profile", "stages", "global_batch"):
        if values.get(required) is None:
            raise SearchSpaceError(f"search space needs {required!r}; set it in the TOML or pass --{required.replace('global_batch', 'batch')}")
    v = dict(values)
    v.setdefault("name", Path(str(v["profile"])).stem)
    if base_dir is not None and not Path(v["profile"]).is_absolute():
        v["profile"] = str(base_dir / v["profile"])
    for key, lo in (("stages", 1), ("global_batch", 1), ("min_microbatch", 1), ("max_microbatch", 0),
                    ("multiple_of", 1), ("max_microbatches", 1), ("population", 4), ("generations", 1),
                    ("seed", 0)):  # fmt: skip
        if key in v:
            v[key] = _int(key, v[key], lo)
    if "memory_limit" in v:
        v["memory_limit"] = parse_bytes(v["memory_limit"])
    if "schedule" in v and v["schedule"] not in ("any", "gpipe", "1f1b"):
        raise SearchSpaceError(f"schedule.family = {v['schedule']!r}: use 'any', 'gpipe' or '1f1b'")
    if "recompute" in v and not isinstance(v["recompute"], bool):
        raise SearchSpaceError(f"schedule.recompute = {v['recompute']!r}: use true or false")
    for key in ("state_factor", "time_budget_s"):
        if key in v and (isinstance(v[key], bool) or not isinstance(v[key], int | float) or v[key] <= 0):
            raise SearchSpaceError(f"{key} = {v[key]!r}: must be a positive number")
    space = SearchSpace(**v)
    if not space.microbatch_sizes:
        raise SearchSpaceError(
            f"no microbatch size satisfies min={space.min_microbatch}, max={space.max_microbatch}, "
            f"multiple_of={space.multiple_of} for global_batch={space.global_batch}; widen [microbatch]"
        )
    return space


def load_space(path: str | Path, overrides: dict[str, Any] | None = None) -> SearchSpace:
    """Read a TOML search space; ``overrides`` (CLI flags, None values ignored) win."""
    p = Path(path)
    try:
        doc = tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SearchSpaceError(f"search space {str(p)!r} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise SearchSpaceError(f"search space {str(p)!r} is not valid TOML: {exc}") from None
    values = _flatten(doc)
    values.setdefault("name", p.stem)
    base = p.parent
    if overrides and overrides.get("profile") is not None:
        base = None  # type: ignore[assignment]
    values.update({k: v for k, v in (overrides or {}).items() if v is not None})
    try:
        return build_space(values, base)
    except SearchSpaceError as exc:
        raise SearchSpaceError(f"{p}: {exc}") from None


def with_overrides(space: SearchSpace, **kw: Any) -> SearchSpace:
    return replace(space, **kw)
