"""Code tasks for test-time search with an execution probe (paper Appendix E, HumanEval and
MBPP): a leaf is a complete program graded by all of the task's tests; the cheap probe runs
a partial set, the prompt's doctest examples (HumanEval) or the first test (MBPP).

Every run goes through :func:`canopy.apps.search.sandbox.run_python`: the program, then a
harness that runs each test in turn (an exception or a failed assertion fails only that test)
and prints how many passed on its last line.
"""

from __future__ import annotations

import ast
import doctest
import gzip
import json
from collections.abc import Sequence
from dataclasses import dataclass

from canopy import data
from canopy.apps.search.sandbox import run_python
from canopy.data import bad_line

__all__ = ["STOP", "CodeTask", "arithmetic_tasks", "load_code_tasks", "outputs", "pass_rate",
           "program"]

#: Where a completion of one function ends (a new top-level statement or a fence).
STOP = ["\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\nassert ", "\n```", "\n#"]
_MARK = "CANOPY_PASSED"
_HARNESS = '''

def _canopy_tests():
    passed = 0
    for source in {tests!r}:
        try:
            exec(source, globals())
            passed += 1
        except BaseException:
            pass
    print({mark!r}, passed, {count})

_canopy_tests()
'''


@dataclass(frozen=True)
class CodeTask:
    """One task: the text the model continues, every test (the truth) and the probe's
    partial set, each a Python snippet that raises when it fails."""

    task_id: str
    prompt: str
    tests: tuple[str, ...]
    probe_tests: tuple[str, ...]
    canonical: str
    probe_inputs: tuple[str, ...] = ()  # the calls the probe tests make (majority by output)


def program(task: CodeTask, completion: str) -> str:
    """The program a completion makes: the prompt and the completion, cut at :data:`STOP`."""
    text = task.prompt + completion
    start = len(task.prompt)
    cut = min((i for i in (text.find(stop, start) for stop in STOP) if i >= 0),
              default=len(text))
    return text[:cut] + "\n"


def pass_rate(source: str, tests: Sequence[str], *, timeout_s: float = 5.0) -> float:
    """The share of ``tests`` that pass after ``source`` runs, in the sandbox (0 when the
    program itself fails, loops or floods its output)."""
    if not tests:
        raise ValueError("no tests to run")
    harness = _HARNESS.format(tests=list(tests), mark=_MARK, count=len(tests))
    result = run_python(source + harness, timeout_s=timeout_s)
    for line in reversed(result.stdout.splitlines()):
        if line.startswith(_MARK):
            passed, total = (int(x) for x in line.split()[1:3])
            return passed / total
    return 0.0


def _doctest_probes(prompt: str, entry_point: str) -> tuple[str, ...]:
    """The prompt's ``>>>`` examples as assertions on their printed values."""
    probes = []
    for example in doctest.DocTestParser().get_examples(prompt):
        lines = [line for line in example.want.splitlines()
                 if line.strip() not in ('"""', "'''")]  # the docstring's end, not output
        want = "\n".join(lines).strip().removesuffix('"""').removesuffix("'''").strip()
        source = example.source.strip()
        if entry_point in source and want:
            probes.append(f"assert repr({source}) == repr({want})" if _literal(want) else
                          f"assert str({source}) == {want!r}")
    return tuple(probes)


def _calls(tests: Sequence[str]) -> tuple[str, ...]:
    """The expression each ``assert <call> == <expected>`` test evaluates."""
    calls = []
    for test in tests:
        try:
            node = ast.parse(test.strip().splitlines()[-1]).body[0]
        except (SyntaxError, IndexError):
            continue
        if isinstance(node, ast.Assert) and isinstance(node.test, ast.Compare):
            left = node.test.left
            if isinstance(left, ast.Call) and getattr(left.func, "id", "") in ("repr", "str"):
                left = left.args[0] if left.args else left
            calls.append(ast.unparse(left))
    return tuple(calls)


def outputs(source: str, calls: Sequence[str], *, timeout_s: float = 5.0) -> str:
    """What ``source`` answers to each call (``repr`` of the value, or the exception's
    name), one line each: programs that agree on every call behave the same there."""
    harness = ("\n\nfor _call in " + repr(list(calls)) + ":\n"
               "    try:\n        print(" + repr(_MARK) + ", repr(eval(_call)))\n"
               "    except BaseException as _error:\n"
               "        print(" + repr(_MARK) + ", type(_error).__name__)\n")
    result = run_python(source + harness, timeout_s=timeout_s)
    return "\n".join(line for line in result.stdout.splitlines() if line.startswith(_MARK))


