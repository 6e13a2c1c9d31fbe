"""One switch on :attr:`umsearch.core.options.Option.kind`: only :mod:`umsearch.core.options` asks what a kind is.

Everything a kind decides (its command-line shape, its click form, what a parsed flag makes of the field, how
a value is written back as flags, what a value must be) is its :class:`~umsearch.core.options.KindRule`. The
check reads every module's source (AST) and refuses, outside ``core/options.py``:

- a comparison (``==``, ``!=``, ``in``, ``not in``) between a kind (a name ``kind`` or an attribute ``.kind``)
  and a kind's name (``"switch"``, ``("ints", "names")``);
- a table keyed by an option's kind (``TYPES[opt.kind]``, ``TYPES.get(row.option.kind)``).

Action kinds (``a.kind == ...`` with a letter) are :mod:`umsearch.core.actions`' business and its own test's.
"""

from __future__ import annotations

import ast
from pathlib import Path

from umsearch.core.options import KIND_RULES, ValueKind

ROOT = Path(__file__).resolve().parents[2] / "umsearch"
HOME = ROOT / "core" / "options.py"
NAMES = frozenset(ValueKind.__args__)  # type: ignore[attr-defined]


def _is_kind(node: ast.expr) -> bool:
    return (isinstance(node, ast.Name) and node.id == "kind") or (isinstance(node, ast.Attribute) and node.attr == "kind")


def _names_a_kind(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant):
        return node.value in NAMES
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return any(_names_a_kind(e) for e in node.elts)
    return False


def _options_kind(node: ast.expr) -> bool:
    """``opt.kind``, ``option.kind``, ``row.option.kind``: an option's kind."""
    return (isinstance(node, ast.Attribute) and node.attr == "kind"
            and ((isinstance(node.value, ast.Name) and node.value.id in ("opt", "option"))
                 or (isinstance(node.value, ast.Attribute) and node.value.attr == "option")))  # fmt: skip


def switches_on_kind(tree: ast.AST) -> list[str]:
    """The places in ``tree`` that decide something by a value kind themselves."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_is_kind(s) for s in sides) and any(_names_a_kind(s) for s in sides):
                found.append(ast.unparse(node))
        elif isinstance(node, ast.Subscript) and _options_kind(node.slice):
            found.append(ast.unparse(node))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
              and node.args and _options_kind(node.args[0])):  # fmt: skip
            found.append(ast.unparse(node))
    return found


def test_only_core_options_switches_on_an_options_kind() -> None:
    offenders = {str(p.relative_to(ROOT)): hits for p in sorted(ROOT.rglob("*.py")) if p != HOME
                 for hits in [switches_on_kind(ast.parse(p.read_text()))] if hits}  # fmt: skip
    assert offenders == {}


def test_the_check_sees_the_switches_it_refuses() -> None:
    refused = ['if opt.kind == "switch": pass', 'x = kind in ("ints", "names")', "t = TYPES[row.option.kind]",
               "t = TYPES.get(opt.kind)", 'y = "multiple" != option.kind']  # fmt: skip
    allowed = ['if a.kind == "F": pass', "t = RULES[kind_rule(opt).form]", 'z = kind == "loop"',
               "q = _QUANTITY[a.kind]"]  # fmt: skip
    assert all(switches_on_kind(ast.parse(src)) for src in refused)
    assert not any(switches_on_kind(ast.parse(src)) for src in allowed)
    assert switches_on_kind(ast.parse(HOME.read_text()))  # its home does switch (KIND_RULES[opt.kind])


def test_every_kind_says_every_part_of_its_rule() -> None:
    """Each kind's rule gives the CLI a form and, for a value form, a type it knows."""
    for name, rule in KIND_RULES.items():
        assert rule.form in ("flag", "pair", "list", "value"), name
        assert (rule.form == "flag") == (rule.shape == "switch"), name
        if rule.form == "list":
            assert rule.items and rule.items_help, name
