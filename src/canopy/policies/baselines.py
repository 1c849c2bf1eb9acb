"""Structure-blind baselines: leaf evaluations only, at full leaf cost (Section 4, Baselines).

All ignore the tree above the leaves (``query_kinds = ("leaf",)``), spend budget in leaf-cost
units, and rank leaves for ``recommend(k)`` as described in
``TreeStatsPolicy`` (``canopy.policies._identify_core``). ``k`` in a constructor only focuses
the allocation (how many arms an elimination keeps); ``recommend`` accepts any ``k``.

- :class:`Uniform`: round-robin over the leaves in a seeded random order.
- :class:`SuccessiveElimination`: Even-Dar, Mannor and Mansour (2006), run until the budget
  ends; the paper's identification baseline.
- :class:`SuccessiveRejects`: Audibert, Bubeck and Munos (2010), phase lengths of
  ``sr_schedule``.
- :class:`SequentialHalving`: Karnin, Koren and Somekh (2013).
- :class:`FlatUCB`: UCB1 (Auer et al., 2002) over the leaves, a regret-play baseline.
"""

from __future__ import annotations

import math
from collections.abc import Generator

import numpy as np

from canopy.policies._identify_core import Batch, PhasedPolicy, TreeStatsPolicy
from canopy.policies.base import check_k, top_k
from canopy.problem import Query
from canopy.validation import check_count, check_nonnegative

__all__ = ["FlatUCB", "SequentialHalving", "SuccessiveElimination", "SuccessiveRejects",
           "Uniform"]


def _check_focus(k: int) -> int:
    """``k`` itself (stored as given) once it is a positive int."""
    check_count(k, "k")
    return k


class _LeafPhased(PhasedPolicy):
    """A phased policy over leaf evaluations only."""

    query_kinds = ("leaf",)

    def _all_leaves(self) -> np.ndarray:
        return self.tree_.leaf_node[self._tiebreak]

    def _pulls_left(self) -> int:
        return self._affordable_count("leaf")


class Uniform(_LeafPhased):
    """Uniform allocation: every leaf once per round, in a seeded random order, until the
    budget ends; recommends by empirical mean (leaves never evaluated last)."""

    name = "uniform"

    def _plan(self) -> Generator[Batch, None, None]:
        leaves = self._all_leaves()
        while self._pulls_left() > 0:
            yield "leaf", leaves[:self._pulls_left()]


class SuccessiveElimination(_LeafPhased):
    """Successive elimination (Even-Dar et al., 2006) as a fixed-budget policy.

    Each round evaluates every surviving leaf once (seeded order), then eliminates a leaf
    once ``k`` survivors have a lower confidence bound above its upper one. With ``r``
    evaluations per survivor the radius is ``sigma sqrt(2 log(4 N r^2 / delta) / r)`` (Gaussian
    noise of the declared scale, union over ``N`` leaves and all rounds). It stops when only
    ``k`` leaves survive or the budget ends; eliminated leaves rank after survivors, later
    eliminations first.

    Args:
        delta: confidence level of the eliminations.
        k: how many leaves elimination keeps (the top-``k`` it focuses on).
    """

    name = "successive-elimination"

    def __init__(self, *, delta: float = 0.05, k: int = 1) -> None:
        if not 0.0 < delta < 1.0:
            raise ValueError(f"delta must be in (0, 1), got {delta}")
        self.delta = delta
        self.k = _check_focus(k)

    def _plan(self) -> Generator[Batch, None, None]:
        alive = self._all_leaves()
        n_total = alive.size
        keep = min(self.k, n_total)
        rounds = 0
        while alive.size > keep and self._pulls_left() > 0:
            yield "leaf", alive[:self._pulls_left()]
            if self._pulls_left() == 0 and np.any(self._counts("leaf", alive) <= rounds):
                return  # the last round was cut short: no equal-count comparison
            rounds += 1
            radius = self.spec_.sigma * math.sqrt(
                2.0 * math.log(4.0 * n_total * rounds**2 / self.delta) / rounds)
            means = self._arm_mean("leaf", alive)
            lower, upper = means - radius, means + radius
            kth_lower = np.partition(lower, lower.size - keep)[lower.size - keep]
            out = upper < kth_lower
            if np.any(out):
                self._reject(alive[out], means[out])
                alive = alive[~out]


