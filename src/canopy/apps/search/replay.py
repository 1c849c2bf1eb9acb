"""Offline replay of test-time selection on logged MATH answers (paper Section 4, "Test-time
search"; data set ``qwen25math_rm``: 100 problems x 8 sampled chain-of-thought answers, each
with its final answer, a reward-model score and its correctness).

What costs what. The budget counts model calls: generating one answer is one call and reveals
its final answer (a vote: the cheap, biased fidelity, since agreement is not correctness);
scoring one generated answer with the reward model costs ``rm_cost`` calls (the expensive,
per-answer fidelity; the RM is itself a large model). Correctness is ground truth and is read
only to grade the answer a method returns, never to choose it: selectors see the log through a
:class:`SampleStream` that hands out final answers and reward scores and charges a
:class:`~canopy.problem.Ledger`, and nothing else.

Methods at a budget of ``B`` calls (the order in which the logged answers are "generated" is a
seeded random permutation per replicate, shared by all methods):

- ``first``: one answer, no selection (1 call, the floor);
- ``majority``: ``min(B, 8)`` answers, the most frequent final answer (self-consistency);
- ``best_of_n``: the largest ``N`` with ``N + N * rm_cost <= B`` (no RM call when ``N = 1``),
  the answer of highest reward;
- ``weighted_vote``: the same ``N``, final answers weighted by ``sigmoid(reward)``;
- ``multi_fidelity``: the tree is problem -> answer cluster (same final answer) -> answer.
  Generations probe the root (each lands on a uniform leaf and reveals its cluster). A sign
  test on the votes certifies the leading cluster against each other cluster (the cheap
  certificate); where it fails, the expensive reward evaluation goes to one answer of each
  contested cluster, and the contested cluster with the best reward wins. Where it holds, no
  reward call is spent.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from scipy.stats import binom

from canopy.apps.search.budget import check_budgets
from canopy.bootstrap import Interval, bootstrap_mean, paired_bootstrap
from canopy.data import bad_line, jsonl_rows
from canopy.problem import Ledger

__all__ = [
    "METHODS",
    "LoggedProblem",
    "ReplayResult",
    "ReplayRow",
    "SampleStream",
    "contested",
    "load_logged",
    "replay",
]


@dataclass(frozen=True)
class LoggedProblem:
    """One logged problem: final answers, reward scores, correctness (for grading only) and an
    approximate token count (characters / 4) of each sampled answer."""

    question: str
    answers: tuple[str, ...]
    rewards: np.ndarray
    correct: np.ndarray
    tokens: np.ndarray

    @property
    def n_samples(self) -> int:
        return len(self.answers)


def load_logged(path: str | Path) -> list[LoggedProblem]:
    """Read ``math_cot_100.jsonl`` (fields ``question``, ``pred``, ``pred_score``, ``score``,
    ``response``); a malformed line raises ``ValueError`` naming its number."""
    problems = []
    for number, row in jsonl_rows(path):
        try:
            answers = tuple(str(a) for a in row["pred"])
            rewards = np.array([float(np.ravel(s)[0]) for s in row["pred_score"]])
            correct = np.array([bool(s) for s in row["score"]])
            tokens = np.array([math.ceil(len(r) / 4) for r in row["response"]])
            question = str(row["question"])
        except (ValueError, KeyError, TypeError, IndexError) as error:
            raise bad_line(path, number, f"not a logged problem: {error!r}") from None
        sizes = {len(answers), rewards.size, correct.size, tokens.size}
        if len(sizes) != 1 or not answers:
            raise bad_line(path, number, f"fields of unequal length {sizes}")
        if not np.all(np.isfinite(rewards)):
            raise bad_line(path, number, "a non-finite reward score")
        problems.append(LoggedProblem(question, answers, rewards, correct, tokens))
    if not problems:
        raise ValueError(f"{path} holds no problems")
    return problems


class SampleStream:
    """A problem's logged answers as a selector sees them: ``generate`` reveals the next
    answer of a fixed order (cost 1), ``reward`` scores a generated one (cost
    ``rm_cost``). Both charge ``ledger`` and refuse once it cannot pay."""

    def __init__(self, problem: LoggedProblem, order: np.ndarray, ledger: Ledger,
                 rm_cost: float) -> None:
        self._problem = problem
        self._order = [int(i) for i in order]
        self.ledger = ledger
        self.rm_cost = rm_cost
        self.generated: list[int] = []
        self.rewards: dict[int, float] = {}

    def can_generate(self) -> bool:
        return len(self.generated) < len(self._order) and self.ledger.can_afford(1.0)

    def can_reward(self) -> bool:
        return self.ledger.can_afford(self.rm_cost)

    def generate(self) -> int:
        self.ledger.charge("probe", 1.0)
        index = self._order[len(self.generated)]
        self.generated.append(index)
        return index

    def answer(self, index: int) -> str:
        if index not in self.generated:
            raise ValueError(f"answer {index} has not been generated")
        return self._problem.answers[index]

    def reward(self, index: int) -> float:
        if index not in self.generated:
            raise ValueError(f"answer {index} has not been generated")
        if index not in self.rewards:
            self.ledger.charge("leaf", self.rm_cost)
            self.rewards[index] = float(self._problem.rewards[index])
        return self.rewards[index]

    def clusters(self) -> list[list[int]]:
        """Generated answers grouped by final answer, most votes first (ties: earliest)."""
        groups: dict[str, list[int]] = {}
        for index in self.generated:
            groups.setdefault(self._problem.answers[index], []).append(index)
        return sorted(groups.values(), key=lambda g: (-len(g), self.generated.index(g[0])))


def _plan_n(budget: float, rm_cost: float, available: int) -> int:
    """Largest N answers affordable when each of N >= 2 answers also gets a reward call."""
    best = 1
    for n in range(2, available + 1):
        if n * (1.0 + rm_cost) <= budget * (1 + 1e-12):
            best = n
    return best


def _first(stream: SampleStream, budget: float) -> int:
    return stream.generate()


def _majority(stream: SampleStream, budget: float) -> int:
    while stream.can_generate():
        stream.generate()
    return stream.clusters()[0][0]


def _generate_scored(stream: SampleStream, budget: float) -> list[int]:
    n = _plan_n(budget, stream.rm_cost, len(stream._order))
    picks = [stream.generate() for _ in range(n)]
    if n >= 2:
        for index in picks:
            stream.reward(index)
    return picks


def _best_of_n(stream: SampleStream, budget: float) -> int:
    picks = _generate_scored(stream, budget)
    if len(picks) == 1:
        return picks[0]
    return max(picks, key=lambda i: (stream.rewards[i], -picks.index(i)))


def _weighted_vote(stream: SampleStream, budget: float) -> int:
    picks = _generate_scored(stream, budget)
    if len(picks) == 1:
        return picks[0]
    weight = {i: 1.0 / (1.0 + math.exp(-stream.rewards[i])) for i in picks}
    return max(stream.clusters(), key=lambda g: sum(weight[i] for i in g))[0]


def contested(clusters: Sequence[Sequence[int]], delta: float) -> list[Sequence[int]]:
    """The leading cluster and every cluster the votes do not certify below it: a one-sided
    sign test of the leader's ``a`` votes against another's ``b``, ``P(Bin(a+b, 1/2) >= a)``,
    above ``delta``."""
    leader = clusters[0]
    out = [leader]
    for other in clusters[1:]:
        a, b = len(leader), len(other)
        if binom.sf(a - 1, a + b, 0.5) > delta:
            out.append(other)
    return out


def _multi_fidelity(stream: SampleStream, budget: float, *, delta: float = 0.1) -> int:
    while True:
        open_cells = contested(stream.clusters(), delta) if stream.generated else []
        unscored = [g for g in open_cells if not any(i in stream.rewards for i in g)]
        if len(open_cells) >= 2 and unscored and stream.can_reward():
            stream.reward(unscored[0][0])  # certificate fails: evaluate there
        elif stream.can_generate():
            stream.generate()  # cheap probe: one more vote
        else:
            break
    open_cells = contested(stream.clusters(), delta)
    if len(open_cells) == 1:
        return open_cells[0][0]
    scored = [g for g in open_cells if any(i in stream.rewards for i in g)]
    if not scored:
        return open_cells[0][0]
    best = max(scored, key=lambda g: max(stream.rewards[i] for i in g if i in stream.rewards))
    return max((i for i in best if i in stream.rewards), key=lambda i: stream.rewards[i])


Selector = Callable[[SampleStream, float], int]

METHODS: dict[str, Selector] = {
    "first": _first,
    "majority": _majority,
    "best_of_n": _best_of_n,
    "weighted_vote": _weighted_vote,
    "multi_fidelity": _multi_fidelity,
}


@dataclass(frozen=True)
class ReplayRow:
    """One method at one budget: accuracy with its interval over problems, the paired gap to
    the reference method, and the mean calls and tokens spent per problem."""

    method: str
    budget: float
    accuracy: Interval
    delta: Interval | None
    calls: float
    generations: float
    reward_calls: float
    tokens: float

    def as_dict(self) -> dict[str, float | str | None]:
        return {
            "method": self.method, "budget": self.budget,
            "accuracy": self.accuracy.estimate, "ci_low": self.accuracy.low,
            "ci_high": self.accuracy.high,
            "delta": None if self.delta is None else self.delta.estimate,
            "delta_ci_low": None if self.delta is None else self.delta.low,
            "delta_ci_high": None if self.delta is None else self.delta.high,
            "calls": self.calls, "generations": self.generations,
            "reward_calls": self.reward_calls, "tokens": self.tokens,
        }


@dataclass
class ReplayResult:
    """Per-problem accuracy (mean over replicate orders) of each method at each budget, and
    mean spending per problem."""

    budgets: tuple[float, ...]
    methods: tuple[str, ...]
    rm_cost: float
    n_orders: int
    accuracy: dict[str, np.ndarray] = field(default_factory=dict)  # (n_budgets, n_problems)
    generations: dict[str, np.ndarray] = field(default_factory=dict)  # (n_budgets,)
    reward_calls: dict[str, np.ndarray] = field(default_factory=dict)
    tokens: dict[str, np.ndarray] = field(default_factory=dict)

    def rows(self, *, reference: str = "best_of_n", n_resamples: int = 2000,
             seed: int = 0) -> list[ReplayRow]:
        """The table: every method at every budget, paired gaps against ``reference``."""
        if reference not in self.methods:
            raise ValueError(f"reference {reference!r} is not among methods {self.methods}")
        out = []
        for b, budget in enumerate(self.budgets):
            for method in self.methods:
                acc = self.accuracy[method][b]
                gap = None if method == reference else paired_bootstrap(
                    acc, self.accuracy[reference][b], n_resamples=n_resamples, seed=seed)
                gens, rms = self.generations[method][b], self.reward_calls[method][b]
                out.append(ReplayRow(method, budget, bootstrap_mean(
                    acc, n_resamples=n_resamples, seed=seed), gap, float(gens + self.rm_cost * rms),
                    float(gens), float(rms), float(self.tokens[method][b])))
        return out


def replay(problems: Sequence[LoggedProblem], *, budgets: Sequence[float],
           methods: Sequence[str] = tuple(METHODS), rm_cost: float = 1.0, n_orders: int = 20,
           seed: int = 0, delta: float = 0.1,
           progress: Callable[[int, int], None] | None = None) -> ReplayResult:
    """Run every method at every budget on every problem, ``n_orders`` random generation
    orders each (common to all methods: paired comparisons). ``progress(done, total)`` is
    called after each problem."""
    if not problems:
        raise ValueError("problems is empty")
    checked = check_budgets(budgets)
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ValueError(f"unknown methods {unknown}; known: {sorted(METHODS)}")
    if not (math.isfinite(rm_cost) and rm_cost >= 0):
        raise ValueError(f"rm_cost must be a finite number >= 0, got {rm_cost}")
    if n_orders < 1:
        raise ValueError(f"n_orders must be >= 1, got {n_orders}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    shape = (len(checked), len(problems))
    result = ReplayResult(tuple(checked), tuple(methods), float(rm_cost), int(n_orders))
    acc = {m: np.zeros(shape) for m in methods}
    gens = {m: np.zeros(shape) for m in methods}
    rms = {m: np.zeros(shape) for m in methods}
    toks = {m: np.zeros(shape) for m in methods}
    streams = np.random.SeedSequence(seed).spawn(len(problems))
    for p, problem in enumerate(problems):
        rng = np.random.default_rng(streams[p])
        for _ in range(n_orders):
            order = rng.permutation(problem.n_samples)
            for b, budget in enumerate(checked):
                for method in methods:
                    ledger = Ledger(budget)
                    stream = SampleStream(problem, order, ledger, rm_cost)
                    if method == "multi_fidelity":
                        pick = _multi_fidelity(stream, budget, delta=delta)
                    else:
                        pick = METHODS[method](stream, budget)
                    acc[method][b, p] += problem.correct[pick]
                    gens[method][b, p] += ledger.n_probes
                    rms[method][b, p] += ledger.n_leaves
                    toks[method][b, p] += (problem.tokens[stream.generated].sum()
                                           + problem.tokens[list(stream.rewards)].sum())
        if progress is not None:
            progress(p + 1, len(problems))
    for method in methods:
        result.accuracy[method] = acc[method] / n_orders
        result.generations[method] = gens[method].mean(axis=1) / n_orders
        result.reward_calls[method] = rms[method].mean(axis=1) / n_orders
        result.tokens[method] = toks[method].mean(axis=1) / n_orders
    return result
