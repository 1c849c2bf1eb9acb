"""The trimming bandit (paper Section 4, "Serving systems"): the routing application's regional
bandit with trim levels as the arms and task categories as the regions, its per-category and
per-item oracles.

Trimming outcomes are routing :class:`~canopy.regional.outcomes.Outcomes`: quality is
correctness, cost is input tokens, so the reward is ``correct - lam * input_tokens``. The
bandit is :class:`~canopy.regional.RegionalRouter` (UCB1-Tuned or Thompson per
category, statistics backed off to the pool of all categories): items arrive in a seeded
random order over all categories and it only ever sees the outcome of the level it played.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from canopy.regional.outcomes import Outcomes, category_choices, query_choices
from canopy.regional.router import RegionalRouter

__all__ = ["BanditOutcome", "category_oracle", "oracle", "regional_bandit", "trim_outcomes"]


@dataclass(frozen=True)
class BanditOutcome:
    """Per-item correctness and input tokens of the levels a policy chose (means over the
    replicate orders), and ``choices[item, level]``, the share of orders that served the item
    with the level."""

    correct: np.ndarray
    tokens: np.ndarray
    choices: np.ndarray

    @property
    def choice_share(self) -> np.ndarray:
        """How often each level was played, over all items and orders."""
        return self.choices.mean(axis=0)


def trim_outcomes(categories: Sequence[object] | np.ndarray, correct: np.ndarray,
                  tokens: np.ndarray, *, levels: Sequence[str] | None = None) -> Outcomes:
    """Outcomes ``[item, level]`` as routing outcomes: regions are the categories (``str``
    of each; ``/`` nests them, ``"bbh/navigate"``), models are the level names (default
    ``level0, level1, ...``), quality is ``correct`` in [0, 1], cost is ``tokens``."""
    hits = np.asarray(correct, dtype=float)
    cost = np.asarray(tokens, dtype=float)
    cats = [str(c) for c in np.asarray(categories).tolist()]
    if hits.ndim != 2 or hits.shape != cost.shape or len(cats) != hits.shape[0]:
        raise ValueError(f"correct {hits.shape} and tokens {cost.shape} must be (items, levels) "
                         f"with one category per item, got {len(cats)} categories")
    if hits.size == 0:
        raise ValueError("no items to trim")
    names = tuple(levels) if levels is not None else tuple(
        f"level{a}" for a in range(hits.shape[1]))
    if len(names) != hits.shape[1]:
        raise ValueError(f"{len(names)} level names for {hits.shape[1]} levels")
    if not all(cats):
        raise ValueError("every item needs a non-empty category")
    return Outcomes("trimming", tuple(str(i) for i in range(hits.shape[0])), tuple(cats), names,
                    hits, cost)


def regional_bandit(outcomes: Outcomes, *, lam: float, learner: str = "ucb",
                    explore: float = 1.0, sharing: str = "test", kappa: float = 5.0,
                    n_orders: int = 20,
                    seed: int | np.random.Generator | None = 0) -> BanditOutcome:
    """Serve every item once with a fresh :class:`RegionalRouter` per random item order
    (``n_orders`` orders); per item, the mean outcome of the levels it was served with.
    ``sharing`` is the router's rule between a task and the pool of all tasks
    (:mod:`canopy.sharing`; ``kappa`` is the weight of ``"backoff"``)."""
    if n_orders < 1:
        raise ValueError(f"n_orders must be >= 1, got {n_orders}")
    rng = np.random.default_rng(seed)
    n_items, n_levels = outcomes.quality.shape
    regions = sorted(set(outcomes.regions))
    got_correct, got_tokens = np.zeros(n_items), np.zeros(n_items)
    plays = np.zeros((n_items, n_levels))
    for _ in range(n_orders):
        router = RegionalRouter(outcomes.models, lam=lam, regions=regions, learner=learner,
                                sharing=sharing, kappa=kappa, explore=explore, seed=rng)
        for item in rng.permutation(n_items):
            region = outcomes.regions[item]
            level = outcomes.models.index(router.route(region))
            hit, cost = outcomes.quality[item, level], outcomes.cost[item, level]
            router.update(region, outcomes.models[level], hit, cost)
            got_correct[item] += hit
            got_tokens[item] += cost
            plays[item, level] += 1
    return BanditOutcome(got_correct / n_orders, got_tokens / n_orders, plays / n_orders)


def _chosen(outcomes: Outcomes, best: np.ndarray) -> BanditOutcome:
    rows = np.arange(outcomes.n_queries)
    choices = np.zeros(outcomes.quality.shape)
    choices[rows, best] = 1.0
    return BanditOutcome(outcomes.quality[rows, best], outcomes.cost[rows, best], choices)


def oracle(outcomes: Outcomes, *, lam: float) -> BanditOutcome:
    """Per item, the level of highest reward knowing every outcome (an upper reference; ties
    to fewer tokens, then the earlier level)."""
    return _chosen(outcomes, query_choices(outcomes, lam))


def category_oracle(outcomes: Outcomes, *, lam: float) -> BanditOutcome:
    """Per category, the level of highest mean reward in hindsight: the fixed choice a
    per-category bandit converges to."""
    return _chosen(outcomes, category_choices(outcomes, lam)[0])
