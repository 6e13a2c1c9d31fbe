"""The search space: what to search, read from TOML (``search_spaces/*.toml``) and CLI flags.

Every key is documented in ``search_spaces/README.md``. Unknown keys and bad
values raise :class:`SearchSpaceError` naming the key and the fix. ``stages``
is accepted as an alias of ``ranks`` (the pipeline's devices), as version 1
spaces and the ``--stages`` flag used it.
"""

from __future__ import annotations

import math
import re
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from umsearch.core.errors import SearchSpaceError
from umsearch.core.schedules import PEER_SCHEDULES

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}  # fmt: skip

MAX_BATCH = 1 << 20
"""Largest global batch a search takes (cost tables grow with the largest microbatch)."""
MAX_RANKS = 256
"""Most ranks a search plans for."""
PLACEMENTS = ("loop", "vshape", "any")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def parse_bytes(value: Any, key: str = "memory_limit") -> float:
    """``80GiB``, ``16GB``, ``512MiB`` or a number of bytes (finite, positive)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        if math.isfinite(value) and 0 < value < 1e24:
            return float(value)
    elif isinstance(value, str):
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", value)
        if m and m.group(2).lower() in _UNITS:
            v = float(m.group(1)) * _UNITS[m.group(2).lower()]
            if 0 < v < 1e24:
                return v
    raise SearchSpaceError(f"{key} = {value!r} is not a size; write e.g. '80GiB', '16GB' or a byte count")


@dataclass(frozen=True, kw_only=True)
class SearchSpace:
    """Everything one search needs."""

    name: str
    """Space name (a safe file name); outputs default to ``results/<name>/``."""
    profile: str
    """Path of the profile (relative paths are taken from the TOML file's folder)."""
    ranks: int
    """Pipeline devices R."""
    global_batch: int
    """Samples per iteration B."""
    min_microbatch: int = 1
    """Smallest microbatch size allowed."""
    max_microbatch: int = 0
    """Largest microbatch size allowed (0: the global batch)."""
    multiple_of: int = 1
    """Microbatch sizes must be multiples of this (a remainder microbatch excepted)."""
    max_microbatches: int = 64
    """Most microbatches per stage."""
    stages_per_rank: tuple[int, ...] = (1, 2)
    """How many model chunks a rank may hold (one value is chosen per plan)."""
    placement: str = "any"
    """How chunks sit on ranks when a rank holds several: ``loop`` (stage j on rank j mod R),
    ``vshape`` (down the ranks and back up; two chunks per rank) or ``any`` (either)."""
    split_backward: bool = True
    """Whether backwards may be split into input-gradient (I) and weight-gradient (W) parts
    (needs a profile with ``bwd_input_ms``/``bwd_weight_ms``)."""
    recompute: bool = True
    """Whether stages may recompute activations (and then split their backward differently)."""
    peers: tuple[str, ...] = tuple(PEER_SCHEDULES)
    """torch.distributed.pipelining schedules to compare with (their best equal-microbatch plans)."""
    memory_limit: float = float(80 * 2**30)
    """Per-device memory limit in bytes."""
    state_factor: float = 4.0
    """Bytes of training state per parameter byte."""
    population: int = 96
    """NSGA-II population size."""
    generations: int = 30
    """NSGA-II generations."""
    time_budget_s: float = 30.0
    """Stop the search after this many seconds, keeping the best found."""
    polish_rounds: int = 1
    """Rounds of the final local search; each starts again from the best of every structure, and a round
    that finds nothing faster ends it (more rounds: steadier across seeds, slower)."""
    seed: int = 0
    """Random seed: same seed, same plan (unless the time budget stops the search)."""

    @property
    def microbatch_sizes(self) -> list[int]:
        """Allowed sizes, ascending."""
        hi = min(self.max_microbatch or self.global_batch, self.global_batch)
        return [b for b in range(self.min_microbatch, hi + 1) if b % self.multiple_of == 0]

    @property
    def placements(self) -> tuple[str, ...]:
        """The concrete placements allowed (``any`` expanded)."""
        return ("loop", "vshape") if self.placement == "any" else (self.placement,)

    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["stages_per_rank"], out["peers"] = list(self.stages_per_rank), list(self.peers)
        return out


_SECTIONS = {
    "": {"name", "profile", "ranks", "stages", "global_batch", "memory_limit", "state_factor"},
    "microbatch": {"min", "max", "multiple_of", "max_count"},
    "schedule": {"stages_per_rank", "placement", "split_backward", "recompute", "peers"},
    "search": {"population", "generations", "time_budget_s", "seed", "polish_rounds"},
}
_FLAT: dict[tuple[str, str], str] = {("microbatch", "min"): "min_microbatch", ("microbatch", "max"): "max_microbatch",
         ("microbatch", "multiple_of"): "multiple_of", ("microbatch", "max_count"): "max_microbatches"}  # fmt: skip
_REMOVED = {("schedule", "family"): "schedule.family was removed in version 2 (the search orders actions "
                                    "freely and compares with every peer schedule); delete it, or restrict "
                                    "[schedule] stages_per_rank / peers instead"}  # fmt: skip


def _flatten(doc: dict[str, Any]) -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in doc.items():
        if isinstance(value, dict):
            section = _SECTIONS.get(key) if key else None
            if section is None:
                raise SearchSpaceError(f"unknown table [{key}]; known tables: microbatch, schedule, search")
            for sub, v in value.items():
                if (key, sub) in _REMOVED:
                    raise SearchSpaceError(_REMOVED[(key, sub)])
                if sub not in section:
                    raise SearchSpaceError(f"unknown key {key}.{sub}; known: {', '.join(sorted(section))}")
                flat[_FLAT.get((key, sub)) or sub] = v
        elif key in _SECTIONS[""]:
            flat[key] = value
        else:
            raise SearchSpaceError(f"unknown key {key!r}; known top-level keys: {', '.join(sorted(_SECTIONS['']))}")
    return flat


def _int(key: str, v: Any, lo: int, hi: int = 2**31 - 1) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise SearchSpaceError(f"{key} = {v!r}: must be an integer from {lo} to {hi}")
    return v


def _positive(key: str, v: Any, hi: float) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or not 0 < v <= hi:
        raise SearchSpaceError(f"{key} = {v!r}: must be a finite positive number up to {hi:g}")
    return float(v)


def _int_list(key: str, v: Any) -> tuple[int, ...]:
    items = v if isinstance(v, list | tuple) else [v]
    if not items:
        raise SearchSpaceError(f"{key} = {v!r}: give at least one value, e.g. [1, 2]")
    return tuple(sorted({_int(key, x, 1, 64) for x in items}))


def _peers(v: Any) -> tuple[str, ...]:
    items = v if isinstance(v, list | tuple) else [v]
    for p in items:
        if p not in PEER_SCHEDULES:
            raise SearchSpaceError(f"schedule.peers names {p!r}; known: {', '.join(PEER_SCHEDULES)}")
    return tuple(dict.fromkeys(items))


def _bool(key: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise SearchSpaceError(f"{key} = {v!r}: use true or false")
    return v


def build_space(values: dict[str, Any], base_dir: Path | None = None) -> SearchSpace:
    """Validate flat values (TOML keys flattened, or CLI flags) into a :class:`SearchSpace`."""
    v = dict(values)
    if "stages" in v:
        if "ranks" in v and v["ranks"] != v["stages"]:
            raise SearchSpaceError(f"ranks = {v['ranks']!r} and its alias stages = {v['stages']!r} disagree; give one")
        v["ranks"] = v.pop("stages")
    for required in ("profile", "ranks", "global_batch"):
        if v.get(required) is None:
            flag = {"global_batch": "batch"}.get(required, required)
            raise SearchSpaceError(f"search space needs {required!r}; set it in the TOML or pass --{flag}")
    if not isinstance(v["profile"], str):
        raise SearchSpaceError(f"profile = {v['profile']!r}: must be a path string")
    v.setdefault("name", Path(v["profile"]).stem)
    if not isinstance(v["name"], str) or not _NAME.fullmatch(v["name"]) or ".." in v["name"]:
        raise SearchSpaceError(f"name = {v['name']!r}: use letters, digits, '.', '_' or '-' (it names the output folder)")
    if base_dir is not None and not Path(v["profile"]).is_absolute():
        v["profile"] = str(base_dir / v["profile"])
    limits = {"ranks": (1, MAX_RANKS), "global_batch": (1, MAX_BATCH), "min_microbatch": (1, MAX_BATCH),
              "max_microbatch": (0, MAX_BATCH), "multiple_of": (1, MAX_BATCH), "max_microbatches": (1, 100_000),
              "population": (4, 10_000), "generations": (1, 100_000), "seed": (0, 2**32 - 1),
              "polish_rounds": (1, 100)}  # fmt: skip
    for key, (lo, hi) in limits.items():
        if key in v:
            v[key] = _int(key, v[key], lo, hi)
    if "memory_limit" in v:
        v["memory_limit"] = parse_bytes(v["memory_limit"])
    if "state_factor" in v:
        v["state_factor"] = _positive("state_factor", v["state_factor"], 1e6)
    if "time_budget_s" in v:
        v["time_budget_s"] = _positive("time_budget_s", v["time_budget_s"], 7 * 86400)
    if "stages_per_rank" in v:
        v["stages_per_rank"] = _int_list("schedule.stages_per_rank", v["stages_per_rank"])
    if "placement" in v and v["placement"] not in PLACEMENTS:
        raise SearchSpaceError(f"schedule.placement = {v['placement']!r}: use {', '.join(map(repr, PLACEMENTS))}")
    for key in ("split_backward", "recompute"):
        if key in v:
            v[key] = _bool(f"schedule.{key}", v[key])
    if "peers" in v:
        v["peers"] = _peers(v["peers"])
    space = SearchSpace(**v)
    if not space.microbatch_sizes:
        raise SearchSpaceError(
            f"no microbatch size satisfies min={space.min_microbatch}, max={space.max_microbatch}, "
            f"multiple_of={space.multiple_of} for global_batch={space.global_batch}; widen [microbatch]"
        )
    return space


def load_space(path: str | Path, overrides: dict[str, Any] | None = None) -> SearchSpace:
    """Read a TOML search space; ``overrides`` (CLI flags, None values ignored) win."""
    from umsearch.core.jsonio import read_text

    p = Path(path)
    text = read_text(p, "search space", SearchSpaceError)
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SearchSpaceError(f"search space {str(p)!r} is not valid TOML: {exc}") from None
    try:
        values = _flatten(doc)
        values.setdefault("name", p.stem)
        flags = {k: val for k, val in (overrides or {}).items() if val is not None}
        if "stages" in flags and "ranks" in values:  # the flag alias overrides the file's ranks
            values["ranks"] = flags.pop("stages")
        base = None if "profile" in flags else p.parent
        values.update(flags)
        return build_space(values, base)
    except SearchSpaceError as exc:
        raise SearchSpaceError(f"{p}: {exc}") from None
