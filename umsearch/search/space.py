"""The search space: what to search, read from TOML (``search_spaces/*.toml``) and CLI flags.

One keyword-only dataclass per TOML table (:class:`MicrobatchTable`,
:class:`ScheduleTable`, :class:`SearchTable`, the optional :class:`ClusterTable`)
and :class:`SearchSpace` for the top level. Each field's metadata (:func:`option`) is the one home of its
documentation, bounds and choices: the CLI builds ``umsearch search``'s flags
from it and ``search_spaces/README.md``'s table is :func:`markdown_table`
(a test holds them equal). Unknown keys and bad values raise
:class:`SearchSpaceError` naming the key and the fix. ``stages`` is accepted
as an alias of ``ranks`` (the pipeline's devices), as version 1 spaces and the
``--stages`` flag used it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from umsearch.core.cluster import Cluster
from umsearch.core.links import PRESETS, link_numbers
from umsearch.core.options import Option, Setting, check_value, option
from umsearch.core.plan import MAX_MICROBATCHES, MAX_RANKS, MAX_STAGES_PER_RANK
from umsearch.core.profile import Link
from umsearch.core.schedules import PEER_SCHEDULES
from umsearch.errors import SearchSpaceError

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}  # fmt: skip

MAX_BATCH = 1 << 20
"""Largest global batch a search takes (cost tables grow with the largest microbatch)."""
# MAX_RANKS (most ranks a search plans for) is the plan's own limit, umsearch.core.plan.MAX_RANKS.
PLACEMENTS: tuple[str, ...] = ("loop", "vshape", "any")
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
class MicrobatchTable:
    """``[microbatch]``: the microbatch sizes a plan may use."""

    min: int = field(default=1, metadata=option("smallest microbatch size", dest="min_microbatch", kind="int",
                                                bounds=(1, MAX_BATCH), flag="--microbatch-min",
                                                aliases=("--min-microbatch",)))  # fmt: skip
    max: int = field(default=0, metadata=option("largest microbatch size (0: the global batch)", dest="max_microbatch",
                                                kind="int", bounds=(0, MAX_BATCH), default_doc="B",
                                                flag="--microbatch-max", aliases=("--max-microbatch",)))  # fmt: skip
    multiple_of: int = field(default=1, metadata=option(
        "sizes must be multiples of this (a remainder microbatch excepted)", dest="multiple_of", kind="int",
        bounds=(1, MAX_BATCH), flag="--microbatch-multiple-of", aliases=("--multiple-of",)))  # fmt: skip
    max_count: int = field(default=64, metadata=option(
        "most microbatches per stage (`max_count x max` must reach B)", dest="max_microbatches", kind="int",
        bounds=(1, MAX_MICROBATCHES), flag="--microbatch-max-count", aliases=("--max-microbatches",)))  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class ScheduleTable:
    """``[schedule]``: the shapes of plan the search may build, and the peers it compares with."""

    stages_per_rank: tuple[int, ...] = field(default=(1, 2), metadata=option(
        "how many chunks a rank may hold (a plan uses one value)", dest="stages_per_rank", kind="ints",
        bounds=(1, MAX_STAGES_PER_RANK)))  # fmt: skip
    placement: Literal["loop", "vshape", "any"] = field(default="any", metadata=option(
        "`loop` (stage j on rank j mod R), `vshape` (down and back up, 2 per rank) or `any`", dest="placement",
        kind="choice", choices=PLACEMENTS))  # fmt: skip
    split_backward: bool = field(default=True, metadata=option(
        "whether backwards may split into I and W (needs a profile with I/W times)", dest="split_backward",
        kind="bool"))  # fmt: skip
    recompute: bool = field(default=True, metadata=option(
        "whether stages may recompute activations (and then split backward differently)", dest="recompute",
        kind="bool"))  # fmt: skip
    peers: tuple[str, ...] = field(default=tuple(PEER_SCHEDULES), metadata=option(
        "torch schedules to compare with: " + ", ".join(f"`{p}`" for p in PEER_SCHEDULES), dest="peers",
        kind="names", choices=tuple(PEER_SCHEDULES), default_doc="all six"))  # fmt: skip
    peer_stage_counts: Literal["all", "space"] = field(default="all", metadata=option(
        "stage counts per rank the looped peers are tried at: `all` torch accepts (the bar a user of them "
        "meets; slow on models of ~100 layers) or only the `space`'s own `stages_per_rank`",
        dest="peer_stage_counts", kind="choice", choices=("all", "space")))  # fmt: skip

    @property
    def placements(self) -> tuple[str, ...]:
        """The concrete placements allowed (``any`` expanded)."""
        return ("loop", "vshape") if self.placement == "any" else (self.placement,)


@dataclass(frozen=True, kw_only=True)
class SearchTable:
    """``[search]``: how hard to search."""

    population: int = field(default=96, metadata=option("NSGA-II population", dest="population", kind="int",
                                                        bounds=(4, 10_000)))  # fmt: skip
    generations: int = field(default=200, metadata=option(
        "most NSGA-II generations (a ceiling: NSGA-II stops earlier once it converges, see `stall_generations`; "
        "the polish runs after it)", dest="generations", kind="int", bounds=(1, 100_000)))  # fmt: skip
    stall_generations: int = field(default=20, metadata=option(
        "NSGA-II stops when, over this many generations, no structure (chunks per rank, placement) within 2% of "
        "the fastest got faster by more than `tolerance`", dest="stall_generations", kind="int",
        bounds=(1, 100_000)))  # fmt: skip
    tolerance: float = field(default=0.001, metadata=option(
        "relative gain below which a structure counts as stalled (0.001: 0.1%)", dest="tolerance", kind="float",
        bounds=(0, 1)))  # fmt: skip
    workers: int = field(default=0, metadata=option(
        "cores a search uses: threads that score each batch and processes that run the polish's chains (0: every "
        "core this process may use); the plan does not depend on it", dest="workers", kind="int", bounds=(0, 1024), default_doc="cores available"))  # fmt: skip
    time_budget_s: float = field(default=120.0, metadata=option(
        "safety stop: after this many seconds keep the best found (the result then depends on machine speed; the "
        "CLI says so)", dest="time_budget_s", kind="float", bounds=(0, 7 * 86400), aliases=("--time-budget",)))  # fmt: skip
    polish_rounds: int = field(default=1, metadata=option(
        "rounds of the final local search, each from the best plan of every structure; a round that improves "
        "nothing ends it (more: steadier across seeds, slower)", dest="polish_rounds", kind="int",
        bounds=(1, 100)))  # fmt: skip
    polish_stall: int = field(default=40, metadata=option(
        "a climb of the polish ends after this many jumps in a row found nothing faster (one pipeline; a cluster's "
        "factorizations get 12); more: steadier across seeds, slower", dest="polish_stall", kind="int",
        bounds=(1, 10_000)))  # fmt: skip
    seed: int = field(default=0, metadata=option(
        "same seed, same plan (unless the time budget stops the search)", dest="seed", kind="int",
        bounds=(0, 2**32 - 1)))  # fmt: skip


MAX_DEVICES = 1 << 20
"""Most devices (nodes x GPUs per node) a cluster search plans for."""
_PRESET_NAMES = ", ".join(f"`{n}`" for n in PRESETS)
_LINK_HELP = ("`{latency_ms, bandwidth_gb_per_s}` (ms, GB/s) or a preset name: " + _PRESET_NAMES
              + "; on the command line `LATENCY_MS,GB_PER_S` or a preset name")  # fmt: skip
_NO_LINK = Link(latency_ms=0.0, bandwidth_gb_per_s=1.0)


@dataclass(frozen=True, kw_only=True)
class ClusterTable:
    """``[cluster]`` (optional): plan data-parallel replicas of the pipeline on every device of a
    two-tier cluster (docs/model.md section 9); the search chooses the pipeline's ranks R, the replicas
    D (R x D = nodes x gpus_per_node), the layout and ZeRO-1."""

    nodes: int = field(default=1, metadata=option("nodes of the cluster", dest="nodes", kind="int",
                                                  bounds=(1, MAX_DEVICES), default_doc="required"))  # fmt: skip
    gpus_per_node: int = field(default=1, metadata=option("devices per node", dest="gpus_per_node", kind="int",
                                                          bounds=(1, 4096), default_doc="required"))  # fmt: skip
    intra: Link = field(default=_NO_LINK, metadata=option(
        "link between two devices of one node: " + _LINK_HELP, dest="intra", kind="link",
        default_doc="required"))  # fmt: skip
    inter: Link = field(default=_NO_LINK, metadata=option(
        "link between devices of different nodes (same forms as `intra`)", dest="inter", kind="link",
        default_doc="required"))  # fmt: skip

    @property
    def devices(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def cluster(self) -> Cluster:
        """The plan field ``cluster`` (docs/model.md section 9)."""
        return Cluster(gpus_per_node=self.gpus_per_node, intra=self.intra, inter=self.inter)


@dataclass(frozen=True, kw_only=True)
class SearchSpace:
    """Everything one search needs: the top-level keys of a space TOML and one table per section."""

    name: str = field(metadata=option("space name; outputs go to `results/<name>/`", dest="name", kind="text",
                                      default_doc="file stem"))  # fmt: skip
    profile: str = field(metadata=option("`umsearch.profile/2` (or `/1`) JSON; in a TOML, relative to its folder",
                                         dest="profile", kind="path", default_doc="required"))  # fmt: skip
    ranks: int = field(metadata=option(
        "pipeline devices R (`stages` is accepted as an alias: version 1 called the devices stages); with a "
        "`[cluster]`, optional: it fixes R, else the search chooses", dest="ranks", kind="int",
        bounds=(1, MAX_RANKS), default_doc="required"))  # fmt: skip
    global_batch: int = field(metadata=option("samples per iteration B", dest="global_batch", kind="int",
                                              bounds=(1, MAX_BATCH), aliases=("--batch",), default_doc="required"))  # fmt: skip
    memory_limit: float = field(default=float(80 * 2**30), metadata=option(
        "per-device limit: `80GiB`, `16GB`, `512MiB` or bytes", dest="memory_limit", kind="size",
        default_doc="80GiB"))  # fmt: skip
    state_factor: float = field(default=4.0, metadata=option(
        "bytes of training state per parameter byte (fp32 weights, grads, two Adam moments)", dest="state_factor",
        kind="float", bounds=(0, 1e6), default_doc="4"))  # fmt: skip
    microbatch: MicrobatchTable = field(default_factory=MicrobatchTable)
    """``[microbatch]``."""
    schedule: ScheduleTable = field(default_factory=ScheduleTable)
    """``[schedule]``."""
    search: SearchTable = field(default_factory=SearchTable)
    """``[search]``."""
    cluster: ClusterTable | None = None
    """``[cluster]``: None plans one pipeline on ``ranks`` devices."""

    @property
    def microbatch_sizes(self) -> list[int]:
        """Allowed sizes, ascending."""
        mb = self.microbatch
        hi = min(mb.max or self.global_batch, self.global_batch)
        return [b for b in range(mb.min, hi + 1) if b % mb.multiple_of == 0]

    def to_json(self) -> dict[str, Any]:
        """The space as its TOML reads: top-level keys and one object per table."""

        def plain(v: Any) -> Any:
            return list(v) if isinstance(v, tuple) else v

        out: dict[str, Any] = {}
        for table, f in _ENTRIES:
            holder = getattr(self, table) if table else self
            if holder is None:  # no [cluster]
                continue
            value = plain(getattr(holder, f.name))
            if isinstance(value, Link):
                value = value.to_json()
            (out.setdefault(table, {}) if table else out)[f.name] = value
        return out


TABLES = {"microbatch": MicrobatchTable, "schedule": ScheduleTable, "search": SearchTable, "cluster": ClusterTable}
"""The TOML tables of a space, by name."""


def _entries() -> list[tuple[str, Any]]:
    top = [("", f) for f in fields(SearchSpace) if f.metadata]
    return top + [(name, f) for name, cls in TABLES.items() for f in fields(cls)]


_ENTRIES = _entries()
"""Every key: (table, or "" for the top level; its dataclass field)."""


def _opt(f: Any) -> Option:
    """The :class:`~umsearch.core.options.Option` a key's field declares."""
    opt: Option = f.metadata["option"]
    return opt