class SuccessiveRejects(_LeafPhased):
    """Successive rejects (Audibert, Bubeck and Munos, 2010) over all leaves with
    ``n = floor(budget / leaf_cost)`` evaluations: phase ``j`` brings every survivor to
    ``n_j`` evaluations (``sr_schedule``) and rejects the
    empirically worst, until ``k`` leaves remain (``k = 1``: the paper's ``K - 1`` phases).

    Args:
        k: how many leaves the rejections keep.
    """

    name = "successive-rejects"

    def __init__(self, *, k: int = 1) -> None:
        self.k = _check_focus(k)

    def _plan(self) -> Generator[Batch, None, None]:
        yield from self._race("leaf", self._all_leaves(), self._pulls_left(), self.k)


class SequentialHalving(_LeafPhased):
    """Sequential halving (Karnin, Koren and Somekh, 2013).

    ``R = ceil(log2(N / k))`` rounds; round ``r = 0..R-1`` evaluates each of the ``|S_r|``
    survivors ``t_r = floor(n_r / (|S_r| (R - r)))`` times, ``n_r`` the evaluations still
    affordable, and keeps the best ``max(k, ceil(|S_r| / 2))``. At ``r = 0`` this is Karnin
    et al.'s ``floor(n / (|S_r| ceil(log2 N)))``; later rounds also spend the rounding slack
    of earlier ones. When the budget cannot give every survivor one evaluation (``t_r = 0``),
    the survivors get one evaluation each while the budget lasts (the policy then stops).

    Args:
        k: how many leaves the halving keeps.
    """

    name = "sequential-halving"

    def __init__(self, *, k: int = 1) -> None:
        self.k = _check_focus(k)

    def _plan(self) -> Generator[Batch, None, None]:
        alive = self._all_leaves()
        keep = min(self.k, alive.size)
        n_rounds = math.ceil(math.log2(alive.size / keep)) if alive.size > keep else 0
        for r in range(n_rounds):
            per_arm = max(self._pulls_left() // (alive.size * (n_rounds - r)), 1)
            yield "leaf", np.tile(alive, per_arm)
            alive = self._keep_best_means("leaf", alive, max(keep, math.ceil(alive.size / 2)))


class FlatUCB(TreeStatsPolicy):
    """UCB1 over the leaves (Auer et al., 2002), one leaf evaluation per round.

    Evaluates every leaf once in a seeded order, then the leaf maximising
    ``mean + sqrt(c log t / n)`` (``t`` the queries asked so far plus one, ``n`` the leaf's
    asks, so queries in flight count as pulls). ``recommend(k)`` returns the most evaluated
    leaves (ties by empirical mean), the usual recommendation of a regret-play policy.

    Args:
        c: exploration constant (``c = 2`` is UCB1).
    """

    name = "flat-ucb"
    query_kinds = ("leaf",)

    def __init__(self, *, c: float = 2.0) -> None:
        check_nonnegative(c, "c")
        self.c = c

    def _start(self) -> None:
        super()._start()
        self._asked = np.zeros(self.tree_.n_leaves)
        self._first = self._tiebreak.copy()
        self._t = 0

    def _next_query(self) -> Query | None:
        n_leaves = self.tree_.n_leaves
        if self._t < n_leaves:
            leaf = int(self._first[self._t])
        else:
            told = np.maximum(self._leaf_n, 1.0)
            means = np.where(self._leaf_n > 0, self._leaf_sum / told, 0.0)
            index = means + np.sqrt(self.c * math.log(self._t + 1) / self._asked)
            leaf = int(np.argmax(index))
        if not self._affordable("leaf"):
            return None
        self._t += 1
        self._asked[leaf] += 1.0
        return Query("leaf", int(self.tree_.leaf_node[leaf]))

    def recommend(self, k: int = 1) -> np.ndarray:
        self._check_started()
        k = check_k(k, self.tree_.n_leaves)
        with np.errstate(invalid="ignore", divide="ignore"):
            means = np.where(self._leaf_n > 0, self._leaf_sum / self._leaf_n, -np.inf)
        return top_k(k, -self._leaf_n, -means, self._tiebreak)