def _literal(text: str) -> bool:
    try:
        compile(text.strip(), "<want>", "eval")
    except SyntaxError:
        return False
    return True


def _humaneval(row: dict, file: str, line: int) -> CodeTask:
    try:
        entry, check = row["entry_point"], row["test"]
        full = (f"{check}\ncheck({entry})",)
        probes = _doctest_probes(row["prompt"], entry) or full
        return CodeTask(str(row["task_id"]), row["prompt"], full, probes,
                        row["canonical_solution"], _calls(probes))
    except (KeyError, TypeError) as error:
        raise bad_line(file, line, f"not a HumanEval task: {error!r}") from None


def _mbpp(row: dict, file: str, line: int) -> CodeTask:
    try:
        tests = tuple(row["test_list"])
        setup = row.get("test_setup_code") or ""
        tests = tuple(f"{setup}\n{t}" if setup else t for t in tests)
        prompt = (f'"""\n{row["text"].strip()}\nYour code should pass this test:\n'
                  f'{row["test_list"][0]}\n"""\n')
        return CodeTask(f"mbpp/{row['task_id']}", prompt, tests, tests[:1],
                        row["code"].replace("\r\n", "\n"), _calls(tests[:1]))
    except (KeyError, TypeError, IndexError) as error:
        raise bad_line(file, line, f"not an MBPP task: {error!r}") from None


_ARITH = {  # difficulty -> (description, expression) templates over seeded integers a, b, c
    "trivial": ("returns x + {b}", "x + {b}"),
    "easy": ("returns {a} * x + {b}", "{a} * x + {b}"),
    "medium": ("returns {a} * x * x + {b} * x + {c}", "{a} * x * x + {b} * x + {c}"),
    "hard": ("returns {a} * x when x is even and {b} * x + {c} when x is odd",
             "({a} * x if x % 2 == 0 else {b} * x + {c})"),
}


def arithmetic_tasks(level: str, n: int, *, seed: int = 0) -> list[CodeTask]:
    """Generated code tasks of a controlled difficulty (``trivial``, ``easy``, ``medium``,
    ``hard``):
    ``f(x)`` computing a seeded arithmetic expression, five tests at fixed points, the first
    one shown in the prompt and used as the probe (a regime where a small model has
    headroom)."""
    if level not in _ARITH:
        raise ValueError(f"arithmetic level must be one of {sorted(_ARITH)}, got {level!r}")
    import random

    rng = random.Random(f"{level}-{seed}")
    words, expression = _ARITH[level]
    tasks = []
    for i in range(n):
        values = {"a": rng.randint(2, 9), "b": rng.randint(1, 9), "c": rng.randint(1, 9)}
        body = expression.format(**values)
        tests = tuple(f"assert f({x}) == {eval(body, {'x': x})}" for x in (2, 3, 5, -4, 10))
        prompt = (f'"""\nWrite a Python function f(x) that {words.format(**values)}.\n'
                  f'Your code should pass this test:\n{tests[0]}\n"""\n')
        tasks.append(CodeTask(f"arith-{level}/{i}", prompt, tests, tests[:1],
                              f"def f(x):\n    return {body}\n", _calls(tests[:1])))
    return tasks


def load_code_tasks(dataset: str, *, n: int | None = None, offset: int = 0) -> list[CodeTask]:
    """The first ``n`` tasks from ``offset`` of ``humaneval`` or ``mbpp`` (through the data
    registry), or of the generated ``arith:easy|medium|hard`` tasks."""
    if dataset.startswith("arith:"):
        tasks = arithmetic_tasks(dataset.split(":", 1)[1], offset + (n or 20))
        return tasks[offset:]
    if dataset == "humaneval":
        file = data.path("humaneval", "HumanEval.jsonl.gz")
        with gzip.open(file, "rt", encoding="utf-8") as handle:
            rows = [(i, json.loads(line)) for i, line in enumerate(handle, start=1)
                    if line.strip()]
        parse = _humaneval
    elif dataset == "mbpp":
        file = data.path("mbpp", "mbpp.jsonl")
        rows = list(data.jsonl_rows(file))
        parse = _mbpp
    else:
        raise ValueError(f"unknown code dataset {dataset!r}; choose humaneval, mbpp or "
                         f"arith:<level> ({', '.join(_ARITH)})")
    chosen = rows[offset:] if n is None else rows[offset:offset + n]
    if not chosen:
        raise ValueError(f"{dataset}: no tasks at offset {offset}")
    return [parse(row, str(file), line) for line, row in chosen]