def _dest(f: Any) -> str:
    """A key's name among the flat values (and its flag's parameter)."""
    return _opt(f).dest or f.name


def _flag(f: Any) -> str:
    """A key's flag: its own, else ``--`` and its dest with dashes."""
    return _opt(f).flag or "--" + _dest(f).replace("_", "-")


_BY_DEST = {_dest(f): (table, f) for table, f in _ENTRIES}
_REMOVED = {("schedule", "family"): "schedule.family was removed in version 2 (the search orders actions "
                                    "freely and compares with every peer schedule); delete it, or restrict "
                                    "[schedule] stages_per_rank / peers instead"}  # fmt: skip


def options() -> list[dict[str, Any]]:
    """Every key's metadata (:func:`option`) plus ``key`` (as a TOML writes it, e.g. ``[search] seed``):
    what the CLI builds its flags from and the README table is made of."""
    return [{"help": _opt(f).help, "dest": _dest(f), "kind": _opt(f).kind, "bounds": _opt(f).bounds,
             "choices": _opt(f).choices, "flag": _flag(f), "aliases": _opt(f).aliases,
             "default_doc": _opt(f).default_doc, "key": f"[{table}] {f.name}" if table else f.name,
             "default": f.default} for table, f in _ENTRIES]  # fmt: skip


