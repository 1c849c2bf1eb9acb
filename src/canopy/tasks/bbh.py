"""BIG-Bench Hard few-shot prompts (prompt trimming, the search prior): each task's 3-shot
chain-of-thought prompt split into an instruction and its shots, the task's examples, answer
extraction and exact-match grading."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["FewShotPrompt", "Item", "Shot", "cot_prompt", "extract_answer", "grade",
           "load_task", "parse_cot_prompt"]

_ANSWER = re.compile(r"answer is\s*(.+?)(?:\.\s|\.$|\n|$)", re.IGNORECASE)


@dataclass(frozen=True)
class Shot:
    """One worked example: question, rationale (may be empty) and final answer."""

    question: str
    rationale: str
    answer: str

    def render(self, *, rationale: bool = True) -> str:
        if rationale and self.rationale:
            return (f"Q: {self.question}\nA: Let's think step by step.\n{self.rationale} "
                    f"So the answer is {self.answer}.")
        return f"Q: {self.question}\nA: So the answer is {self.answer}."


@dataclass(frozen=True)
class FewShotPrompt:
    """A task's instruction and its worked examples."""

    instruction: str
    shots: tuple[Shot, ...]


@dataclass(frozen=True)
class Item:
    """One question of a task (its category) with the gold target (for grading only)."""

    task: str
    question: str
    target: str


def parse_cot_prompt(text: str, *, source: str = "prompt") -> FewShotPrompt:
    """Parse a ``cot-prompts/<task>.txt`` file (canary line, ``-----``, instruction, then
    ``Q: ... A: Let's think step by step. ... So the answer is X.`` blocks)."""
    body = text.split("-----", 1)[1] if "-----" in text else text
    blocks = re.split(r"\n\s*\n(?=Q: )", body.strip())
    instruction, shots = blocks[0].strip(), []
    if instruction.startswith("Q: "):
        instruction, blocks = "", ["", *blocks]
    for number, block in enumerate(blocks[1:], start=1):
        match = re.match(r"Q: (.*?)\nA: (.*)", block.strip(), re.DOTALL)
        if match is None:
            raise ValueError(f"{source}: shot {number} has no 'Q: ... A: ...' form")
        question, reply = match.group(1).strip(), match.group(2).strip()
        reply = reply.removeprefix("Let's think step by step.").strip()
        found = list(re.finditer(r"So the answer is (.+?)\.?\s*$", reply, re.DOTALL))
        if not found:
            raise ValueError(f"{source}: shot {number} has no 'So the answer is ...'")
        answer = found[-1].group(1).strip()
        shots.append(Shot(question, reply[:found[-1].start()].strip(), answer))
    if not shots:
        raise ValueError(f"{source}: no worked examples found")
    return FewShotPrompt(instruction, tuple(shots))


def load_task(folder: str | Path, task: str, *, n: int | None = None,
              offset: int = 0) -> tuple[FewShotPrompt, list[Item]]:
    """The few-shot prompt and the examples ``offset .. offset + n`` of a BBH task, from the
    data folder holding ``bbh/`` and ``cot-prompts/``."""
    root = Path(folder)
    prompt_file = root / "cot-prompts" / f"{task}.txt"
    task_file = root / "bbh" / f"{task}.json"
    if not task_file.exists():
        known = sorted(p.stem for p in (root / "bbh").glob("*.json"))
        raise ValueError(f"unknown BBH task {task!r}; known: {', '.join(known) or 'none'} "
                         f"(in {root / 'bbh'})")
    prompt = parse_cot_prompt(prompt_file.read_text(encoding="utf-8"), source=str(prompt_file))
    try:
        examples = json.loads(task_file.read_text(encoding="utf-8"))["examples"]
        items = [Item(task, str(e["input"]), str(e["target"])) for e in examples]
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(f"{task_file} is not a BBH task file: {error!r}") from None
    stop = None if n is None else offset + n
    return prompt, items[offset:stop]


def cot_prompt(prompt: FewShotPrompt, question: str) -> str:
    """The whole few-shot chain-of-thought prompt for ``question``, ending where the model's
    reasoning starts."""
    shots = "\n\n".join(shot.render() for shot in prompt.shots)
    head = f"{prompt.instruction}\n\n" if prompt.instruction else ""
    return f"{head}{shots}\n\nQ: {question}\nA: Let's think step by step.\n"


def _normalise(text: str) -> str:
    return re.sub(r"[\s().,'\"]+", " ", text.lower()).strip()


def extract_answer(completion: str) -> str:
    """The text after the first ``answer is``, else the completion's first line."""
    match = _ANSWER.search(completion)
    if match:
        return match.group(1).strip()
    lines = [line.strip() for line in completion.strip().split("\n") if line.strip()]
    return lines[0] if lines else ""


def grade(completion: str, item: Item) -> bool:
    """Exact match after lower-casing and dropping parentheses and punctuation."""
    return _normalise(extract_answer(completion)) == _normalise(item.target)
