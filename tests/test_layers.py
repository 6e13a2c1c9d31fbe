"""The house keeps its floors: every import, function-level ones included, points down the data flow.

ARCHITECTURE.md draws the floors. A package may import its own floor and the floors below it, never
one above, so a contract change travels one way and nothing imports in a circle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "umsearch"

FLOORS: dict[str, set[str]] = {
    "core": set(),
    "sim": {"core"},
    "search": {"core", "sim"},
    "nn": {"core"},
    "adapters": {"core"},
    "measure": {"core", "nn", "adapters"},
    "runtime": {"core", "sim", "nn"},
    "orchestrate": {"core", "sim", "search", "nn", "measure", "runtime"},
    "cli": {"core", "sim", "search", "nn", "measure", "runtime", "orchestrate", "adapters"},
}
"""What each package may import besides itself (``adapters`` is a module of its own)."""

TORCH_FREE = ("core", "sim", "search")
"""The deterministic core: pure numpy/Python, never torch."""


def _package(path: Path) -> str:
    rel = path.relative_to(ROOT)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _imports(path: Path) -> list[tuple[int, str]]:
    """Every absolute import in the file, at any depth (function bodies included)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module))
    return out


FILES = sorted(p for p in ROOT.rglob("*.py") if _package(p) in FLOORS)


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_point_down(path: Path) -> None:
    pkg = _package(path)
    for line, module in _imports(path):
        parts = module.split(".")
        if parts[0] != "umsearch" or len(parts) < 2 or parts[1] == pkg:
            continue
        assert parts[1] in FLOORS[pkg], f"{path.relative_to(ROOT)}:{line} imports {module}, above {pkg}'s floor"


@pytest.mark.parametrize("path", [p for p in FILES if _package(p) in TORCH_FREE], ids=lambda p: str(p.relative_to(ROOT)))
def test_the_core_never_imports_torch(path: Path) -> None:
    for line, module in _imports(path):
        assert module.split(".")[0] != "torch", f"{path.relative_to(ROOT)}:{line} imports torch"


def test_every_package_has_a_floor() -> None:
    packages = {p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists()} - {"data"}
    assert packages <= set(FLOORS), f"packages without a floor in this test: {sorted(packages - set(FLOORS))}"
