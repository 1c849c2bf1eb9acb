"""Instance families of the paper's synthetic studies (Section 3.1, Appendix D).

Every generator takes an explicit seed and returns a :class:`~canopy.problem.LeafMeans` (or a
:class:`~canopy.problem.FunctionOnInterval` for the infinite-depth family), with
``rho = 1 / branching`` as Section 3.1 chooses.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from canopy.problem import FunctionOnInterval, LeafMeans
from canopy.tree import LazyTree, Tree

__all__ = [
    "Planted",
    "garland",
    "heterogeneous_smoothness",
    "infinite_depth",
    "piecewise_lipschitz",
    "tree_lipschitz",
    "tree_lipschitz_values",
]


def tree_lipschitz_values(tree: Tree, lipschitz: float, rng: np.random.Generator, *,
                          branching: int, center: float = 0.5) -> np.ndarray:
    """Leaf means whose oscillation inside every level-``l`` subtree is at most
    ``lipschitz * rho**l`` (``rho = 1/branching``): each node adds to its parent's value an
    offset uniform in ``+-c L rho**level`` with ``c = (1 - rho) / (2 rho)`` capped at 1/2, so the
    offsets below level ``l`` sum to at most ``L rho**l / 2`` either way. Clipped to [0, 1]
    (clipping is 1-Lipschitz, so the bound survives)."""
    rho = 1.0 / branching
    scale = min((1.0 - rho) / (2.0 * rho), 0.5) * lipschitz
    value = np.empty(tree.n_nodes)
    value[0] = center
    order = np.argsort(tree.level, kind="stable")
    offsets = rng.uniform(-1.0, 1.0, size=tree.n_nodes) * scale * rho ** tree.level.astype(float)
    for node in order[1:]:
        value[node] = value[tree.parent[node]] + offsets[node]
    return np.clip(value[tree.leaf_node], 0.0, 1.0)


def tree_lipschitz(branching: int, depth: int, *, lipschitz: float = 1.0, sigma: float = 0.1,
                   probe_cost: float = 1.0, leaf_cost: float = 1.0,
                   seed: int | np.random.Generator = 0) -> LeafMeans:
    """Tree-Lipschitz instance with constant ``lipschitz`` and ``rho = 1/branching``."""
    rng = np.random.default_rng(seed)
    tree = Tree.complete(branching, depth)
    means = tree_lipschitz_values(tree, lipschitz, rng, branching=branching)
    return LeafMeans(tree, means, sigma=sigma, probe_cost=probe_cost, leaf_cost=leaf_cost)


@dataclass(frozen=True)
class Planted:
    """A piecewise instance and its truth: the leaves carrying a discontinuity and the
    penultimate-level cells that contain them."""

    problem: LeafMeans
    spike_leaves: np.ndarray
    violation_cells: np.ndarray


def piecewise_lipschitz(branching: int, depth: int, n_discontinuities: int, *,
                        lipschitz: float = 0.5, base: float = 0.4, jump: float = 0.3,
                        sigma: float = 0.1, probe_cost: float = 1.0, leaf_cost: float = 1.0,
                        seed: int | np.random.Generator = 0) -> Planted:
    """Tree-Lipschitz backbone (centred at ``base``, constant ``lipschitz``) with ``K`` planted
    discontinuities: ``K`` distinct penultimate-level cells each get one leaf lifted *above
    the backbone's maximum*, the ``k``-th (``k = 0..K-1``) to ``max(backbone) + jump * (1 -
    k / (2K))`` (clipped to 1). Each spike breaks smoothness in its cell and every ancestor
    (``K * depth`` cells at most); the best leaf is spike 0, hidden by an innocuous cell
    average, and spikes get closer in value as ``K`` grows, so identification degrades toward
    the structure-blind regime (Appendix D, "Graceful degradation")."""
    rng = np.random.default_rng(seed)
    tree = Tree.complete(branching, depth)
    means = tree_lipschitz_values(tree, lipschitz, rng, branching=branching, center=base)
    cells = tree.nodes_at_level(max(depth - 1, 0))
    if not 0 <= n_discontinuities <= cells.size:
        raise ValueError(f"n_discontinuities must be in 0..{cells.size}, got {n_discontinuities}")
    chosen = rng.choice(cells, size=n_discontinuities, replace=False)
    top = means.max()
    spikes = np.empty(n_discontinuities, dtype=np.int64)
    for k, cell in enumerate(chosen):
        leaf = int(rng.integers(tree.leaf_lo[cell], tree.leaf_hi[cell]))
        means[leaf] = min(top + jump * (1.0 - k / (2.0 * n_discontinuities)), 1.0)
        spikes[k] = leaf
    problem = LeafMeans(tree, means, sigma=sigma, probe_cost=probe_cost, leaf_cost=leaf_cost)
    return Planted(problem, spikes, np.sort(chosen))


def heterogeneous_smoothness(branching: int, depth: int, *, smooth_lipschitz: float = 0.2,
                             rough_lipschitz: float = 3.0, sigma: float = 0.1,
                             seed: int | np.random.Generator = 0) -> LeafMeans:
    """One smooth half, one rough half: the root's first ``branching // 2`` subtrees are
    tree-Lipschitz with ``smooth_lipschitz``, the rest with ``rough_lipschitz`` (clipped to
    [0, 1]), so no single global constant fits both."""
    rng = np.random.default_rng(seed)
    tree = Tree.complete(branching, depth)
    smooth = tree_lipschitz_values(tree, smooth_lipschitz, rng, branching=branching)
    rough = tree_lipschitz_values(tree, rough_lipschitz, rng, branching=branching)
    half = (branching // 2) * branching ** (depth - 1) if depth > 0 else 0
    means = np.concatenate([smooth[:half], rough[half:]])
    return LeafMeans(tree, means, sigma=sigma)


def garland(x: np.ndarray) -> np.ndarray:
    """The garland function ``4x(1-x)(3/4 + (1 - |sin(60 x)|)/4)`` on [0, 1], a standard
    infinite-depth benchmark of X-armed bandits (many local optima, values in [0, 1])."""
    x = np.asarray(x, dtype=float)
    return 4.0 * x * (1.0 - x) * (0.75 + 0.25 * (1.0 - np.abs(np.sin(60.0 * x))))


def infinite_depth(arity: int = 3, *, sigma: float = 0.1) -> FunctionOnInterval:
    """The infinite-depth family: the garland function on a lazily expanded ``arity``-ary
    tree of unbounded depth."""
    return FunctionOnInterval(LazyTree(arity), garland, sigma=sigma)
