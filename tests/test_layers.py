"""The house keeps its floors and nothing imports in a circle.

ARCHITECTURE.md draws the floors. A package may import its own floor and the floors below it, never
one above, so a contract change travels one way. Below the floors, no module imports itself back
through others, within a package or across: a circle works only by the accident of import order
(or a function-level import) and ties the modules into one that cannot change alone.

What counts as an import of a module of the package, at any depth (function bodies and
``if TYPE_CHECKING:`` blocks included, since a circle of types is still a circle):

- ``import umsearch.a.b`` and ``from umsearch.a.b import name``: ``umsearch.a.b``;
- ``from umsearch.a import b``: the module ``umsearch.a.b`` where ``b`` is one, else ``umsearch.a``
  itself (``b`` is a name of its ``__init__``) and, where that ``__init__`` exports ``b`` lazily
  (its ``_EXPORTS`` table, imported by ``__getattr__`` on this very statement), the module that
  defines ``b`` too; ``from umsearch import X`` is the same rule one level up;
- relative imports (``from . import x``, ``from ..core import y``), resolved first;
- the string-literal targets of ``importlib.import_module(...)`` (and ``import_module``) and of
  ``__import__(...)``, relative ones with a literal, ``__package__`` or ``__name__`` package.

``__init__`` modules: importing ``umsearch.a.b`` runs ``umsearch/a/__init__.py`` first, so that is an
edge too, except from a module inside ``umsearch.a``: Python imported its parent packages before it
ran, and a submodule importing a sibling finds its partly run ``__init__`` in ``sys.modules`` without
running it again. So a package's ``__init__`` importing its own submodules is no circle; one that a
submodule imports back through, by taking a name out of the ``__init__`` (``from umsearch.a import
name`` where ``name`` is not a module), is. A module importing itself is no edge.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "umsearch"

FLOORS: dict[str, set[str]] = {
    "errors": set(),
    "storage": {"errors"},
    "core": {"errors", "storage"},
    "formats": {"errors", "core", "storage"},
    "sim": {"errors", "core"},
    "search": {"errors", "core", "sim", "storage"},
    "nn": {"errors", "core"},
    "adapters": {"errors", "core"},
    "measure": {"errors", "core", "nn", "adapters", "storage"},
    "runtime": {"errors", "core", "sim", "nn", "formats", "storage"},
    "orchestrate": {"errors", "core", "sim", "search", "nn", "measure", "runtime", "formats", "storage"},
    "cli": {"errors", "core", "sim", "search", "nn", "measure", "runtime", "orchestrate", "adapters", "formats", "storage"},
    "pipelining": {"errors", "runtime"},
}
"""What each package may import besides itself (``adapters`` is a module of its own)."""

TORCH_FREE = ("errors", "storage", "core", "formats", "sim", "search")
"""The deterministic core: pure numpy/Python, never torch."""

Graph = dict[str, dict[str, int]]
"""Module -> each module of the package it imports -> the line of its first such import."""


@dataclass(frozen=True)
class Import:
    """One import as written, made absolute."""

    line: int
    module: str
    """The module imported or imported from (a relative import resolved)."""
    name: str | None = None
    """The name taken from it (``from module import name``); None for ``import module``."""


def module_files(root: Path, package: str) -> dict[str, Path]:
    """Every module of the package at ``root`` by its dotted name (an ``__init__.py`` by its package's)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        out[".".join((package, *(parts[:-1] if parts[-1] == "__init__" else parts)))] = path
    return out


def _anchor(package: str, level: int) -> str:
    """The package a relative import of ``level`` dots made in ``package`` starts from."""
    parts = package.split(".")
    return ".".join(parts[: len(parts) - level + 1])


def _joined(base: str, rest: str | None) -> str:
    return f"{base}.{rest}" if rest else base


def _dynamic_target(call: ast.Call, package: str, module: str) -> str | None:
    """The module an ``import_module``/``__import__`` call with a literal name imports, else None."""
    func = call.func
    called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    if called not in ("import_module", "__import__") or not call.args:
        return None
    name = call.args[0]
    if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
        return None
    rest = name.value.lstrip(".")
    level = len(name.value) - len(rest)
    if level == 0:
        return rest
    # import_module(".x", package): the package is the second argument or the ``package`` keyword.
    given = [*call.args[1:2], *(k.value for k in call.keywords if k.arg == "package")]
    anchor = given[0] if given else None
    if isinstance(anchor, ast.Constant) and isinstance(anchor.value, str):
        base = anchor.value
    elif isinstance(anchor, ast.Name) and anchor.id in ("__package__", "__name__"):
        base = package if anchor.id == "__package__" else module
    else:
        return None
    return _joined(_anchor(base, level), rest)


def imports_of(source: str, module: str, is_package: bool = False) -> list[Import]:
    """Every import in ``source`` (the text of ``module``) at any depth, relative ones made absolute."""
    package = module if is_package else module.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [Import(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _joined(_anchor(package, node.level), node.module) if node.level else node.module or ""
            out += [Import(node.lineno, base, a.name) for a in node.names]
        elif isinstance(node, ast.Call) and (target := _dynamic_target(node, package, module)):
            out.append(Import(node.lineno, target))
    return out


def lazy_exports(source: str) -> dict[str, str]:
    """A package ``__init__``'s module-level ``_EXPORTS`` table: name -> submodule, relative to it."""
    for node in ast.parse(source).body:
        if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_EXPORTS" for t in node.targets)
                and isinstance(node.value, ast.Dict)):  # fmt: skip
            return {k.value: v.value for k, v in zip(node.value.keys, node.value.values, strict=True)
                    if isinstance(k, ast.Constant) and isinstance(v, ast.Constant)}  # fmt: skip
    return {}


def _known(module: str, modules: dict[str, Path]) -> str | None:
    """``module`` or the longest of its prefixes that is a module of the package, else None."""
    parts = module.split(".")
    return next((m for i in range(len(parts), 0, -1) if (m := ".".join(parts[:i])) in modules), None)


def _targets(imp: Import, modules: dict[str, Path], lazy: dict[str, dict[str, str]]) -> list[str]:
    """The modules of the package ``imp`` names (see the module docstring), before parent packages."""
    if imp.name is not None and f"{imp.module}.{imp.name}" in modules:
        return [f"{imp.module}.{imp.name}"]
    found = _known(imp.module, modules)
    if found is None:
        return []
    lazily = lazy.get(found, {}).get(imp.name or "") if found == imp.module else None
    return [found] + ([f"{found}.{lazily}"] if lazily and f"{found}.{lazily}" in modules else [])


def _with_parents(target: str, importer: str) -> list[str]:
    """``target`` and the packages Python runs on the way to it that do not hold ``importer``."""
    parts = target.split(".")
    parents = [".".join(parts[:i]) for i in range(1, len(parts))]
    return [p for p in parents if not importer.startswith(p + ".")] + [target]


def import_graph(root: Path, package: str) -> Graph:
    """Which module of the package at ``root`` (named ``package``) imports which, every kind counted."""
    modules = module_files(root, package)
    lazy = {m: lazy_exports(p.read_text(encoding="utf-8")) for m, p in modules.items() if p.name == "__init__.py"}
    graph: Graph = {}
    for module, path in modules.items():
        edges = graph.setdefault(module, {})
        for imp in imports_of(path.read_text(encoding="utf-8"), module, path.name == "__init__.py"):
            for target in _targets(imp, modules, lazy):
                for t in _with_parents(target, module):
                    if t != module:
                        edges.setdefault(t, imp.line)
    return graph


def cycles(graph: Graph) -> list[list[str]]:
    """Circles of ``graph``, each as its modules with the first repeated last; empty when it has none.

    One depth-first walk, each edge back onto its path a circle: every tangle of circles (a strongly
    connected set of modules) shows at least one, not necessarily all of its circles."""
    state: dict[str, int] = {}  # 1: on the walk's path, 2: done
    path: list[str] = []
    out: list[list[str]] = []

    def visit(m: str) -> None:
        state[m] = 1
        path.append(m)
        for t in sorted(graph.get(m, {})):
            if state.get(t) == 1:
                out.append([*path[path.index(t):], t])
            elif t not in state:
                visit(t)
        path.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    return out


def _shown(cycle: list[str], graph: Graph) -> str:
    return " -> ".join(f"{a} (line {graph[a][b]})" for a, b in pairwise(cycle)) + f" -> {cycle[-1]}"


def floor_breaches(graph: Graph, module: str) -> list[str]:
    """Each import of ``module`` into a package above its floor (:data:`FLOORS`), as a message."""
    pkg = module.split(".")[1]
    out = []
    for target, line in sorted(graph[module].items()):
        parts = target.split(".")
        if len(parts) > 1 and parts[1] != pkg and parts[1] not in FLOORS[pkg]:
            out.append(f"{module}:{line} imports {target}, above {pkg}'s floor")
    return out


GRAPH = import_graph(ROOT, "umsearch")
FILES = module_files(ROOT, "umsearch")
FLOORED = sorted(m for m in GRAPH if len(m.split(".")) > 1 and m.split(".")[1] in FLOORS)


def test_no_module_imports_in_a_circle() -> None:
    found = cycles(GRAPH)
    assert not found, "modules import in a circle:\n" + "\n".join(_shown(c, GRAPH) for c in found)


def test_the_graph_sees_every_kind_of_import() -> None:
    """The real tree's graph holds edges only the wider reading finds (else the tests above prove little)."""
    assert "umsearch.search.over_cluster" in GRAPH["umsearch.search.driver"]  # within search/
    assert "umsearch.search.driver" in GRAPH["umsearch.orchestrate.tune"]  # in a function
    assert "umsearch" in GRAPH["umsearch.cli.main"]  # from umsearch import __version__


@pytest.mark.parametrize("module", FLOORED)
def test_imports_point_down(module: str) -> None:
    assert not floor_breaches(GRAPH, module)


@pytest.mark.parametrize("module", [m for m in FLOORED if m.split(".")[1] in TORCH_FREE])
def test_the_core_never_imports_torch(module: str) -> None:
    for imp in imports_of(FILES[module].read_text(encoding="utf-8"), module, FILES[module].name == "__init__.py"):
        assert imp.module.split(".")[0] != "torch", f"{module}:{imp.line} imports torch"


def test_every_package_has_a_floor() -> None:
    packages = {p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists()} - {"data"}
    assert packages <= set(FLOORS), f"packages without a floor in this test: {sorted(packages - set(FLOORS))}"


# Planted trees: a fake package ``pkg`` in tmp_path, each file's text given.


def _plant(tmp_path: Path, files: dict[str, str]) -> Graph:
    root = tmp_path / "pkg"
    for rel in ["__init__.py", "core/__init__.py", "search/__init__.py", *files]:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(files.get(rel, ""), encoding="utf-8")
    return import_graph(root, "pkg")


A_IMPORTS_B = "from pkg.search.b import g\n\n\ndef f() -> None:\n    pass\n"
BACK_TO_A: dict[str, str] = {
    "within the package, in a function": "def g() -> None:\n    from pkg.search.a import f\n",
    "from the package, a module": "from pkg.search import a\n",
    "relative, the module": "from . import a\n",
    "relative, a name": "from .a import f\n",
    "relative, two levels": "from ..search.a import f\n",
    "importlib": "import importlib\n\nimportlib.import_module('pkg.search.a')\n",
    "import_module, relative": "from importlib import import_module\n\nimport_module('.a', __package__)\n",
    "__import__": "__import__('pkg.search.a')\n",
    "TYPE_CHECKING": "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from pkg.search.a import f\n",
}
"""Ways ``pkg/search/b.py`` imports ``pkg/search/a.py`` back."""


@pytest.mark.parametrize("back", BACK_TO_A.values(), ids=list(BACK_TO_A))
def test_a_planted_circle_fails(tmp_path: Path, back: str) -> None:
    graph = _plant(tmp_path, {"search/a.py": A_IMPORTS_B, "search/b.py": back})
    assert cycles(graph) == [["pkg.search.a", "pkg.search.b", "pkg.search.a"]]


def test_from_the_top_package_a_module(tmp_path: Path) -> None:
    graph = _plant(tmp_path, {"a.py": A_IMPORTS_B, "search/b.py": "from pkg import a\n"})
    assert cycles(graph) == [["pkg.a", "pkg.search.b", "pkg.a"]]


def test_a_name_re_exported_by_the_top_package_is_its_module(tmp_path: Path) -> None:
    init = "_EXPORTS = {'f': 'search.a'}\n\n\ndef __getattr__(name): ...\n"
    graph = _plant(tmp_path, {"__init__.py": init, "search/a.py": A_IMPORTS_B, "search/b.py": "from pkg import f\n"})
    assert cycles(graph) == [["pkg.search.a", "pkg.search.b", "pkg.search.a"]]


def test_an_init_importing_its_own_modules_is_no_circle(tmp_path: Path) -> None:
    files = {"search/__init__.py": "from pkg.search.a import f\n", "search/a.py": A_IMPORTS_B,
             "search/b.py": "import pkg.search.c\n", "search/c.py": "VALUE = 1\n"}  # fmt: skip
    assert cycles(_plant(tmp_path, files)) == []


def test_a_module_taking_a_name_back_out_of_its_init_is_a_circle(tmp_path: Path) -> None:
    files = {"search/__init__.py": "from pkg.search.a import f\nLIMIT = 1\n",
             "search/a.py": "from pkg.search import LIMIT\n\n\ndef f() -> None:\n    pass\n"}  # fmt: skip
    assert cycles(_plant(tmp_path, files)) == [["pkg.search", "pkg.search.a", "pkg.search"]]


def test_a_module_outside_imports_the_init_on_the_way(tmp_path: Path) -> None:
    files = {"search/__init__.py": "from pkg.core.x import X\n",
             "core/x.py": "X = 1\n\n\ndef f() -> None:\n    import pkg.search.a\n"}  # fmt: skip
    assert cycles(_plant(tmp_path, files)) == [["pkg.core.x", "pkg.search", "pkg.core.x"]]


@pytest.mark.parametrize("source", ["from ..search import b\n", "from pkg import search\n",
                                    "import importlib\n\nimportlib.import_module('pkg.search.b')\n"])  # fmt: skip
def test_a_planted_import_above_the_floor_fails(tmp_path: Path, source: str) -> None:
    graph = _plant(tmp_path, {"core/a.py": source, "search/b.py": ""})
    assert floor_breaches(graph, "pkg.core.a")



def test_every_lazy_export_of_the_runtime_resolves() -> None:
    """``umsearch.runtime`` imports its names on first use: each must name a module that defines it."""
    import umsearch.runtime as runtime

    for name in runtime.__all__:
        assert getattr(runtime, name) is not None, name
