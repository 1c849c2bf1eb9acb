"""Pool trees (paper Section 4: "a branching-10, depth-3 tree of similar models").

Two ways to arrange a :class:`~canopy.apps.topk.pools.Pool` as a tree whose leaves are its
candidates:

- :func:`tree_from_features`: recursive k-means on the candidates' *other* scores (never the
  target) to a chosen branching and depth, through :meth:`canopy.Tree.from_features`. A pool
  larger than ``branching**depth`` is not truncated: a cell still holding several candidates at
  ``depth`` gets one leaf per candidate one level further down, and :attr:`PoolTree.n_deeper`
  counts those leaves.
- :func:`tree_from_families`: the hierarchy the data already has (``family -> model -> run``),
  through :meth:`canopy.Tree.from_paths`.

Both return a :class:`PoolTree`: the tree plus the map between leaf indices and pool rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from canopy.apps.topk.pools import Pool
from canopy.tree import Tree, inverse_permutation

__all__ = ["PoolTree", "tree_from_families", "tree_from_features"]


@dataclass(frozen=True, eq=False)
class PoolTree:
    """A tree over a pool's candidates.

    Attributes:
        tree: the topology; its leaf names are the candidates' names.
        row_of_leaf: pool row of each leaf index.
        description: how it was built (for tables and the CLI).
        depth: the depth asked for (clustering) or the number of hierarchy levels + 1.
    """

    tree: Tree
    row_of_leaf: np.ndarray
    description: str
    depth: int

    def __post_init__(self) -> None:
        rows = np.asarray(self.row_of_leaf, dtype=np.int64)
        if rows.shape != (self.tree.n_leaves,) or not np.array_equal(
                np.sort(rows), np.arange(rows.size)):
            raise ValueError("row_of_leaf must be a permutation of the pool's rows")
        rows.setflags(write=False)
        object.__setattr__(self, "row_of_leaf", rows)

    @property
    def leaf_of_row(self) -> np.ndarray:
        return inverse_permutation(self.row_of_leaf)

    @property
    def n_deeper(self) -> int:
        """Leaves below the requested depth (a pool larger than the tree's capacity)."""
        leaf_levels = self.tree.level[self.tree.leaf_node]
        return int(np.count_nonzero(leaf_levels > self.depth))

    def by_leaf(self, per_row: np.ndarray) -> np.ndarray:
        """Reorder an array indexed by pool row into leaf order."""
        return np.asarray(per_row)[self.row_of_leaf]


def tree_from_features(pool: Pool, *, columns: Sequence[str] | None = None,
                       branching: int = 10, depth: int = 3,
                       seed: int | np.random.Generator | None = 0) -> PoolTree:
    """Recursive clustering of the candidates' feature columns (all of them by default;
    standardised per column by :meth:`Tree.from_features`) into ``branching`` parts per level,
    ``depth`` levels deep."""
    features = pool.feature_matrix(columns)
    if features.shape[1] == 0:
        raise ValueError(f"pool {pool.name!r} has no feature columns to cluster on; "
                         "build its tree from families instead")
    tree = Tree.from_features(features, branching=branching, depth=depth, seed=seed,
                              names=pool.names)
    used = ", ".join(columns if columns is not None else pool.feature_names)
    return PoolTree(tree, tree.row_of_leaf, f"k-means on {used}, b={branching}, D={depth}",
                    depth)


def tree_from_families(pool: Pool, levels: Sequence[str]) -> PoolTree:
    """The tree ``level_1 -> level_2 -> ... -> candidate`` from the pool's group columns,
    outermost first (e.g. ``("family", "model")``)."""
    if not levels:
        raise ValueError("levels is empty: name at least one group column")
    for level in levels:
        if level not in pool.groups:
            known = ", ".join(pool.groups) or "none"
            raise ValueError(f"pool {pool.name!r} has no group column {level!r}; known: {known}")
    paths = [(*(pool.groups[level][row] for level in levels), pool.names[row])
             for row in range(pool.size)]
    tree = Tree.from_paths(paths, names=[str(row) for row in range(pool.size)])
    rows = np.array([int(label) for label in tree.names or ()], dtype=np.int64)
    return PoolTree(tree.with_names([pool.names[r] for r in rows]), rows,
                    "families: " + " -> ".join(levels), len(levels) + 1)
