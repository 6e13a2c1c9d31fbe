"""Every action rule lives in :mod:`umsearch.core.actions`, and the rules agree with each other.

The package writes no action rule with kind letters outside ``core/actions.py``: a pass asks an
action (``a.is_forward``, ``a.sends_gradient``, ``a.ends_backward``, ``a.consumer(S)``, ...) or, in
compiled code, indexes its tables by kind code. The check reads the source (AST) and finds:

- a comparison (``==``, ``!=``, ``in``, ``not in``) between a kind (a name ``kind`` or an attribute
  ``.kind``) and a kind letter (``"F"``, ``"B"``, ``"I"``, ``"W"``, alone or in a tuple, list or set of
  them), directly or through a name assigned one;
- a choice between kind letters (``"I" if split else "B"``): which kind does what is a rule;
- a kind letter given to a kind (``kind = "B"``, ``kind: Kind = "W"``, ``first_kind = F``);
- a set of kinds written out (a tuple, list or set of two or more kind letters and nothing else, such
  as ``("F", "B", "I", "W")`` or ``{"B", "I"}``): which kinds belong together is a rule.

A letter compared with anything else (``unit == "B"`` bytes), a kind with another word
(``kind == "switch"``), a letter among other words (a table's column names) or a letter keying a
table of names is no action rule.
"""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import numpy as np
import pytest

from umsearch.core import actions
from umsearch.core.actions import (
    ENDS_BACKWARD,
    FEEDS,
    FORWARD_LIST,
    KIND_CODE,
    KINDS,
    MEMORY,
    NEEDS,
    RERUNS_FORWARD,
    Action,
    parse_actions,
    rank_order_problem,
)

ROOT = Path(__file__).resolve().parents[2] / "umsearch"
RULES = ROOT / "core" / "actions.py"
LETTERS = frozenset(KINDS)


KIND_NAMES = frozenset({"kind", "kind_code"})
"""Names (and attributes) that hold an action kind; so does any name ending in ``_kind`` and ``code_kind(...)``."""
CODE_NAMES = frozenset({"F", "B", "I", "W"})
"""The kind codes :mod:`umsearch.core.actions` exports: comparing with one is comparing with a letter."""


def _is_kind(node: ast.expr) -> bool:
    if isinstance(node, ast.Name):
        return node.id in KIND_NAMES or node.id.endswith("_kind")
    if isinstance(node, ast.Attribute):
        return node.attr in KIND_NAMES
    if isinstance(node, ast.Call):
        f = node.func
        return (isinstance(f, ast.Name) and f.id == "code_kind") or (isinstance(f, ast.Attribute) and f.attr == "code_kind")
    return False


def _letters(tree: ast.AST) -> set[str]:
    """Names that hold kind letters or codes in ``tree``: the exported codes, and any name assigned a letter
    (or a tuple, list or set of letters), so a comparison through a variable counts too."""
    names = set(CODE_NAMES)
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None and _is_letter(node.value, set()):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def _is_letter(node: ast.expr, names: set[str]) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str) and node.value in LETTERS
    if isinstance(node, ast.Name):
        return node.id in names
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return any(_is_letter(e, names) for e in node.elts)
    return False


def letter_comparisons(source: str) -> list[int]:
    """Lines of the comparisons between an action kind and a kind letter or code in ``source`` (directly, or
    through a name that holds one)."""
    tree = ast.parse(source)
    names = _letters(tree)
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        for (x, y), op in zip(itertools.pairwise(operands), node.ops, strict=True):
            if not isinstance(op, ast.Eq | ast.NotEq | ast.In | ast.NotIn):
                continue
            if (_is_kind(x) and _is_letter(y, names)) or (_is_letter(x, names) and _is_kind(y)):
                lines.append(node.lineno)
                break
    return lines


def _letter_set(node: ast.expr) -> bool:
    return (isinstance(node, ast.Tuple | ast.List | ast.Set) and len(node.elts) >= 2
            and all(_is_letter(e, set()) for e in node.elts))  # fmt: skip


