"""Live test-time search against an OpenAI-compatible endpoint (paper Section 4, "Test-time
search"), at budgets matched in generation calls and reported in tokens, on a task of
:mod:`canopy.apps.search.tasks` (GSM8K, MATH-500).

A node is a partial answer: the prompt plus a prefix of reasoning steps (lines). Every call is
a completion from a prefix:

- a *rollout* continues a prefix to a complete answer (a leaf); it is also the probe of the
  prefix, since it lands on a random complete answer below it (Eq. 1: a probe of ``v`` observes
  a uniform leaf under ``v``);
- a *step* continues a prefix by one line (beam search's unit).

Methods, all at the same budget of ``B`` calls per question:

- ``first``, ``best_of_n`` (highest mean token log-probability), ``majority`` and
  ``weighted_vote`` (votes weighted by the geometric-mean token probability) share ``B``
  independent rollouts from the empty prefix (``first`` uses one);
- ``beam``: beam search over steps scored by mean token log-probability, the remaining calls
  spent on rollouts of the surviving beams;
- ``value_guided``: the core library's :class:`~canopy.policies.OptimisticDescent` on the
  prefix tree (:mod:`canopy.apps.search.guided`): probes are rollouts scored by their
  geometric-mean token probability, leaf evaluations grade a complete answer by its agreement
  with fresh rollouts, and steps materialise the prefixes the policy touches.

Ground truth grades answers only; it also says whether any of best-of-N's rollouts was right
(``LiveResult.reachable``, the headroom any selector among them could reach). A failing
endpoint stops the run cleanly; the questions finished before it keep their results
(``LiveResult.error`` says what happened).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from canopy.apps.search.budget import check_budgets
from canopy.apps.search.config import SearchConfig
from canopy.apps.search.gsm8k import extract_answer, render_prompt, states_answer
from canopy.apps.search.guided import value_guided
from canopy.apps.search.tasks import GSM8K, Item, LiveTask
from canopy.bootstrap import bootstrap_mean, paired_bootstrap
from canopy.llm.client import LLMClient, LLMError
from canopy.problem import Ledger

__all__ = ["LIVE_METHODS", "LiveResult", "SearchConfig", "run_search"]

LIVE_METHODS = ("first", "best_of_n", "majority", "weighted_vote", "beam", "value_guided")
_STOP = ["<|im_end|>", "<|endoftext|>"]


@dataclass(frozen=True)
class _Sample:
    text: str
    logprob: float  # mean token log-probability (0 when the server sends none)
    answer: str | None
    tokens: int  # prompt + completion tokens of the call


class _Session:
    """One question (or code task) under one budget: every call goes through here and is
    charged to a :class:`~canopy.problem.Ledger` (rollouts as leaf evaluations, steps as
    probes); ``answer_of`` reads the answer of a complete text (the task's final answer, or
    the program a completion makes) and ``final`` says whether a line ends an answer."""

    def __init__(self, client: LLMClient, config: SearchConfig, prompt: str, budget: float,
                 seed: int, *, answer_of: Callable[[str], str | None] = extract_answer,
                 final: Callable[[str], bool] = states_answer,
                 stop: Sequence[str] = _STOP) -> None:
        self.client, self.config, self.seed, self.prompt = client, config, seed, prompt
        self.answer_of, self.final, self.stop = answer_of, final, list(stop)
        self.ledger = Ledger(budget)
        self.prompt_tokens = 0
        self.completion_tokens = 0

    def _call(self, prefix: str, *, kind: str, seed: int, max_tokens: int,
              stop: list[str]) -> _Sample:
        self.ledger.charge("leaf" if kind == "rollout" else "probe", 1.0)
        response = self.client.complete(self.prompt + prefix, max_tokens=max_tokens,
                                        temperature=self.config.temperature,
                                        seed=self.seed + seed, stop=stop, logprobs=1)
        self.prompt_tokens += response.prompt_tokens
        self.completion_tokens += response.completion_tokens
        return _Sample(response.text, _mean_logprob(response.raw),
                       self.answer_of(prefix + response.text), response.total_tokens)

    def rollout(self, prefix: str, seed: int) -> _Sample:
        return self._call(prefix, kind="rollout", seed=seed,
                          max_tokens=self.config.max_tokens, stop=self.stop)

    def step(self, prefix: str, seed: int) -> _Sample:
        return self._call(prefix, kind="step", seed=seed, max_tokens=self.config.step_tokens,
                          stop=["\n", *self.stop])

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def calls(self) -> int:
        return self.ledger.n_probes + self.ledger.n_leaves

    def can_call(self, count: int = 1) -> bool:
        return self.ledger.can_afford(float(count))


def _mean_logprob(raw: dict) -> float:
    try:
        values = raw["choices"][0]["logprobs"]["token_logprobs"]
        finite = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    except (KeyError, IndexError, TypeError, ValueError):
        return 0.0
    return float(np.mean(finite)) if finite else 0.0


def _plurality(answers: Sequence[str | None],
               weights: Sequence[float] | None = None) -> str | None:
    """Most supported answer (``None`` votes ignored); ties go to the earliest."""
    score: dict[str, float] = {}
    for position, answer in enumerate(answers):
        if answer is not None:
            score[answer] = score.get(answer, 0.0) + (1.0 if weights is None else
                                                      weights[position])
    if not score:
        return None
    return max(score, key=lambda a: (score[a], -answers.index(a)))


# ---------------------------------------------------------------------- best-of-N family
def _best_of_n_family(session: _Session, budget: int
                      ) -> tuple[dict[str, tuple[str | None, int, int]], list[str | None]]:
    """Answer, calls and tokens of each best-of-N variant on one shared set of rollouts, and
    the answers of all the rollouts."""
    samples = [session.rollout("", seed=i) for i in range(budget)]
    best = max(range(len(samples)), key=lambda i: (samples[i].logprob, -i))
    answers = [s.answer for s in samples]
    tokens = sum(s.tokens for s in samples)
    return {
        "first": (samples[0].answer, 1, samples[0].tokens),
        "best_of_n": (samples[best].answer, budget, tokens),
        "majority": (_plurality(answers), budget, tokens),
        "weighted_vote": (_plurality(answers, [math.exp(s.logprob) for s in samples]), budget,
                          tokens),
    }, answers


# ---------------------------------------------------------------------- beam search
@dataclass(frozen=True)
class _Beam:
    prefix: str
    score: float  # mean of the steps' mean token log-probabilities
    steps: int
    finished: bool


def _beam(session: _Session) -> str | None:
    width, expand = session.config.beam_width, session.config.beam_expand
    beams = [_Beam("", 0.0, 0, False)]
    call = 0
    while (open_beams := [b for b in beams if not b.finished]) and session.can_call(
            len(open_beams) * expand + min(width, len(open_beams))):
        candidates = [b for b in beams if b.finished]
        for beam in open_beams:
            for _ in range(expand):
                sample = session.step(beam.prefix, seed=call)
                call += 1
                line = sample.text.strip()
                score = (beam.score * beam.steps + sample.logprob) / (beam.steps + 1)
                candidates.append(_Beam(beam.prefix + sample.text + "\n", score,
                                        beam.steps + 1, not line or session.final(line)))
        beams = sorted(candidates, key=lambda b: -b.score)[:width]
    answers: list[str | None] = []
    weights: list[float] = []
    open_beams = [b for b in beams if not b.finished]
    while open_beams and session.can_call():  # spend the rest on rollouts, round robin
        beam = open_beams[call % len(open_beams)]
        sample = session.rollout(beam.prefix, seed=call)
        call += 1
        answers.append(sample.answer)
        weights.append(math.exp(sample.logprob))
    for beam in beams:
        if beam.finished:
            answers.append(session.answer_of(beam.prefix))
            weights.append(math.exp(beam.score))
    return _plurality(answers, weights)


# ---------------------------------------------------------------------- runner
@dataclass
class LiveResult:
    """Per-question outcomes of every method at every budget. Arrays are indexed
    ``[budget, question]``; questions not reached (the run stopped early) are NaN.
    ``reachable`` is 1 where any of the best-of-N family's rollouts is right (pass@B: what
    any selector among them could reach), NaN where that family did not run."""

    budgets: tuple[int, ...]
    methods: tuple[str, ...]
    n_questions: int
    correct: dict[str, np.ndarray] = field(default_factory=dict)
    calls: dict[str, np.ndarray] = field(default_factory=dict)
    tokens: dict[str, np.ndarray] = field(default_factory=dict)
    answers: dict[str, list[list[str | None]]] = field(default_factory=dict)
    reachable: np.ndarray = field(default_factory=lambda: np.empty((0, 0)))
    completed: int = 0
    error: str | None = None

    @classmethod
    def empty(cls, budgets: Sequence[int], methods: Sequence[str], n: int) -> LiveResult:
        """A result with every outcome still NaN (not reached)."""
        result = cls(tuple(budgets), tuple(methods), n)
        result.reachable = np.full((len(budgets), n), np.nan)
        for method in methods:
            result.correct[method] = np.full((len(budgets), n), np.nan)
            result.calls[method] = np.full((len(budgets), n), np.nan)
            result.tokens[method] = np.full((len(budgets), n), np.nan)
            result.answers[method] = [[None] * n for _ in budgets]
        return result

    def rows(self, *, reference: str = "best_of_n", n_resamples: int = 2000,
             seed: int = 0) -> list[dict[str, object]]:
        """Accuracy with bootstrap intervals over the completed questions, the paired gap to
        ``reference``, and the mean calls and tokens per question."""
        if self.completed == 0:
            return []
        done = slice(0, self.completed)
        out = []
        for b, budget in enumerate(self.budgets):
            for method in self.methods:
                acc = self.correct[method][b, done]
                interval = bootstrap_mean(acc, n_resamples=n_resamples, seed=seed)
                row: dict[str, object] = {
                    "method": method, "budget": budget, "accuracy": interval.estimate,
                    "ci_low": interval.low, "ci_high": interval.high, "delta": None,
                    "delta_ci_low": None, "delta_ci_high": None,
                    "calls": float(self.calls[method][b, done].mean()),
                    "tokens": float(self.tokens[method][b, done].mean()),
                    "questions": self.completed,
                }
                if method != reference and reference in self.methods:
                    gap = paired_bootstrap(acc, self.correct[reference][b, done],
                                           n_resamples=n_resamples, seed=seed)
                    row.update(delta=gap.estimate, delta_ci_low=gap.low, delta_ci_high=gap.high)
                out.append(row)
        return out

    def reachability(self, *, n_resamples: int = 2000, seed: int = 0
                     ) -> list[dict[str, object]]:
        """Per budget, the share of completed questions where a best-of-N rollout is right,
        with its bootstrap interval (none where the best-of-N family did not run)."""
        done = self.reachable[:, :self.completed]
        out = []
        for b, budget in enumerate(self.budgets):
            if self.completed and not np.isnan(done[b]).any():
                interval = bootstrap_mean(done[b], n_resamples=n_resamples, seed=seed)
                out.append({"budget": budget, "reachable": interval.estimate,
                            "ci_low": interval.low, "ci_high": interval.high})
        return out


def run_search(client: LLMClient, questions: Sequence[Item], *, budgets: Sequence[int],
               methods: Sequence[str] = LIVE_METHODS, config: SearchConfig | None = None,
               seed: int = 0, task: LiveTask = GSM8K,
               progress: Callable[[int, int], None] | None = None) -> LiveResult:
    """Every method at every budget on every question of ``task`` (its prompt, answer
    format and grader). Identical requests (the best-of-N rollouts from the empty prefix,
    reused by other methods and budgets) are answered by the client's cache when it has one,
    but each method is charged for all the calls it makes."""
    config = config or SearchConfig()
    if not questions:
        raise ValueError("questions is empty")
    checked = [int(b) for b in check_budgets(budgets, whole=True)]
    unknown = [m for m in methods if m not in LIVE_METHODS]
    if unknown:
        raise ValueError(f"unknown methods {unknown}; known: {list(LIVE_METHODS)}")
    result = LiveResult.empty(checked, methods, len(questions))
    family = [m for m in methods if m in ("first", "best_of_n", "majority", "weighted_vote")]
    for q, question in enumerate(questions):
        try:
            outcomes, sampled = _one_question(client, question, checked, methods, family,
                                              config, seed, task)
        except LLMError as error:
            result.error = f"question {q}: {error}"
            break
        for b, answers in sampled.items():
            result.reachable[b, q] = float(any(task.grade(a, question.gold) for a in answers))
        for (method, b), (answer, calls, tokens) in outcomes.items():
            result.correct[method][b, q] = float(task.grade(answer, question.gold))
            result.calls[method][b, q] = calls
            result.tokens[method][b, q] = tokens
            result.answers[method][b][q] = answer
        result.completed = q + 1
        if progress is not None:
            progress(q + 1, len(questions))
    return result


def _one_question(client: LLMClient, question: Item, budgets: Sequence[int],
                  methods: Sequence[str], family: Sequence[str], config: SearchConfig,
                  seed: int, task: LiveTask
                  ) -> tuple[dict[tuple[str, int], tuple[str | None, int, int]],
                             dict[int, list[str | None]]]:
    outcomes: dict[tuple[str, int], tuple[str | None, int, int]] = {}
    sampled: dict[int, list[str | None]] = {}
    prompt = render_prompt(question.text, template=config.template,
                           system=task.system if config.system is None else config.system)

    def session(budget: int) -> _Session:
        return _Session(client, config, prompt, budget, seed, answer_of=task.answer_of,
                        final=task.final)

    for b, budget in enumerate(budgets):
        if family:
            picks, sampled[b] = _best_of_n_family(session(budget), budget)
            for method in family:
                outcomes[method, b] = picks[method]
        for method, search in (("beam", _beam), ("value_guided", value_guided)):
            if method in methods:
                searching = session(budget)
                answer = search(searching)
                outcomes[method, b] = (answer, searching.calls, searching.tokens)
    return outcomes, sampled
