"""The tasks live search runs on (``canopy search run --task``): where the items come from,
the system prompt, how a final answer is read from a text, which line ends an answer, and how
an answer is graded against the reference (ground truth grades answers only)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from canopy import data
from canopy.apps.search import gsm8k, math500

__all__ = ["GSM8K", "LIVE_TASKS", "MATH500", "Item", "LiveTask", "get_task"]


class Item(Protocol):
    """What a search needs of an item: the question's text and the reference answer."""

    @property
    def text(self) -> str: ...

    @property
    def gold(self) -> str: ...


@dataclass(frozen=True)
class LiveTask:
    """A task for live search.

    Attributes:
        name: its ``--task`` name.
        label: how tables name it.
        system: the system prompt (the answer format it asks for).
        answer_of: the final answer of a complete text (``None``: none stated); votes and
            agreement compare these strings.
        final: whether one line states the final answer (it ends a prefix).
        grade: whether an answer equals the reference answer.
        load: ``(n, offset) -> items`` from the data registry.
    """

    name: str
    label: str
    system: str
    answer_of: Callable[[str], str | None]
    final: Callable[[str], bool]
    grade: Callable[[str | None, str], bool]
    load: Callable[[int | None, int], Sequence[Item]]


def _math_answer(text: str) -> str | None:
    """MATH's final answer in normal form (so equal forms share a vote)."""
    answer = math500.extract_boxed(text)
    return None if answer is None else math500.normalise(answer)


GSM8K = LiveTask(
    name="gsm8k", label="GSM8K", system=gsm8k.SYSTEM, answer_of=gsm8k.extract_answer,
    final=gsm8k.states_answer, grade=gsm8k.grade,
    load=lambda n, offset: gsm8k.load_gsm8k(data.path("gsm8k", "test.jsonl"), n=n,
                                            offset=offset))
MATH500 = LiveTask(
    name="math500", label="MATH-500", system=math500.SYSTEM, answer_of=_math_answer,
    final=math500.states_boxed, grade=math500.grade,
    load=lambda n, offset: math500.load_math500(data.path("math500", math500.FILE), n=n,
                                                offset=offset))
LIVE_TASKS: dict[str, LiveTask] = {task.name: task for task in (GSM8K, MATH500)}


def get_task(name: str) -> LiveTask:
    """The task registered as ``name``; an unknown name raises a ``ValueError``."""
    try:
        return LIVE_TASKS[name]
    except KeyError:
        raise ValueError(f"unknown task {name!r}; known: {', '.join(LIVE_TASKS)}") from None