def _is_kind_target(node: ast.expr, annotation: ast.expr | None = None) -> bool:
    return _is_kind(node) or (isinstance(annotation, ast.Name) and annotation.id == "Kind")


def letter_rules(source: str) -> list[int]:
    """Lines in ``source`` that write an action rule with kind letters (see the module docstring)."""
    tree = ast.parse(source)
    names = _letters(tree)
    lines = set(letter_comparisons(source))
    for node in ast.walk(tree):
        if isinstance(node, ast.IfExp) and _is_letter(node.body, names) and _is_letter(node.orelse, names):
            lines.add(node.lineno)
        elif isinstance(node, ast.Assign) and _is_letter(node.value, names) and any(map(_is_kind_target, node.targets)):
            lines.add(node.lineno)
        elif (isinstance(node, ast.AnnAssign) and node.value is not None and _is_letter(node.value, names)
              and _is_kind_target(node.target, node.annotation)):  # fmt: skip
            lines.add(node.lineno)
        elif _letter_set(node):  # type: ignore[arg-type]
            lines.add(node.lineno)
    return sorted(lines)


@pytest.mark.parametrize(
    ("source", "flagged"),
    [
        ('k = "I" if split else "B"', True),
        ('kind: Kind = "I" if split else "B"', True),
        ('name = f"{sender}{\'B\' if gradient else \'F\'}{mb}"', True),
        ('kind = "W"', True),
        ('kind: Kind = "B"', True),
        ('first: Kind = "F"', True),
        ('self.kind = "F"', True),
        ('next_kind = I', True),
        ('for k in ("F", "B", "I", "W"): pass', True),
        ('GRADIENT = {"B", "I"}', True),
        ('ok = "B" in ["B", "I"]', True),
        ('unit = "B" if small else "KiB"', False),  # bytes
        ('cols = ("pool", "F", "B", "I", "W")', False),  # column names
        ('names = {"F": "forward", "B": "backward"}', False),  # a table of names keyed by kind
        ('x = "F"', False),
        ('kind = other.kind', False),
        ('one = ("F",)', False),
    ],
)
def test_the_check_finds_kind_letter_rules(source: str, flagged: bool) -> None:
    assert bool(letter_rules(source)) == flagged


@pytest.mark.parametrize(
    ("source", "flagged"),
    [
        ('a.kind == "F"', True),
        ('kind != "W"', True),
        ('a.kind in ("B", "I")', True),
        ('r.kind not in {"B", "W"}', True),
        ('"I" == self.kind', True),
        ('0 < x.kind == "B"', True),
        ('unit == "B"', False),  # bytes, no action
        ('kind == "switch"', False),
        ('a.kind == other.kind', False),
        ('kind in KINDS', False),
        ('a.stage == "F"', False),
        ('kind == F', True),  # the exported code
        ('if kind == W: pass', True),
        ('SPLIT = ("I", "W")\nok = a.kind in SPLIT', True),  # through a variable
        ('first: str = "B"\nok = b.kind != first', True),
        ('ok = code_kind(c) == I', True),
        ('ok = next_kind in (B, I)', True),
        ('ok = kind == F_ROW', False),  # no letter behind it
    ],
)
def test_the_check_finds_kind_letter_comparisons(source: str, flagged: bool) -> None:
    assert bool(letter_comparisons(source)) == flagged


def test_no_kind_letter_rules_outside_actions() -> None:
    found = [f"{path.relative_to(ROOT.parent)}:{line}" for path in sorted(ROOT.rglob("*.py")) if path != RULES
             for line in letter_rules(path.read_text())]  # fmt: skip
    assert not found, (
        "an action rule is written outside umsearch/core/actions.py (ask the action, e.g. a.is_forward, "
        f"a.sends_gradient, a.ends_backward, a.consumer(S), or index its tables by kind code): {found}"
    )


# ---------------------------------------------------------------------------
# The rules agree with each other
# ---------------------------------------------------------------------------


