"""GSM8K for live search: questions from the data registry, a prompt that asks for numbered
steps and a final ``The answer is N.``, and answer extraction and grading (ground truth is used
only to grade)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from canopy.data import bad_line, jsonl_rows

__all__ = ["CHATML", "Question", "extract_answer", "grade", "is_correct", "load_gsm8k",
           "render_prompt", "states_answer"]

# The chat template SmolLM2 (and Qwen) ship, so a completion call can continue a partial answer.
CHATML = ("<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{question}<|im_end|>\n"
          "<|im_start|>assistant\n")
SYSTEM = ("Solve the math word problem. Reason in short steps, one per line, then finish with "
          "'The answer is N.'")
_ANSWER = re.compile(r"answer is\s*\$?\s*(-?[\d,]*\.?\d+)", re.IGNORECASE)
_NUMBER = re.compile(r"-?\d[\d,]*\.?\d*")


@dataclass(frozen=True)
class Question:
    """A GSM8K item: the question and the gold numeric answer (after ``####``)."""

    text: str
    gold: str


def load_gsm8k(path: str | Path, *, n: int | None = None, offset: int = 0) -> list[Question]:
    """The first ``n`` questions from ``offset`` of a GSM8K JSONL file."""
    if n is not None and n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    questions = []
    for number, row in jsonl_rows(path):
        if number <= offset:
            continue
        try:
            gold = _normalise(str(row["answer"]).rsplit("####", 1)[1])
            questions.append(Question(str(row["question"]), gold))
        except (KeyError, IndexError) as error:
            raise bad_line(path, number, f"not a GSM8K item: {error!r}") from None
        if n is not None and len(questions) == n:
            break
    if not questions:
        raise ValueError(f"{path} holds no questions after offset {offset}")
    return questions


def render_prompt(question: str, *, template: str = CHATML, system: str = SYSTEM) -> str:
    return template.format(system=system, question=question)


def _normalise(text: str) -> str:
    value = text.strip().replace(",", "").replace("$", "").rstrip(".")
    try:
        number = float(value)
    except ValueError:
        return value
    return str(int(number)) if number.is_integer() else f"{number:g}"


def extract_answer(text: str) -> str | None:
    """The number after the last ``answer is``, else the last number in ``text``."""
    found = _ANSWER.findall(text)
    if found:
        return _normalise(found[-1])
    numbers = [n for n in _NUMBER.findall(text) if any(c.isdigit() for c in n)]
    return _normalise(numbers[-1]) if numbers else None


def states_answer(text: str) -> bool:
    """Whether ``text`` states a final answer (``The answer is N``)."""
    return _ANSWER.search(text) is not None


def grade(answer: str | None, gold: str) -> bool:
    """Whether an extracted answer (``None``: none found) is the gold number."""
    return answer is not None and answer == gold


def is_correct(answer: str | None, question: Question) -> bool:
    return grade(answer, question.gold)
