"""MATH-500 for live search: problems from the data registry, a prompt that asks for short
steps and a final ``\\boxed{...}``, and the grader (ground truth grades answers only).

The final answer of a text is the content of its last ``\\boxed{...}`` (or ``\\fbox{...}``),
braces matched; without one, what follows the last ``The answer is`` on its line. Two answers
are equal when their normal forms (:func:`normalise`) are equal, or when both are numbers
(integers, decimals, ``a/b``, ``\\frac{a}{b}``) of the same exact rational value, or when both
are tuples or intervals with the same brackets whose parts are equal one by one.

The normal form: ``$``/``\\(``/``\\)`` delimiters, ``\\left``/``\\right``, spacing commands
(``\\!``, ``\\,``, ``\\;``, ``\\:``, ``\\quad``), ``\\displaystyle`` and every space removed;
``\\dfrac``/``\\tfrac`` -> ``\\frac``; ``\\text{X}``, ``\\textbf{X}``, ``\\mbox{X}``,
``\\mathrm{X}`` -> ``X``; degree marks, ``\\%``/``%`` and ``\\$`` dropped; a trailing
period dropped; a unit after a number (``5 \\text{ cm}``) dropped; a leading single-letter
assignment (``x = 5``) dropped; thousands separators (``1,000``, ``1{,}000``) dropped;
``\\frac12`` -> ``\\frac{1}{2}`` and ``\\sqrt3`` -> ``\\sqrt{3}``; a choice ``(C)`` -> ``C``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

from canopy.data import bad_line, jsonl_rows

__all__ = ["FILE", "SYSTEM", "MathProblem", "equivalent", "extract_boxed", "grade",
           "load_math500", "normalise", "states_boxed"]

FILE = "test_ori.jsonl"  # the problems as MATH states them (test.jsonl prefixes a \boxed{} hint)
SYSTEM = ("Solve the math problem. Reason in short steps, one per line, then give the final "
          "answer as \\boxed{ANSWER}.")
_BOX = re.compile(r"\\(?:boxed|fbox)\s*\{")
_ANSWER_IS = re.compile(r"answer is[:\s]*(.+)", re.IGNORECASE)
_WRAPPERS = re.compile(r"\\(?:text|textbf|textrm|mbox|mathrm|mathbf)\s*\{([^{}]*)\}")
_SPACING = re.compile(r"\\(?:left|right|displaystyle|quad|qquad|[!,;:])|\\ ")
_DEGREES = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|\\circ|°")
_UNIT = re.compile(r"^(-?[\d.,/{}\\a-z]*\d\}?)\s+[a-zA-Z][a-zA-Z ]*(\^\{?\d\}?)?$")
_ASSIGNMENT = re.compile(r"^[a-zA-Z]\s*=(?!=)")
_THOUSANDS = re.compile(r"^-?\d{1,3}(,\d{3})+(\.\d+)?$")
_FRAC_SHORT = re.compile(r"\\frac(\d)(\d)")
_FRAC_HALF = re.compile(r"\\frac(\{[^{}]*\})(\d)")
_SQRT_SHORT = re.compile(r"\\sqrt(\d+|[a-zA-Z])")
_NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)$")
_FRACTION = re.compile(r"^([+-]?)\\frac\{([+-]?\d+)\}\{([+-]?\d+)\}$")
_SLASH = re.compile(r"^([+-]?\d+)/(\d+)$")


@dataclass(frozen=True)
class MathProblem:
    """A MATH-500 item: the problem, the reference answer (``gold``), subject and level."""

    text: str
    gold: str
    subject: str = ""
    level: int = 0


def load_math500(path: str | Path, *, n: int | None = None, offset: int = 0,
                 levels: tuple[int, ...] = ()) -> list[MathProblem]:
    """The first ``n`` problems from ``offset`` (counted among those of ``levels``, all when
    empty) of a MATH-500 JSONL file, in file order."""
    if n is not None and n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if offset < 0:
        raise ValueError(f"offset must be >= 0, got {offset}")
    bad = [level for level in levels if level not in range(1, 6)]
    if bad:
        raise ValueError(f"levels must be among 1-5, got {bad}")
    problems: list[MathProblem] = []
    skipped = 0
    for number, row in jsonl_rows(path):
        try:
            problem = MathProblem(str(row["problem"]), str(row["answer"]),
                                  str(row.get("subject", "")), int(row.get("level", 0)))
        except (KeyError, TypeError, ValueError) as error:
            raise bad_line(path, number, f"not a MATH item: {error!r}") from None
        if levels and problem.level not in levels:
            continue
        if skipped < offset:
            skipped += 1
            continue
        problems.append(problem)
        if n is not None and len(problems) == n:
            break
    if not problems:
        raise ValueError(f"{path} holds no problems of levels {list(levels) or 'any'} after "
                         f"offset {offset}")
    return problems


def _braced(text: str, start: int) -> str | None:
    """The content of the group whose ``{`` is at ``start - 1``, or ``None`` if unclosed."""
    depth = 1
    for position in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[position], 0)
        if depth == 0:
            return text[start:position]
    return None


def extract_boxed(text: str) -> str | None:
    """The content of the last closed ``\\boxed{...}``, else what follows the last ``The
    answer is`` on its line, else ``None``."""
    for match in reversed(list(_BOX.finditer(text))):
        content = _braced(text, match.end())
        if content is not None:
            return content.strip()
    found = _ANSWER_IS.findall(text)
    if found:
        answer = found[-1].strip().rstrip(".").strip()
        if answer.startswith("$") and answer.endswith("$"):
            answer = answer.strip("$").strip()
        return answer or None
    return None


def states_boxed(line: str) -> bool:
    """Whether a line states a final answer (a closed ``\\boxed{}``, or ``The answer is``)."""
    return extract_boxed(line) is not None


def normalise(answer: str) -> str:
    """The normal form described in the module docstring."""
    text = answer.strip()
    for left, right in (("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if text.startswith(left) and text.endswith(right) and len(text) > len(left + right):
            text = text[len(left):-len(right)].strip()
    text = text.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    while (unwrapped := _WRAPPERS.sub(r"\1", text)) != text:
        text = unwrapped
    text = _SPACING.sub("", text)
    text = _DEGREES.sub("", text).replace("\\%", "").replace("%", "").replace("\\$", "")
    text = text.replace("$", "").strip().rstrip(".").strip()
    if (unit := _UNIT.match(text)) is not None:
        text = unit.group(1)
    text = _ASSIGNMENT.sub("", text).strip()
    text = text.replace("{,}", "")
    text = "".join(text.split())
    if _THOUSANDS.match(text):
        text = text.replace(",", "")
    text = _FRAC_SHORT.sub(r"\\frac{\1}{\2}", text)
    text = _FRAC_HALF.sub(r"\\frac\1{\2}", text)
    text = _SQRT_SHORT.sub(r"\\sqrt{\1}", text)
    if re.fullmatch(r"\([A-Z]\)", text):
        text = text[1]
    return text


def _number(text: str) -> Fraction | None:
    """The exact value of a plain number, ``a/b`` or ``\\frac{a}{b}``, else ``None``."""
    if _NUMBER.match(text):
        return Fraction(text)
    if (match := _FRACTION.match(text)) is not None and int(match.group(3)) != 0:
        value = Fraction(int(match.group(2)), int(match.group(3)))
        return -value if match.group(1) == "-" else value
    if (match := _SLASH.match(text)) is not None and int(match.group(2)) != 0:
        return Fraction(int(match.group(1)), int(match.group(2)))
    return None


def _parts(text: str) -> list[str]:
    """``text`` split at its top-level commas."""
    parts, depth, start = [], 0, 0
    for position, char in enumerate(text):
        depth += 1 if char in "([{" else -1 if char in ")]}" else 0
        if char == "," and depth == 0:
            parts.append(text[start:position])
            start = position + 1
    return [*parts, text[start:]]


def _equal_forms(a: str, b: str) -> bool:
    if a == b:
        return True
    x, y = _number(a), _number(b)
    if x is not None and y is not None:
        return x == y
    if len(a) > 1 and len(b) > 1 and a[0] == b[0] and a[-1] == b[-1] and a[0] in "([" \
            and a[-1] in ")]":
        a, b = a[1:-1], b[1:-1]
    pa, pb = _parts(a), _parts(b)
    return len(pa) > 1 and len(pa) == len(pb) and all(map(_equal_forms, pa, pb))


def equivalent(answer: str, reference: str) -> bool:
    """Whether two final answers are equal after normalisation (module docstring)."""
    return _equal_forms(normalise(answer), normalise(reference))


def grade(answer: str | None, gold: str) -> bool:
    """Whether an extracted answer (``None``: none found) equals the reference answer."""
    return answer is not None and equivalent(answer, gold)
