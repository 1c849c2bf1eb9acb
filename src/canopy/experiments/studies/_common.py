"""Helpers shared by the synthetic studies: policies built from a cell, per-seed generators,
regret curves, recall, and headline lookups."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

import numpy as np

from canopy.experiments.study import Headline, Row
from canopy.instances import tree_lipschitz
from canopy.metrics import cumulative_regret, recall_at_k
from canopy.policies.base import Policy
from canopy.problem import LeafMeans, Problem
from canopy.run import RunResult, run

__all__ = [
    "PAPER_C",
    "headline",
    "instance_seed",
    "lipschitz_instance",
    "log_slope",
    "make_policy",
    "policy_cell",
    "recall",
    "regret_curve",
]


#: Eq. (4)'s ``c`` in the paper's regret studies: the paper leaves it open; they were measured
#: at ``c = 1`` (the descent's former default, now the problem's noise sd) and keep it.
PAPER_C = 1.0


def policy_cell(method: str, policy: str, **kwargs: Any) -> dict[str, Any]:
    """The part of a cell naming a policy: its label, class name in :mod:`canopy.policies`
    and constructor keywords (all JSON, so they enter the resume key)."""
    return {"method": method, "policy": policy, "kwargs": kwargs}


def make_policy(cell: Mapping[str, Any]) -> Policy:
    """A fresh policy from a cell built by :func:`policy_cell`."""
    policies = importlib.import_module("canopy.policies")
    return getattr(policies, cell["policy"])(**cell["kwargs"])


def instance_seed(seed: int) -> np.random.SeedSequence:
    """The instance's seed stream for run seed ``seed``: shared by every method of a seed
    (common random numbers), independent of the run's own streams."""
    return np.random.SeedSequence([seed, 0x1A57])


def lipschitz_instance(cell: Mapping[str, Any], seed: int, *, probe_cost: float = 1.0
                       ) -> LeafMeans:
    """The seed's :func:`~canopy.instances.tree_lipschitz` instance described by a cell's
    ``branching``, ``depth``, ``lipschitz`` and ``sigma``."""
    return tree_lipschitz(cell["branching"], cell["depth"], lipschitz=cell["lipschitz"],
                          sigma=cell["sigma"], probe_cost=probe_cost, seed=instance_seed(seed))


def recall(result: RunResult, problem: LeafMeans, k: int) -> float:
    """recall@k of a finished identification run."""
    return recall_at_k(result.recommendation[:k], problem.top_k(k))


def regret_curve(policy: Policy, problem: Problem, *, horizon: int, seed: int
                 ) -> np.ndarray:
    """Cumulative regret ``R_t, t = 1..horizon`` of regret play (one query per round, every
    cost 1, budget = horizon), scored with the problem's ``value`` (memoised per node)."""
    result = run(policy, problem, budget=float(horizon), seed=seed, record=True)
    cache: dict[Hashable, float] = {}
    value: Callable[[Hashable], float] = problem.value  # type: ignore[attr-defined]

    def memo(node: Hashable) -> float:
        if node not in cache:
            cache[node] = value(node)
        return cache[node]

    mu_star = float(problem.mu_star)  # type: ignore[attr-defined]
    return cumulative_regret(result, memo, mu_star)


def headline(label: str, row: Row | None, *, paper: float | None = None, target: str = "",
             passed: bool | None = None) -> list[Headline]:
    """A one-element list with the headline of ``row`` (empty when the row is missing)."""
    if row is None:
        return []
    return [Headline(label, row.mean, row.ci_low, row.ci_high, paper=paper, target=target,
                     passed=passed)]


def log_slope(rows: Sequence[Row], method: str, metric: str) -> float | None:
    """Least-squares slope of ``log mean`` on ``x`` over ``method``'s rows of ``metric`` with a
    positive mean (an exponential decay's rate, negated); ``None`` with fewer than two."""
    points = [(r.x, r.mean) for r in rows
              if r.method == method and r.metric == metric and r.x is not None and r.mean > 0]
    if len(points) < 2:
        return None
    xs, means = (np.array(v) for v in zip(*points, strict=True))
    return float(np.polyfit(xs, np.log(means), 1)[0])