def space_settings(dests: Collection[str] | None = None) -> list[Setting]:
    """Every key (or those of ``dests``, in that order) as a declared setting: what commands make flags of."""
    rows = {_dest(f): Setting(TABLES[table] if table else SearchSpace, f, _opt(f)) for table, f in _ENTRIES}
    return list(rows.values()) if dests is None else [rows[d] for d in dests]


def _default_doc(o: dict[str, Any]) -> str:
    if o["default_doc"] is not None:
        return str(o["default_doc"])
    d = o["default"]
    if isinstance(d, bool):
        return str(d).lower()
    if isinstance(d, tuple):
        return "[" + ", ".join(map(str, d)) + "]"
    return f"{d:g}" if isinstance(d, float) else str(d)


def markdown_table() -> str:
    """The keys table of ``search_spaces/README.md`` (a test holds the README to it)."""
    rows = ["| key | default | meaning |", "|---|---|---|"]
    rows += [f"| `{o['key']}` | `{_default_doc(o)}` | {o['help']} |" for o in options()]
    return "\n".join(rows).replace("`required`", "required").replace("`file stem`", "file stem").replace(
        "`B`", "B").replace("`all six`", "all six").replace("`cores available`", "cores available")


def _flatten(doc: dict[str, Any]) -> dict[str, Any]:
    """TOML keys to the flat values of :func:`build_space` (each key's ``dest``)."""
    flat: dict[str, Any] = {}
    top = {f.name: f for table, f in _ENTRIES if not table}
    for key, value in doc.items():
        if isinstance(value, dict):
            if key not in TABLES:
                raise SearchSpaceError(f"unknown table [{key}]; known tables: {', '.join(TABLES)}")
            known = {f.name: f for f in fields(TABLES[key])}
            for sub, v in value.items():
                if (key, sub) in _REMOVED:
                    raise SearchSpaceError(_REMOVED[(key, sub)])
                if sub not in known:
                    raise SearchSpaceError(f"unknown key {key}.{sub}; known: {', '.join(sorted(known))}")
                flat[_dest(known[sub])] = v
        elif key in top or key == "stages":
            flat[_dest(top[key]) if key in top else key] = value
        else:
            raise SearchSpaceError(f"unknown key {key!r}; known top-level keys: {', '.join(sorted([*top, 'stages']))}")
    return flat


