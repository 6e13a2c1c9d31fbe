"""umsearch.sim.jit: an edit of any source the kernels compile drops every kernel cache (issue 32 item 6)."""

from __future__ import annotations

from pathlib import Path

from umsearch.sim import jit


def _package(root: Path) -> None:
    for name in jit.SOURCES:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(f"# {name}\n")
        cache = (root / name).parent / "__pycache__"
        cache.mkdir(exist_ok=True)
        (cache / f"{Path(name).stem}.f-1.py311.nbi").write_bytes(b"index")
        (cache / f"{Path(name).stem}.f-1.py311.1.nbc").write_bytes(b"code")
        (cache / f"{Path(name).stem}.cpython-311.pyc").write_bytes(b"bytecode")


def _caches(root: Path) -> list[str]:
    return sorted(p.name for p in root.rglob("*.nb[ic]"))


def test_an_edit_of_an_inlined_source_drops_the_caches_of_every_compiled_module(tmp_path: Path) -> None:
    _package(tmp_path)
    assert jit.drop_stale_caches(tmp_path)  # no key yet: whatever is there may be stale
    assert _caches(tmp_path) == [] and len(list(tmp_path.rglob("*.pyc"))) == len(jit.SOURCES)
    _package(tmp_path)
    assert not jit.drop_stale_caches(tmp_path) and len(_caches(tmp_path)) == 2 * len(jit.SOURCES)
    (tmp_path / "core" / "actions.py").write_text("FEEDS = {}  # a rule changed\n")
    assert jit.drop_stale_caches(tmp_path)
    assert _caches(tmp_path) == []  # population.py's and orders.py's too, which inline actions.py


def test_the_installed_package_has_a_current_key() -> None:
    key = (jit.PACKAGE / "sim" / "__pycache__" / jit.KEY_FILE).read_text()
    assert key == jit.sources_key(jit.PACKAGE, jit.SOURCES)


def test_every_module_that_compiles_kernels_is_a_source() -> None:
    """A compiled module left out of the key keeps serving its callers' old machine code after an edit
    (action_rows.py was, until its producers changed and the evaluator ran the old ones)."""
    compiling = {p.relative_to(jit.PACKAGE).as_posix() for p in jit.PACKAGE.rglob("*.py")
                 if "from umsearch.sim.jit import njit" in p.read_text()}  # fmt: skip
    assert compiling and compiling <= set(jit.SOURCES)
