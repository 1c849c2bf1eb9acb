"""MMLU (Hendrycks et al., 2021) as a few-shot task (prompt trimming, paper Section 4 and
Appendix E): per subject, the five ``dev`` questions with their answers as the worked examples
under Hendrycks' header, the ``test`` questions as the items, and letter grading.

The mirror's files are ``mmlu/{dev,test}/<subject>_{dev,test}.csv`` with the columns
``question,choice0,choice1,choice2,choice3,answer`` (``answer`` 0-3). A question is rendered in
the BIG-Bench Hard style the trimmers share (:mod:`canopy.tasks.bbh`): the question, then
``Options:`` and ``(A)``-``(D)``; a worked example answers ``So the answer is (B).``
"""

from __future__ import annotations

import csv
import re
from collections.abc import Sequence
from pathlib import Path

from canopy.tasks.bbh import FewShotPrompt, Item, Shot, extract_answer

__all__ = ["LETTERS", "format_question", "grade", "header", "load_subject", "subjects"]

LETTERS = "ABCD"
_COLUMNS = ("question", "choice0", "choice1", "choice2", "choice3", "answer")
_LETTER = re.compile(r"^(?:\(([A-D])\)|([A-D])(?:[.):]|$))")


def header(subject: str) -> str:
    """Hendrycks' instruction line for ``subject`` (``high_school_physics`` -> "... about
    high school physics.")."""
    return (f"The following are multiple choice questions (with answers) about "
            f"{subject.replace('_', ' ')}.")


def format_question(question: str, choices: Sequence[str]) -> str:
    """The question with its four options as ``(A) ...`` lines."""
    if len(choices) != len(LETTERS):
        raise ValueError(f"an MMLU question has {len(LETTERS)} choices, got {len(choices)}")
    options = "\n".join(f"({letter}) {choice}" for letter, choice in zip(LETTERS, choices,
                                                                          strict=True))
    return f"{question.strip()}\nOptions:\n{options}"


def _read(file: Path) -> list[tuple[str, str]]:
    """(rendered question, target ``(X)``) for every row of a split file."""
    try:
        with file.open(encoding="utf-8", newline="") as handle:
            reader = csv.DictReader(handle)
            if reader.fieldnames is None or tuple(reader.fieldnames) != _COLUMNS:
                raise ValueError(f"columns {reader.fieldnames}, expected {','.join(_COLUMNS)}")
            rows = []
            for number, row in enumerate(reader, start=2):
                answer = row["answer"].strip()
                if answer not in {"0", "1", "2", "3"}:
                    raise ValueError(f"line {number}: answer {answer!r} is not 0-3")
                choices = [row[f"choice{i}"] for i in range(4)]
                rows.append((format_question(row["question"], choices),
                             f"({LETTERS[int(answer)]})"))
    except (OSError, csv.Error, UnicodeDecodeError, ValueError) as error:
        raise ValueError(f"{file} is not an MMLU split file: {error}") from None
    return rows


def subjects(folder: str | Path) -> list[str]:
    """The subjects with a ``dev`` file under the data folder ``folder`` (``mmlu/``)."""
    return sorted(p.name.removesuffix("_dev.csv") for p in (Path(folder) / "dev").glob(
        "*_dev.csv"))


def load_subject(folder: str | Path, subject: str, *, n: int | None = None, offset: int = 0,
                 shots: int = 5) -> tuple[FewShotPrompt, list[Item]]:
    """The ``shots``-shot prompt of ``subject`` (the first ``shots`` dev questions under
    :func:`header`) and its test questions ``offset .. offset + n``."""
    if not 0 <= shots <= 5:
        raise ValueError(f"shots must be 0-5 (MMLU's dev split has five per subject), "
                         f"got {shots}")
    if offset < 0 or (n is not None and n < 0):
        raise ValueError(f"offset and n must be >= 0, got offset={offset}, n={n}")
    root = Path(folder)
    dev, test = root / "dev" / f"{subject}_dev.csv", root / "test" / f"{subject}_test.csv"
    if not dev.is_file() or not test.is_file():
        raise ValueError(f"unknown MMLU subject {subject!r}; known: "
                         f"{', '.join(subjects(root)) or 'none'} (in {root})")
    examples = [Shot(question, "", target) for question, target in _read(dev)[:shots]]
    stop = None if n is None else offset + n
    items = [Item(subject, question, target) for question, target in _read(test)[offset:stop]]
    return FewShotPrompt(header(subject), tuple(examples)), items


def grade(completion: str, item: Item) -> bool:
    """Whether the completion names the right letter: the answer after the first ``answer
    is`` (else the first line), read as ``(B)``, ``B``, ``B.``, ``B)`` or ``B:`` at its start
    (a word such as "A cat" is not a letter). An answer giving the option's text instead of
    its letter counts as wrong."""
    match = _LETTER.match(extract_answer(completion).strip())
    return match is not None and f"({match.group(1) or match.group(2)})" == item.target
