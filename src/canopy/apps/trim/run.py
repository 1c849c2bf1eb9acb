"""Live trimming runs: every trim level on every item against an OpenAI-compatible endpoint
(greedy, so each outcome is one deterministic call, cached on disk by the client), then the
regional bandit (trim levels as arms, task categories as regions), every fixed level and the
per-task and per-item oracles on those outcomes.

The bandit is replayed on the collected outcomes rather than calling the endpoint itself: with
greedy decoding its calls would be exactly these requests, and it only ever reads the outcome
of the level it chose. A failing endpoint stops collection cleanly; items finished before it
are kept and summarised.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from canopy.apps.trim.bandit import category_oracle, oracle, regional_bandit, trim_outcomes
from canopy.apps.trim.trimmers import TrimLevel, approx_tokens, render_query
from canopy.bootstrap import bootstrap_mean, paired_bootstrap
from canopy.llm.client import LLMClient, LLMError
from canopy.tasks.bbh import FewShotPrompt, Item, grade

__all__ = ["TrimRun", "collect", "summarise"]


@dataclass
class TrimRun:
    """Outcomes ``[item, level]``: correctness, the prompt tokens the server reported
    (achieved) and our estimate; rows past ``completed`` are NaN."""

    items: list[Item]
    levels: list[TrimLevel]
    correct: np.ndarray
    tokens: np.ndarray
    estimated: np.ndarray
    completions: list[list[str]] = field(default_factory=list)
    completed: int = 0
    error: str | None = None


def collect(client: LLMClient, tasks: Mapping[str, tuple[FewShotPrompt, Sequence[Item]]],
            levels: Sequence[TrimLevel], *, max_tokens: int = 48,
            grader: Callable[[str, Item], bool] = grade,
            progress: Callable[[int, int], None] | None = None) -> TrimRun:
    """Query every level on every item and score each answer with ``grader`` (BBH's exact
    match by default; :func:`canopy.tasks.mmlu.grade` for MMLU). Within a task the loop runs
    level by level, so consecutive prompts share the trimmed context and the server can reuse
    its prefix; a failure drops the unfinished task and keeps the tasks before it."""
    if not levels:
        raise ValueError("levels is empty")
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    items = [item for _, task_items in tasks.values() for item in task_items]
    if not items:
        raise ValueError("no items to trim")
    shape = (len(items), len(levels))
    run = TrimRun(items, list(levels), np.full(shape, np.nan), np.full(shape, np.nan),
                  np.full(shape, np.nan))
    texts = [[""] * len(levels) for _ in items]
    start = 0
    for prompt, task_items in tasks.values():
        block = range(start, start + len(task_items))
        try:
            for a, level in enumerate(levels):
                for i in block:
                    item = items[i]
                    query = render_query(level.build(prompt, item.question), item.question)
                    response = client.complete(query, max_tokens=max_tokens, temperature=0.0,
                                               stop=["\n\nQ:", "\nQ:"])
                    run.correct[i, a] = float(grader(response.text, item))
                    run.tokens[i, a] = response.prompt_tokens
                    run.estimated[i, a] = approx_tokens(query)
                    texts[i][a] = response.text
        except LLMError as error:
            run.error = (f"task {items[block.start].task} (items {block.start}-"
                         f"{block.stop - 1}): {error}")
            for array in (run.correct, run.tokens, run.estimated):
                array[block.start:] = np.nan
            break
        start = block.stop
        run.completed = start
        if progress is not None:
            progress(start, len(items))
    run.completions = texts[:run.completed]
    return run


def summarise(run: TrimRun, *, lam: float = 2e-4, learner: str = "ucb", explore: float = 1.0,
              sharing: str = "test", kappa: float = 5.0, n_orders: int = 20, seed: int = 0,
              n_resamples: int = 2000) -> list[dict[str, object]]:
    """One row per policy (the adaptive regional bandit, every fixed level, the per-task and
    per-item oracles): accuracy with a bootstrap interval over items, mean achieved and
    estimated input tokens, the requested budget, mean reward, and the paired accuracy gap to
    the adaptive policy. The adaptive row's gap is to the best fixed level at matched tokens
    (the most accurate level whose mean achieved tokens do not exceed the adaptive policy's)."""
    done = slice(0, run.completed)
    if run.completed == 0:
        return []
    correct, tokens = run.correct[done], run.tokens[done]
    outcomes = trim_outcomes([item.task for item in run.items[done]], correct, tokens,
                             levels=[level.name for level in run.levels])
    adaptive = regional_bandit(outcomes, lam=lam, learner=learner, explore=explore,
                               sharing=sharing, kappa=kappa, n_orders=n_orders, seed=seed)
    adaptive_name = f"adaptive (regional {learner})"
    policies: list[tuple[str, np.ndarray, np.ndarray, object, float | None]] = [
        (adaptive_name, adaptive.correct, adaptive.tokens, None, None)]
    for a, level in enumerate(run.levels):
        policies.append((level.name, correct[:, a], tokens[:, a], level.requested_tokens,
                         float(run.estimated[done, a].mean())))
    for name, reference_policy in (("per-task oracle", category_oracle),
                                   ("per-item oracle", oracle)):
        chosen = reference_policy(outcomes, lam=lam)
        policies.append((name, chosen.correct, chosen.tokens, None, None))
    matched = [a for a in range(len(run.levels)) if tokens[:, a].mean()
               <= adaptive.tokens.mean() + 1e-9]
    reference = (max(matched, key=lambda a: (correct[:, a].mean(), -tokens[:, a].mean()))
                 if matched else int(np.argmin(tokens.mean(axis=0))))
    rows = []
    for name, hits, cost, requested, estimated in policies:
        interval = bootstrap_mean(hits, n_resamples=n_resamples, seed=seed)
        is_adaptive = name == adaptive_name
        other = correct[:, reference] if is_adaptive else adaptive.correct
        gap = paired_bootstrap(hits, other, n_resamples=n_resamples, seed=seed)
        rows.append({
            "method": name, "accuracy": interval.estimate, "ci_low": interval.low,
            "ci_high": interval.high, "tokens": float(cost.mean()),
            "requested_tokens": requested, "estimated_tokens": estimated,
            "reward": float(hits.mean() - lam * cost.mean()),
            "delta": gap.estimate, "delta_ci_low": gap.low, "delta_ci_high": gap.high,
            "delta_against": run.levels[reference].name if is_adaptive else "adaptive",
            "items": run.completed,
        })
    return rows
