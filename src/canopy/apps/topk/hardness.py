"""How hard a pool's top-k question is, and how the tree holds its answer.

- :func:`top_k_complexity`: the fixed-budget top-``k`` complexity
  ``H = sum_i sigma^2 / Delta_i^2`` (Bubeck, Wang and Viswanathan 2013; Audibert et al. 2010
  for ``k = 1``), ``Delta_i`` the distance of candidate ``i``'s score to the midpoint between
  the ``k``-th best score and the next lower one. Structure-blind methods need on the order of
  ``H`` (times a log factor) leaf evaluations for a high recall. Candidates tied with the
  ``k``-th score (when several share it) are left out: either choice among them scores the
  same recall (:func:`~canopy.apps.topk.select.tied_recall`).
- :func:`top_k_cells`: how many cells at each level hold the true top ``k`` (ties at the
  ``k``-th score included). A descent that keeps ``w`` cells per level can hold them all only
  when this count stays at most ``w``; one cell at level 1 is the most favourable shape.
"""

from __future__ import annotations

import numpy as np

from canopy.apps.topk.variance import level_ancestors
from canopy.tree import Tree
from canopy.validation import check_count

__all__ = ["top_k_cells", "top_k_complexity"]


def _kth(values: np.ndarray, k: int) -> float:
    check_count(k, "k", high=values.size - 1)
    return float(np.sort(values)[::-1][k - 1])


def top_k_complexity(values: np.ndarray, k: int, sigma: float = 0.5) -> float:
    """``H = sum_i sigma^2 / Delta_i^2``, leaving out the candidates at the ``k``-th score when
    several share it (``inf`` when every candidate below the ``k``-th ties with it)."""
    scores = np.asarray(values, dtype=float)
    kth = _kth(scores, k)
    lower = scores[scores < kth]
    if lower.size == 0:
        return float("inf")
    middle = 0.5 * (kth + lower.max())
    tied = scores == kth
    gaps = np.abs(scores[~tied] - middle) if tied.sum() > 1 else np.abs(scores - middle)
    return float(np.sum(sigma * sigma / gaps**2))


def top_k_cells(tree: Tree, leaf_values: np.ndarray, k: int) -> tuple[int, ...]:
    """Distinct cells at levels ``1 .. depth`` holding the leaves whose value is at least the
    ``k``-th best (one per level; a leaf shallower than the level is its own cell)."""
    values = np.asarray(leaf_values, dtype=float)
    if values.shape != (tree.n_leaves,):
        raise ValueError(f"leaf_values has shape {values.shape}, expected ({tree.n_leaves},)")
    top = tree.leaf_node[values >= _kth(values, k)]
    counts = [int(np.unique(ancestor).size) for _, ancestor in level_ancestors(tree, top)]
    return tuple(counts[::-1])