def _where(table: str, name: str) -> str:
    return f"{table}.{name}" if table else name


def _value(table: str, f: Any, v: Any) -> Any:
    """One key's value, checked against its metadata by the one switch on its kind
    (:func:`umsearch.core.options.check_value`); :class:`SearchSpaceError` names the key and the fix."""
    return check_value(_opt(f), v, _where(table, f.name), SearchSpaceError, {"size": parse_bytes, "link": parse_link})


def parse_link(value: Any, key: str = "cluster.intra") -> Link:
    """A link: ``{latency_ms, bandwidth_gb_per_s}``, a preset name (``nvlink4``, ``ib-ndr``, ...) or
    ``"LATENCY_MS,GB_PER_S"`` (the CLI's form); :class:`SearchSpaceError` names the key and the fix."""
    fix = (f"write {key} = {{latency_ms = 0.005, bandwidth_gb_per_s = 300}} or a preset name "
           f"({', '.join(PRESETS)})")  # fmt: skip
    if isinstance(value, str):
        if value in PRESETS:
            p = PRESETS[value]
            return Link(latency_ms=p.latency_ms, bandwidth_gb_per_s=p.bandwidth_gb_per_s)
        parts = value.split(",")
        try:
            value = {"latency_ms": float(parts[0]), "bandwidth_gb_per_s": float(parts[1])} if len(parts) == 2 else None
        except ValueError:
            value = None
        if value is None:
            raise SearchSpaceError(f"{key} = {parts[0] if len(parts) == 1 else ','.join(parts)!r} is no link; {fix}")
    if not isinstance(value, dict):
        raise SearchSpaceError(f"{key} = {value!r} is no link; {fix}")
    extra = sorted(set(value) - {"latency_ms", "bandwidth_gb_per_s"})
    if extra or len(value) != 2:
        raise SearchSpaceError(f"{key} has keys {sorted(value)}; give exactly latency_ms and bandwidth_gb_per_s")
    latency, bandwidth = link_numbers(value["latency_ms"], value["bandwidth_gb_per_s"], key, SearchSpaceError)
    return Link(latency_ms=latency, bandwidth_gb_per_s=bandwidth)


