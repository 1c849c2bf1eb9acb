"""The benchmarks a trimming run reads (paper Section 4: "Trimming uses MMLU, LongBench and
BBH"): per benchmark its categories (the bandit's regions), the few-shot prompts and items,
the trim levels and the grader, all through the data registry."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from canopy.apps.trim.trimmers import TrimLevel, default_levels
from canopy.tasks.bbh import FewShotPrompt, Item

__all__ = ["BENCHMARKS", "Benchmark", "Loaded", "load_benchmark"]

Tasks = dict[str, tuple[FewShotPrompt, list[Item]]]


@dataclass(frozen=True)
class Benchmark:
    """A trimming benchmark: its display name, default categories and trim budget."""

    name: str
    title: str
    default_categories: tuple[str, ...]
    default_budget: int


@dataclass(frozen=True)
class Loaded:
    """What a run needs: prompts and items per category, the levels and the grader."""

    tasks: Tasks
    levels: list[TrimLevel]
    grader: Callable[[str, Item], bool]


BENCHMARKS: dict[str, Benchmark] = {b.name: b for b in [
    Benchmark("bbh", "BBH", ("boolean_expressions", "navigate", "sports_understanding",
                             "web_of_lies"), 320),
    Benchmark("mmlu", "MMLU", ("abstract_algebra", "anatomy", "conceptual_physics",
                               "world_religions"), 200),
]}


def load_benchmark(name: str, categories: Sequence[str] | None = None, *, n: int,
                   offset: int = 0, budget_tokens: int | None = None) -> Loaded:
    """Items ``offset .. offset + n`` of each category of benchmark ``name`` (``bbh``: BBH
    tasks, their 3-shot chain-of-thought prompts; ``mmlu``: MMLU subjects, their 5-shot dev
    prompts), with the levels of :func:`default_levels` at ``budget_tokens`` (default: the
    benchmark's) and the benchmark's grader."""
    from canopy import data

    if name not in BENCHMARKS:
        raise ValueError(f"unknown trimming benchmark {name!r}; known: "
                         f"{', '.join(BENCHMARKS)}")
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    benchmark = BENCHMARKS[name]
    names = list(categories or benchmark.default_categories)
    if not names:
        raise ValueError("no categories to trim")
    budget = benchmark.default_budget if budget_tokens is None else budget_tokens
    if name == "bbh":
        from canopy.tasks.bbh import grade, load_task

        folder = data.path("bbh")
        tasks = {task: load_task(folder, task, n=n, offset=offset) for task in names}
        return Loaded(tasks, default_levels(budget_tokens=budget), grade)
    from canopy.tasks.mmlu import grade, load_subject

    folder = data.path("mmlu")
    tasks = {subject: load_subject(folder, subject, n=n, offset=offset) for subject in names}
    return Loaded(tasks, default_levels(budget_tokens=budget, shots=(3, 1, 0),
                                        answers_only=False), grade)
