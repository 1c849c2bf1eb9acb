"""Top-k identification over a pool as a multi-fidelity :class:`~canopy.problem.Problem`.

Evaluating a leaf (a candidate) returns one noisy outcome of the target benchmark: a Bernoulli
draw with the candidate's accuracy, or, where the pool has real per-item outcomes, the outcome
of one uniformly random item of that candidate. Probing an internal node evaluates a uniformly
random candidate beneath it, so the probe's mean is the node's subtree average of Eq. (1), as
in Section 3.1. A probe costs ``probe_cost`` (0.05 of a leaf evaluation in the paper).

Noise. Outcomes lie in ``[0, 1]``, not ``mean + N(0, sigma^2)``. The spec declares
``value_range=(0, 1)`` and ``sigma=0.5`` by default: any ``[0, 1]`` variable is sub-Gaussian
with proxy ``1/2`` (Hoeffding's lemma), so confidence radii built on ``sigma`` stay valid. The
certificate of Algorithm 1 assumes *Gaussian* noise: it subtracts the noise's log-moment
``lambda^2 sigma^2 / 2`` exactly. For a Bernoulli outcome the noise's log-moment is at most that
(the sub-Gaussian bound) but can be smaller (accuracies away from 1/2), so the deconvolution can
over-correct and the bound can fall below the true aggregation bias. On these pools the
certificate is therefore a data-driven heuristic, not a guarantee; Theorem 1's coverage is not
claimed here.
"""

from __future__ import annotations

import numpy as np

from canopy.apps.topk.pools import Pool
from canopy.apps.topk.trees import PoolTree
from canopy.problem import ProblemSpec
from canopy.tree import Tree

__all__ = ["PoolProblem"]


class PoolProblem:
    """The :class:`~canopy.problem.Problem` of a pool arranged as a tree.

    Args:
        pool: the candidates.
        pool_tree: their tree (:func:`~canopy.apps.topk.trees.tree_from_features` or
            :func:`~canopy.apps.topk.trees.tree_from_families`).
        probe_cost, leaf_cost: the two costs (budgets are costs).
        sigma: the sub-Gaussian proxy declared to policies (see the module docstring).
        outcomes: ``"items"`` (real per-item outcomes; the pool must have them),
            ``"bernoulli"`` (a draw with the target score), or ``"auto"`` (items if present).

    The truth, for scoring only: ``means`` (target by leaf index), :meth:`top_k`.
    """

    def __init__(self, pool: Pool, pool_tree: PoolTree, *, probe_cost: float = 0.05,
                 leaf_cost: float = 1.0, sigma: float = 0.5, outcomes: str = "auto") -> None:
        if pool_tree.tree.n_leaves != pool.size:
            raise ValueError(f"the tree has {pool_tree.tree.n_leaves} leaves for a pool of "
                             f"{pool.size} candidates")
        if outcomes not in ("auto", "items", "bernoulli"):
            raise ValueError(f"outcomes must be 'auto', 'items' or 'bernoulli', got {outcomes!r}")
        if outcomes == "items" and pool.items is None:
            raise ValueError(f"pool {pool.name!r} has no per-item outcomes")
        self.pool = pool
        self.pool_tree = pool_tree
        self.outcomes = "items" if outcomes == "auto" and pool.items is not None else (
            "bernoulli" if outcomes == "auto" else outcomes)
        self.spec = ProblemSpec(pool_tree.tree, float(sigma), float(probe_cost),
                                float(leaf_cost), value_range=(0.0, 1.0))
        self.means = pool_tree.by_leaf(pool.target)
        self.means.setflags(write=False)
        if self.outcomes == "items":
            items = pool_tree.by_leaf(pool.items)
            present = ~np.isnan(items)
            self._counts = present.sum(axis=1)
            # present outcomes packed to the left of each row: item j < count is valid
            order = np.argsort(~present, axis=1, kind="stable")
            self._packed = np.take_along_axis(np.nan_to_num(items), order, axis=1)

    @property
    def tree(self) -> Tree:
        return self.pool_tree.tree

    def top_k(self, k: int) -> np.ndarray:
        """Leaf indices of the ``k`` best candidates, best first (ties by pool row)."""
        return self.pool_tree.leaf_of_row[self.pool.top_rows(k)]

    def names_of(self, leaves: np.ndarray) -> list[str]:
        """Candidate names of leaf indices."""
        return [self.pool.names[int(self.pool_tree.row_of_leaf[leaf])] for leaf in leaves]

    def _outcome(self, leaf: int, rng: np.random.Generator) -> float:
        if self.outcomes == "items":
            return float(self._packed[leaf, rng.integers(self._counts[leaf])])
        return float(rng.random() < self.means[leaf])

    def probe(self, node: int, rng: np.random.Generator) -> float:
        """One outcome of a uniform random candidate below ``node``."""
        tree = self.spec.tree
        node = tree.check_node(node)
        return self._outcome(int(rng.integers(tree.leaf_lo[node], tree.leaf_hi[node])), rng)

    def evaluate(self, leaf: int, rng: np.random.Generator) -> float:
        """One outcome of candidate ``leaf`` (a leaf index)."""
        return self._outcome(self.spec.tree.check_leaf(leaf), rng)