def _ranks_alias(v: dict[str, Any]) -> None:
    """``stages`` is ``ranks`` by its version-1 name: fold it in, refusing two different values."""
    if "stages" in v:
        if "ranks" in v and v["ranks"] != v["stages"]:
            raise SearchSpaceError(f"ranks = {v['ranks']!r} and its alias stages = {v['stages']!r} disagree; give one")
        v["ranks"] = v.pop("stages")


@dataclass(frozen=True)
class FromFile:
    """A value read from a file other than the space TOML (``umsearch search --cluster C.toml``):
    :func:`build_space` and :func:`load_space` name that file in any error about it."""

    value: Any
    """The value as the file holds it."""
    path: str
    """The file it came from."""


class _Located(SearchSpaceError):
    """An error whose message already names where the value came from (a cluster file, a flag):
    :func:`load_space` does not prefix the space TOML's path to it."""


def build_space(values: dict[str, Any], base_dir: Path | None = None) -> SearchSpace:
    """Validate flat values (keyed by each key's ``dest``: TOML keys flattened, or CLI flags) into a
    :class:`SearchSpace`. A :class:`FromFile` value (from :func:`cluster_values`) is checked like the
    plain value, and an error about it names its file."""
    return _build(values, base_dir, flags=())


def _build(values: dict[str, Any], base_dir: Path | None, flags: Collection[str]) -> SearchSpace:
    """:func:`build_space`, with ``flags`` the dests given as command-line flags: errors about their
    values name the flag."""
    v = dict(values)
    _ranks_alias(v)
    unknown = sorted(set(v) - set(_BY_DEST))
    if unknown:
        raise SearchSpaceError(f"unknown search space value {unknown[0]!r}; known: {', '.join(sorted(_BY_DEST))}")

    def origin(dest: str) -> str | None:
        """Where ``dest``'s value came from when not the space TOML: its file, or its flag."""
        if isinstance(v.get(dest), FromFile):
            return str(v[dest].path)
        return f"flag {_flag(_BY_DEST[dest][1])}" if dest in flags else None

    def located(message: str, *dests: str) -> SearchSpaceError:
        """The error of ``message``, prefixed with the first of ``dests``' origins that is known."""
        where = next((o for o in map(origin, dests) if o is not None), None)
        return SearchSpaceError(message) if where is None else _Located(f"{where}: {message}")

    def check(dest: str, value: Any) -> Any:
        try:
            return _value(*_BY_DEST[dest], value.value if isinstance(value, FromFile) else value)
        except SearchSpaceError as exc:
            raise located(str(exc), dest) from None

    in_cluster = sorted(_dest(f) for f in fields(ClusterTable) if _dest(f) in v)
    for required in ("profile", "global_batch") if in_cluster else ("profile", "ranks", "global_batch"):
        if v.get(required) is None:
            raise SearchSpaceError(f"search space needs {required!r}; set it in the TOML or pass "
                                   f"{_flag(_BY_DEST[required][1])}")  # fmt: skip
    missing = _cluster_missing(in_cluster)
    if missing:
        raise located(missing, *in_cluster)
    checked = {dest: check(dest, value) for dest, value in v.items()}
    checked.setdefault("name", Path(checked["profile"]).stem)
    if not _NAME.fullmatch(checked["name"]) or ".." in checked["name"]:
        raise located(f"name = {checked['name']!r}: use letters, digits, '.', '_' or '-' (it names the output "
                      "folder)", "name")  # fmt: skip
    if base_dir is not None and not Path(checked["profile"]).is_absolute():
        checked["profile"] = str(base_dir / checked["profile"])
    parts: dict[str, dict[str, Any]] = {table: {} for table in ("", *TABLES)}
    for dest, value in checked.items():
        table, f = _BY_DEST[dest]
        parts[table][f.name] = value
    parts[""].setdefault("ranks", 0)  # with a [cluster] and no ranks, the search chooses R
    tables = {t: cls(**parts[t]) for t, cls in TABLES.items() if t != "cluster" or parts[t]}
    space = SearchSpace(**parts[""], **tables)
    c = space.cluster
    if c is not None and c.devices > MAX_DEVICES:
        raise located(f"cluster.nodes x cluster.gpus_per_node = {c.nodes} x {c.gpus_per_node} = {c.devices} "
                      f"devices; plan for at most {MAX_DEVICES}", "nodes", "gpus_per_node")  # fmt: skip
    if c is not None and space.ranks and c.devices % space.ranks:
        devices_from = origin("nodes") or origin("gpus_per_node")
        raise located(f"ranks = {space.ranks} does not divide the cluster's {c.devices} devices"
                      f"{f' (nodes x gpus_per_node from {devices_from})' if devices_from else ''}; give a divisor "
                      "of nodes x gpus_per_node, or leave ranks out and let the search choose", "ranks")  # fmt: skip
    if not space.microbatch_sizes:
        mb = space.microbatch
        raise SearchSpaceError(
            f"no microbatch size satisfies min={mb.min}, max={mb.max}, multiple_of={mb.multiple_of} for "
            f"global_batch={space.global_batch}; widen [microbatch]"
        )
    return space


