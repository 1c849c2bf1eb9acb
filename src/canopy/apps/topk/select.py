"""Choose the top ``k`` of a pool under a cost budget with one of six methods.

Three tree-aware methods (paper Section 4, "Top-k identification": the data-driven spread,
discontinuity targeting, and the certificate's pre-pass charged to the budget):

- ``canopy``: :class:`~canopy.policies.TopKBeam` with ``spread="hybrid"`` (the assumed
  schedule ``L rho^l`` with ``L`` estimated by the charged pre-pass, relaxed to the certificate
  in cells the violation test flags), ``lipschitz=None``, ``prepass=True``, focused on ``k``;
- ``canopy-certified``: the same beam with ``spread="certified"`` (Algorithm 1's bound in
  every cell, no violation test);
- ``canopy-edge``: :class:`~canopy.policies.EdgeTargeted` (violation detection, successive
  rejects over the smooth cells at probe cost, leaf evaluations targeted at flagged cells),
  pre-pass charged, focused on ``k``.

Three structure-blind baselines evaluate leaves only: ``successive-elimination``, ``uniform``,
``sequential-halving`` (the first and last focused on ``k``). Policies are imported lazily
from :mod:`canopy.policies`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from canopy.apps.topk.problem import PoolProblem
from canopy.policies.base import Policy
from canopy.run import run

__all__ = ["METHODS", "Selection", "captured", "make_policy", "select_top_k", "tied_recall"]


def _canopy(k: int) -> Policy:
    from canopy.policies import TopKBeam

    return TopKBeam(spread="hybrid", lipschitz=None, prepass=True, width=20, k=k)


def _canopy_certified(k: int) -> Policy:
    from canopy.policies import TopKBeam

    return TopKBeam(spread="certified", lipschitz=None, prepass=True, width=20, k=k)


def _canopy_edge(k: int) -> Policy:
    from canopy.policies import EdgeTargeted

    return EdgeTargeted(lipschitz=None, k=k)


def _successive_elimination(k: int) -> Policy:
    from canopy.policies import SuccessiveElimination

    return SuccessiveElimination(k=k)


def _uniform(k: int) -> Policy:
    from canopy.policies import Uniform

    return Uniform()


def _sequential_halving(k: int) -> Policy:
    from canopy.policies import SequentialHalving

    return SequentialHalving(k=k)


#: Method name -> factory of a fresh policy focused on the top ``k``.
METHODS: dict[str, Callable[[int], Policy]] = {
    "canopy": _canopy,
    "canopy-certified": _canopy_certified,
    "canopy-edge": _canopy_edge,
    "successive-elimination": _successive_elimination,
    "uniform": _uniform,
    "sequential-halving": _sequential_halving,
}


def make_policy(method: str, *, k: int) -> Policy:
    """A fresh policy for ``method`` (one of :data:`METHODS`)."""
    try:
        factory = METHODS[method]
    except KeyError:
        raise ValueError(f"unknown method {method!r}; known: {', '.join(METHODS)}") from None
    return factory(k)


@dataclass(frozen=True)
class Selection:
    """The outcome of :func:`select_top_k`.

    Attributes:
        method: the method's name.
        names: the chosen candidates, best first.
        rows: their pool rows.
        budget, spent: the cost budget and what was spent (never above the budget).
        n_probes, n_leaf_evals: queries of each kind.
        recall: recall@k against the pool's own target column (the table's truth), counting
            ties: see :func:`tied_recall`.
        captured: how far the picks' mean target goes from the pool's mean (0, a random
            choice) to the true top ``k``'s mean (1): informative where recall is 0 because
            many candidates sit within noise of the ``k``-th.
    """

    method: str
    names: tuple[str, ...]
    rows: tuple[int, ...]
    budget: float
    spent: float
    n_probes: int
    n_leaf_evals: int
    recall: float
    captured: float


def tied_recall(picked_rows: np.ndarray, scores: np.ndarray, k: int) -> float:
    """recall@k when scores tie at the ``k``-th place: the best recall over the ways of
    breaking the tie, ``(hits above the k-th score + min(hits at it, k - number above)) / k``.
    Without a tie at the ``k``-th place this is :func:`canopy.metrics.recall_at_k`; with one
    (the leaderboard reports one decimal, so its 10th and 11th best MMLU scores are equal) it
    does not depend on how the table happens to order equal scores."""
    values = np.asarray(scores, dtype=float)
    picked = np.unique(np.asarray(picked_rows, dtype=np.int64))
    if picked.size > k:
        raise ValueError(f"{picked.size} picks for a top-{k} question")
    kth = np.sort(values)[::-1][k - 1]
    above = int(np.count_nonzero(values > kth))
    hits_above = int(np.count_nonzero(values[picked] > kth))
    hits_tied = int(np.count_nonzero(values[picked] == kth))
    return (hits_above + min(hits_tied, k - above)) / k


def select_top_k(problem: PoolProblem, *, k: int, budget: float, method: str = "canopy",
                 seed: int = 0) -> Selection:
    """Run ``method`` on ``problem`` with ``budget`` and return its top-``k`` choice."""
    problem.pool.top_rows(k)  # validates k against the pool's size
    policy = make_policy(method, k=k)
    result = run(policy, problem, budget=budget, seed=seed, k=k)
    leaves = np.asarray(result.recommendation, dtype=np.int64)
    rows = problem.pool_tree.row_of_leaf[leaves]
    return Selection(method=method, names=tuple(problem.names_of(leaves)),
                     rows=tuple(int(r) for r in rows), budget=float(budget),
                     spent=float(result.spent), n_probes=int(result.n_probes),
                     n_leaf_evals=int(result.n_leaf_evals),
                     recall=tied_recall(rows, problem.pool.target, k),
                     captured=captured(rows, problem.pool.target, k))


def captured(picked_rows: np.ndarray, scores: np.ndarray, k: int) -> float:
    """``(mean of the picks - mean of all) / (mean of the true top k - mean of all)``: 1 for
    the top ``k``, about 0 for a random choice (``nan`` when every score is equal)."""
    values = np.asarray(scores, dtype=float)
    best = np.sort(values)[::-1][:k].mean()
    gap = best - values.mean()
    if gap <= 0:
        return float("nan")
    return float((values[np.asarray(picked_rows, dtype=np.int64)].mean() - values.mean()) / gap)