def test_feeds_and_needs_pair_up() -> None:
    # Whatever an action feeds, an action of the consumer on the same list reads back from it.
    for k in range(len(KINDS)):
        if FEEDS[k] == 0:
            continue
        readers = [q for q in range(len(KINDS)) if NEEDS[q] == -FEEDS[k] and FORWARD_LIST[q] == FORWARD_LIST[k]]
        assert readers, KINDS[k]
        for q in readers:
            for lo, hi in ((0, 3), (3, 7)):
                # The boundary it sends across is the one its reader (on the next stage) receives across.
                nxt = (hi, hi + 2) if FEEDS[k] > 0 else (lo - 2, lo)
                assert actions.sent_boundary(k, lo, hi) == actions.received_boundary(q, *nxt)


def test_recompute_reruns_the_forward_where_memory_rebuilds_the_stash() -> None:
    # MEMORY[1, kind, 0]: the stash an action adds back on a recomputing stage, i.e. its forward again.
    assert tuple(int(x) for x in MEMORY[1, :, 0]) == RERUNS_FORWARD


def test_action_properties_read_the_tables() -> None:
    for kind in KINDS:
        a = Action(3, kind, 1)
        k = KIND_CODE[kind]
        assert a.kind_code == k
        assert a.is_forward == bool(FORWARD_LIST[k]) != a.is_backward
        assert a.sends_gradient == (FEEDS[k] < 0)
        assert a.ends_backward == bool(ENDS_BACKWARD[k])
        assert a.reruns_forward(True) == bool(RERUNS_FORWARD[k]) and not a.reruns_forward(False)
        assert a.size((5, 6), (7, 8)) == (6 if a.is_forward else 8)
        assert a.consumer(5) == (3 + FEEDS[k] if FEEDS[k] else None)
        assert a.source(5) == (3 + NEEDS[k] if NEEDS[k] else None)
    assert Action(0, "F", 0).source(2) is None and Action(1, "F", 0).consumer(2) is None
    assert Action(0, "B", 0).consumer(2) is None and Action(1, "I", 0).source(2) is None


def test_compiled_rules_equal_python() -> None:
    from umsearch.sim import kernels

    for k, s, n in itertools.product(range(len(KINDS)), range(4), (1, 4)):
        assert kernels.consumer_stage(k, s, n) == actions.consumer_stage(k, s, n)
        assert kernels.source_stage(k, s, n) == actions.source_stage(k, s, n)
        assert kernels.sent_boundary(k, 2, 5) == actions.sent_boundary(k, 2, 5)
        assert kernels.received_boundary(k, 2, 5) == actions.received_boundary(k, 2, 5)
        for rec in (False, True):
            assert kernels.reruns_forward(k, np.bool_(rec)) == actions.reruns_forward(k, rec)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("0F0 0F1 0B0 0B1", None),
        ("0F0 0I0 0F1 0W0 0B1", None),
        ("0B0 0F0", (0, "0B0 comes before 0F0, which holds its samples")),
        ("0F0 0W0 0I0", (1, "0W0 comes before 0I0")),
        ("0F0 0I0 0B0 0W0", (1, "has both a B and an I")),
        ("0F0 0W0 0B0", (1, "has both a B and a W")),
    ],
)
def test_rank_order_problem(text: str, problem: tuple[int, str] | None) -> None:
    got = rank_order_problem(parse_actions(text), lambda j, k: (k,))
    if problem is None:
        assert got is None
    else:
        assert got is not None and got[0] == problem[0] and problem[1] in got[1], got


def test_rank_order_problem_reads_the_holders() -> None:
    # Backward 0 holds the samples of forwards 0 and 1 (a recomputing stage's coarser backward list).
    def holders(j: int, k: int) -> range:
        return range(2 * k, 2 * k + 2)

    assert rank_order_problem(parse_actions("0F0 0F1 0B0"), holders) is None
    assert rank_order_problem(parse_actions("0F0 0B0 0F1"), holders) == (1, "0B0 comes before 0F1, which holds its samples")
