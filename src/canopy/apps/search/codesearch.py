"""Code search with an execution probe (paper Appendix E, HumanEval and MBPP) at matched
generation calls, live against an OpenAI-compatible endpoint.

Methods, each with ``B`` generation calls per task:

- ``first``: one program; ``best_of_n``: ``B`` programs, the one passing the most partial
  tests (the probe; ties to the higher mean token log-probability); ``majority``: ``B``
  programs clustered by what they answer to the partial tests' calls, a program of the
  largest cluster (ties to the cluster passing more partial tests; programs that raise on
  every call cast no vote unless all do);
- ``value_guided``: the core :class:`~canopy.policies.OptimisticDescent` over the prefix tree
  of the program (one line a step, indentation kept): a probe is a rollout scored by its
  partial-test pass rate, a leaf evaluation grades a complete program by all of the task's
  tests (no generation call), as the paper's protocol has it. Programs are a few lines, so
  the tree is wide and shallow (default 4 lines per prefix, 2 levels): a deep binary tree of
  lines holds only a handful of distinct short programs.

The answer of each method is graded by all of the task's tests (pass = every test passes).
``pass@k`` of the ``B`` best-of-N programs (the unbiased estimator of Chen et al., 2021) is
the reachability reference: what any selector among those samples could reach.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

import numpy as np

from canopy.apps.search.budget import check_budgets
from canopy.apps.search.code import STOP, CodeTask, outputs, pass_rate, program
from canopy.apps.search.guided import value_guided
from canopy.apps.search.live import LiveResult, SearchConfig, _Sample, _Session
from canopy.apps.search.prefix_tree import Completion
from canopy.llm.client import LLMClient, LLMError

__all__ = ["CODE_METHODS", "pass_at_k", "run_code_search"]

CODE_METHODS = ("first", "best_of_n", "majority", "value_guided")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples of which ``c`` pass: ``1 - C(n-c, k) / C(n, k)``."""
    if not 0 <= c <= n or k < 1:
        raise ValueError(f"need 0 <= c <= n and k >= 1, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def _session(client: LLMClient, config: SearchConfig, task: CodeTask, budget: float,
             seed: int) -> _Session:
    """A live session on one task: rollouts complete the program, steps add one line."""
    return _Session(client, config, task.prompt, budget, seed,
                    answer_of=functools.partial(program, task), stop=STOP)


class _Grader:
    """Sandbox runs of one task's programs, each program run once per test set."""

    def __init__(self, task: CodeTask) -> None:
        self.task = task
        self._probe: dict[str, float] = {}
        self._full: dict[str, float] = {}
        self._outputs: dict[str, str] = {}

    def probe(self, source: str) -> float:
        if source not in self._probe:
            self._probe[source] = pass_rate(source, self.task.probe_tests)
        return self._probe[source]

    def passes(self, source: str | None) -> bool:
        if source is None:
            return False
        if source not in self._full:
            self._full[source] = pass_rate(source, self.task.tests)
        return self._full[source] == 1.0

    def probe_sample(self, sample: _Sample) -> float:
        """The probe of a rollout: its program's partial-test pass rate."""
        return self.probe(sample.answer or "")

    def grade(self, done: Completion) -> float:
        """The leaf evaluation: 1 when the complete program passes every test."""
        return float(self.passes(done.answer))

    def only_errors(self, behaviour: str) -> bool:
        """Whether a behaviour is an exception on every call (a program that answers
        nothing, e.g. one that never defines the function)."""
        lines = behaviour.splitlines()
        return bool(lines) and all(line.split(" ", 1)[-1].endswith("Error") for line in lines)

    def behaviour(self, source: str) -> str:
        if source not in self._outputs:
            self._outputs[source] = outputs(source, self.task.probe_inputs) \
                if self.task.probe_inputs else source
        return self._outputs[source]


def _sampled(session: _Session, grader: _Grader, budget: int
             ) -> tuple[dict[str, tuple[str | None, int, int]], list[str]]:
    """``first``, ``best_of_n`` and ``majority`` (answer, calls, tokens) on one shared set
    of ``budget`` rollouts, and the programs sampled."""
    samples = [session.rollout("", seed=i) for i in range(budget)]
    programs = [s.answer or "" for s in samples]
    best = max(range(budget), key=lambda i: (grader.probe(programs[i]), samples[i].logprob,
                                             -i))
    clusters: dict[str, list[int]] = {}
    for i, source in enumerate(programs):
        clusters.setdefault(grader.behaviour(source), []).append(i)
    answering = {b: m for b, m in clusters.items() if not grader.only_errors(b)}
    clusters = answering or clusters  # a program that answers nothing casts no vote
    largest = max(clusters.values(), key=lambda members: (
        len(members), grader.probe(programs[members[0]]), -members[0]))
    spent = session.tokens
    return ({"first": (programs[0], 1, samples[0].tokens),
             "best_of_n": (programs[best], budget, spent),
             "majority": (programs[largest[0]], budget, spent)}, programs)


def run_code_search(client: LLMClient, tasks: Sequence[CodeTask], *, budgets: Sequence[int],
                    methods: Sequence[str] = CODE_METHODS, config: SearchConfig | None = None,
                    seed: int = 0, progress: Callable[[int, int], None] | None = None
                    ) -> tuple[LiveResult, dict[str, float]]:
    """Every method at every budget on every task; the per-task outcomes (a
    :class:`~canopy.apps.search.live.LiveResult`, correct = all tests pass) and pass@k of the
    best-of-N samples at the largest budget, for ``k`` = 1 and each budget."""
    config = config or SearchConfig(max_tokens=256, step_tokens=48, branching=4, max_depth=2)
    unknown = [m for m in methods if m not in CODE_METHODS]
    if unknown:
        raise ValueError(f"unknown methods {unknown}; known: {list(CODE_METHODS)}")
    if not tasks:
        raise ValueError("no tasks")
    checked = sorted({int(b) for b in check_budgets(budgets, whole=True)})
    result = LiveResult.empty(checked, methods, len(tasks))
    largest_counts: list[tuple[int, int]] = []
    for t, task in enumerate(tasks):
        grader = _Grader(task)
        try:
            for b, budget in enumerate(checked):
                session = _session(client, config, task, budget, seed)
                outcome, programs = _sampled(session, grader, budget)
                if b == len(checked) - 1:
                    largest_counts.append((len(programs), sum(map(grader.passes, programs))))
                if "value_guided" in methods:
                    guided = _session(client, config, task, budget, seed)
                    answer = value_guided(guided, probe_score=grader.probe_sample,
                                          leaf_value=grader.grade, code=True)
                    outcome["value_guided"] = (answer, guided.calls, guided.tokens)
                for method in methods:
                    answer, calls, tokens = outcome[method]
                    result.correct[method][b, t] = float(grader.passes(answer))
                    result.calls[method][b, t] = calls
                    result.tokens[method][b, t] = tokens
                    result.answers[method][b][t] = answer
        except LLMError as error:
            result.error = f"task {task.task_id}: {error}"
            break
        result.completed = t + 1
        if progress is not None:
            progress(t + 1, len(tasks))
    reach = {f"pass@{k}": float(np.mean([pass_at_k(n, c, k) for n, c in largest_counts]))
             for k in sorted({1, *checked}) if largest_counts and k <= checked[-1]}
    return result, reach
