"""A bandit per task category over trim levels (paper Section 5, "Serving systems": the arms
are trim levels and the regions are task categories), its fixed-trim baselines and the
per-item oracle.

Reward of serving an item with trim level ``a``: ``correct - lam * input_tokens``. Within each
category the items arrive in a seeded random order; UCB1 tries every level once, then plays the
level of highest ``mean + c * range * sqrt(2 ln t / n)``. It only ever sees the outcome of the
level it played.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["BanditOutcome", "oracle", "ucb_per_category"]


@dataclass(frozen=True)
class BanditOutcome:
    """Per-item correctness and input tokens of the levels a policy chose (means over the
    replicate orders), and how often it chose each level."""

    correct: np.ndarray
    tokens: np.ndarray
    choice_share: np.ndarray


def _check(categories: np.ndarray, correct: np.ndarray, tokens: np.ndarray,
           lam: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    cats = np.asarray(categories)
    hits = np.asarray(correct, dtype=float)
    cost = np.asarray(tokens, dtype=float)
    if hits.ndim != 2 or hits.shape != cost.shape or cats.shape != (hits.shape[0],):
        raise ValueError(f"correct {hits.shape} and tokens {cost.shape} must be (items, levels) "
                         f"with one category per item, got {cats.shape}")
    if hits.size == 0:
        raise ValueError("no items to trim")
    if not (np.all(np.isfinite(cost)) and np.all(np.isfinite(hits))):
        raise ValueError("correct and tokens must be finite")
    if not (math.isfinite(lam) and lam >= 0):
        raise ValueError(f"lam must be a finite number >= 0, got {lam}")
    return cats, hits, cost


def ucb_per_category(categories: np.ndarray, correct: np.ndarray, tokens: np.ndarray, *,
                     lam: float, exploration: float = 1.0, n_orders: int = 20,
                     seed: int | np.random.Generator | None = 0) -> BanditOutcome:
    """Run UCB1 independently in every category over ``n_orders`` random item orders."""
    cats, hits, cost = _check(categories, correct, tokens, lam)
    if n_orders < 1:
        raise ValueError(f"n_orders must be >= 1, got {n_orders}")
    rng = np.random.default_rng(seed)
    reward = hits - lam * cost
    width = max(float(reward.max() - reward.min()), 1e-9)
    n_items, n_levels = hits.shape
    got_correct = np.zeros(n_items)
    got_tokens = np.zeros(n_items)
    share = np.zeros(n_levels)
    for _ in range(n_orders):
        for category in np.unique(cats):
            members = np.flatnonzero(cats == category)
            pulls = np.zeros(n_levels)
            totals = np.zeros(n_levels)
            for t, item in enumerate(rng.permutation(members), start=1):
                if np.any(pulls == 0):
                    level = int(np.flatnonzero(pulls == 0)[0])
                else:
                    index = totals / pulls + exploration * width * np.sqrt(2 * math.log(t) / pulls)
                    level = int(np.argmax(index))
                pulls[level] += 1
                totals[level] += reward[item, level]
                got_correct[item] += hits[item, level]
                got_tokens[item] += cost[item, level]
                share[level] += 1
    return BanditOutcome(got_correct / n_orders, got_tokens / n_orders,
                         share / share.sum())


def oracle(correct: np.ndarray, tokens: np.ndarray, *, lam: float) -> BanditOutcome:
    """Per item, the level of highest reward knowing every outcome (an upper reference)."""
    cats = np.zeros(np.asarray(correct).shape[0])
    _, hits, cost = _check(cats, correct, tokens, lam)
    reward = hits - lam * cost
    # highest reward; among equals, fewer tokens, then the earlier level
    best = np.array([min(range(hits.shape[1]), key=lambda a, i=i: (-reward[i, a], cost[i, a]))
                     for i in range(hits.shape[0])])
    rows = np.arange(hits.shape[0])
    share = np.bincount(best, minlength=hits.shape[1]) / hits.shape[0]
    return BanditOutcome(hits[rows, best], cost[rows, best], share)