def _cluster_missing(given: list[str]) -> str | None:
    """Why a ``[cluster]`` naming only some of its keys is refused (it names all or none); None when whole."""
    keys = [f.name for f in fields(ClusterTable)]
    missing = [k for k in keys if k not in given]
    if not given or not missing:
        return None
    example = {"nodes": "2", "gpus_per_node": "8", "intra": "'nvlink4'", "inter": "'ib-ndr'"}[missing[0]]
    return (f"[cluster] needs {missing[0]!r} (it has {', '.join(given)}); add {missing[0]} = {example} to the "
            f"table or pass --{missing[0].replace('_', '-')}")  # fmt: skip


def cluster_values(path: str | Path) -> dict[str, Any]:
    """The ``[cluster]`` table of a TOML file (``umsearch search --cluster C.toml``) as flat values
    for :func:`build_space` / :func:`load_space`'s overrides, each a :class:`FromFile`, so that an
    error about one names this file (not the space TOML)."""
    from umsearch.storage.jsonio import read_toml

    p = Path(path)
    doc = read_toml(p, "cluster file", SearchSpaceError)
    if set(doc) != {"cluster"} or not isinstance(doc["cluster"], dict):
        raise SearchSpaceError(f"{p}: a cluster file holds one [cluster] table (nodes, gpus_per_node, intra, inter); "
                               f"it has {', '.join(sorted(doc)) or 'nothing'}")  # fmt: skip
    try:
        return {dest: FromFile(value, str(p)) for dest, value in _flatten(doc).items()}
    except SearchSpaceError as exc:
        raise SearchSpaceError(f"{p}: {exc}") from None


def load_space(path: str | Path, overrides: dict[str, Any] | None = None) -> SearchSpace:
    """Read a TOML search space; ``overrides`` (CLI flags, None values ignored) win. An error names the
    space TOML, or the flag, or the file of a :class:`FromFile` override, whichever gave the bad value."""
    from umsearch.storage.jsonio import read_toml

    p = Path(path)
    doc = read_toml(p, "search space", SearchSpaceError)
    flags = {k: val for k, val in (overrides or {}).items() if val is not None}
    _ranks_alias(flags)  # --ranks 2 --stages 3 is a conflict, not a choice
    try:
        values = _flatten(doc)
        _ranks_alias(values)
        values.setdefault("name", p.stem)
        base = None if "profile" in flags else p.parent
        values.update(flags)
        return _build(values, base, flags=[k for k, val in flags.items() if not isinstance(val, FromFile)])
    except _Located:
        raise
    except SearchSpaceError as exc:
        raise SearchSpaceError(f"{p}: {exc}") from None
