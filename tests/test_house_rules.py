"""The house rules a reader can check from the sources alone: arguments are checked through
:mod:`canopy.validation` (never by the hand-written ``isinstance(x, bool) or not
isinstance(x, ...)``), and an error is known by its type, never by its text (``"already" in
str(error)``)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

SOURCES = Path(__file__).resolve().parents[1] / "src" / "canopy"
VALIDATION = SOURCES / "validation.py"


def _modules() -> Iterator[tuple[Path, ast.Module]]:
    for path in sorted(SOURCES.rglob("*.py")):
        yield path, ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _isinstance_of(node: ast.AST) -> tuple[str, ast.AST] | None:
    """``(the checked expression as text, the kinds)`` of an ``isinstance(x, kinds)`` call."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
            and node.func.id == "isinstance" and len(node.args) == 2:
        return ast.unparse(node.args[0]), node.args[1]
    return None


def _names_bool(kinds: ast.AST) -> bool:
    return any((isinstance(n, ast.Name) and n.id == "bool") or
               (isinstance(n, ast.Attribute) and n.attr == "bool_") for n in ast.walk(kinds))


def hand_written_checks(tree: ast.Module) -> list[int]:
    """Lines of ``isinstance(x, bool) or not isinstance(x, ...)``: the check
    :func:`canopy.validation.check_number` and :func:`~canopy.validation.check_count` own."""
    lines = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or)):
            continue
        bools = {seen[0] for value in node.values
                 if (seen := _isinstance_of(value)) and _names_bool(seen[1])}
        negated = {seen[0] for value in node.values
                   if isinstance(value, ast.UnaryOp) and isinstance(value.op, ast.Not)
                   and (seen := _isinstance_of(value.operand))}
        if bools & negated:
            lines.append(node.lineno)
    return lines


def _error_names(scope: ast.AST) -> set[str]:
    """Names holding an exception in ``scope``: an ``except ... as name``, a parameter typed
    as an error or exception, and names assigned from an expression using either."""
    names = {node.name for node in ast.walk(scope)
             if isinstance(node, ast.ExceptHandler) and node.name}
    if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
        arguments = scope.args.posonlyargs + scope.args.args + scope.args.kwonlyargs
        names |= {a.arg for a in arguments
                  if a.annotation is not None and ("Error" in ast.unparse(a.annotation) or
                                                   "Exception" in ast.unparse(a.annotation))}
    grew = True
    while grew:
        grew = False
        for node in ast.walk(scope):
            if isinstance(node, ast.Assign) and _uses(node.value, names):
                new = {t.id for t in node.targets if isinstance(t, ast.Name)} - names
                names |= new
                grew = grew or bool(new)
    return names


def _uses(node: ast.AST, names: set[str]) -> bool:
    return any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(node))


def errors_matched_by_text(tree: ast.Module) -> list[int]:
    """Lines of ``"words" in <an error's text>``: an error told apart by what it says."""
    lines = set()
    for scope in ast.walk(tree):
        if not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        names = _error_names(scope)
        for node in ast.walk(scope):
            if isinstance(node, ast.Compare) and isinstance(node.left, ast.Constant) \
                    and isinstance(node.left.value, str) \
                    and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops) \
                    and any(_uses(right, names) for right in node.comparators):
                lines.add(node.lineno)
    return sorted(lines)


def _offenders(rule) -> list[str]:
    return [f"{path.relative_to(SOURCES.parents[1])}:{line}"
            for path, tree in _modules() if path != VALIDATION for line in rule(tree)]


def test_arguments_are_checked_through_canopy_validation():
    assert _offenders(hand_written_checks) == []


def test_errors_are_told_apart_by_their_type_not_their_text():
    assert _offenders(errors_matched_by_text) == []


def test_the_rules_see_what_they_forbid():
    """Each rule finds its idiom, spelled over lines or not, and passes what it allows."""
    forbidden = ast.parse(
        "def f(k, n):\n"
        "    if isinstance(k, (bool, np.bool_)) or not isinstance(\n"
        "            k, int) or k < 1:\n"
        "        raise ValueError(k)\n"
        "    try:\n"
        "        g()\n"
        "    except KeyError as error:\n"
        "        message = str(error.args[0])\n"
        "        return 409 if 'already' in message else 404\n"
        "def h(error: LLMError) -> str:\n"
        "    return 'x' if 'reach' in str(error) else 'y'\n")
    assert hand_written_checks(forbidden) == [2]
    assert errors_matched_by_text(forbidden) == [9, 11]
    allowed = ast.parse(
        "def f(value, stderr, error):\n"
        "    if isinstance(value, bool) or isinstance(value, str):\n"
        "        return 'MemoryError' in stderr\n"
        "    return isinstance(error, KeyError) and 'key' in value\n")
    assert hand_written_checks(allowed) == [] and errors_matched_by_text(allowed) == []
