"""Certified bias bounds composed up a tree (paper Section 3.3, Corollary 1).

The aggregation bias of a node is ``bias(v) = max_c [f(c) + bias(c)] - f(v)`` over its
children ``c``: the best leaf below ``v`` is the best leaf below one child. So any upper
confidence bound ``U(c) >= mu*(c)`` on the children's best leaves gives
``bias(v) <= max_c U(c) - LCB f(v)``, and ``f(v) = sum_c (m_c / m_v) f(c)`` gives a second lower
bound ``sum_c (m_c / m_v) LCB f(c)``. (With ``U(c) = UCB f(c) + B(c)`` this is the composition
``max_c [UCB f(c) + B(c)] - LCB f(v)``; bounding ``mu*(c)`` directly skips the width of
``f(c)``'s interval.) A node's certified upper bound is the minimum of its own certificate's
and the composed one, its lower bound the maximum, and its certified bias their difference:
still valid, by a union bound over the nodes' certificates, each at level ``node_delta``
(default ``delta / n_nodes``: every node of the tree, so any adaptively chosen set of nodes is
covered, Corollary 1). Narrow cells, where the certificate binds, thereby certify wide ones.

A probe of an internal node or an evaluation of a leaf updates that node's running certificate
(:mod:`canopy.certificate`, any method but ``"paper"``) and then the composed bounds on its path
to the root: O(depth * branching) per observation. Nodes without observations have the
value range as their bounds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numba
import numpy as np

from canopy.certificate import (
    DEFAULT_METHOD,
    N_SETUP,
    S_K,
    S_LOGA_MEAN,
    S_LOGA_MGF,
    S_LOGD_ORD,
    S_SIGMA,
    S_Z,
    _check_samples,
    _check_value,
    check_value_range,
    sharp_bounds,
    sharp_push,
    sharp_setup,
    sharp_width,
)
from canopy.tree import Tree

__all__ = ["CertifiedTree", "combine", "relevel_setup"]


@numba.njit(cache=True)
def combine(own_up: float, own_low: float, kid_up: float, kid_low: float) -> tuple[float, float]:
    """A node's certified ``(upper bound on mu*, lower bound on f)`` from its own certificate
    and its children's composed bounds (``kid_up`` the largest child upper bound, ``kid_low``
    the leaf-weighted sum of the children's lower bounds)."""
    return min(own_up, kid_up), max(own_low, kid_low)


def relevel_setup(setup: np.ndarray, delta: float, method: str) -> np.ndarray:
    """``setup`` with its confidence levels recomputed for level ``delta`` (same grids). The
    betting slices' bets only use the push setup's levels as a tuning constant, so bounds at
    any level are valid on states pushed under another."""
    grid = setup[N_SETUP:N_SETUP + int(setup[S_K])].copy()
    fresh = sharp_setup(float(setup[S_SIGMA]), delta, float(setup[S_Z]), method,
                        grid if grid.size else None)
    out = setup.copy()
    for index in (S_LOGA_MEAN, S_LOGA_MGF, S_LOGD_ORD):
        out[index] = fresh[index]
    return out


@numba.njit(cache=True)
def refresh_path(v: int, own: np.ndarray, up: np.ndarray, low: np.ndarray,
                 parent: np.ndarray, child_ptr: np.ndarray, child_ids: np.ndarray,
                 leaf_lo: np.ndarray, leaf_hi: np.ndarray) -> None:
    """Recompute the composed bounds of ``v`` and its ancestors (unit scale) from the nodes'
    own bounds ``own[:, 0]`` (upper) and ``own[:, 1]`` (lower)."""
    a = v
    while a >= 0:
        m_a = leaf_hi[a] - leaf_lo[a]
        own_up, own_low = own[a, 0], own[a, 1]
        kid_up, kid_low = 1.0, 0.0
        if child_ptr[a + 1] > child_ptr[a]:
            kid_up = -np.inf
            for j in range(child_ptr[a], child_ptr[a + 1]):
                c = child_ids[j]
                kid_up = max(kid_up, up[c])
                kid_low += low[c] * (leaf_hi[c] - leaf_lo[c]) / m_a
        up[a], low[a] = combine(own_up, own_low, kid_up, kid_low)
        a = parent[a]


class CertifiedTree:
    """Per-node running certificates on a :class:`~canopy.tree.Tree`, composed up the tree.

    Args:
        tree: the tree.
        sigma: the noise scale of the observations.
        delta: the total level; each node's certificate gets ``node_delta``.
        method: the certificate method (``"betting"``, ``"order"`` or ``"sharp"``).
        z: the truncation level.
        value_range: the range ``(a, b)`` of the leaf means.
        node_delta: the level of each node's certificate (default ``delta / tree.n_nodes``);
            settable later (:meth:`set_node_delta`), e.g. once a policy knows how many nodes
            it will probe.
    """

    def __init__(self, tree: Tree, sigma: float, *, delta: float = 0.05,
                 method: str = DEFAULT_METHOD, z: float = 3.0,
                 value_range: tuple[float, float] = (0.0, 1.0),
                 node_delta: float | None = None) -> None:
        if not isinstance(tree, Tree):
            raise TypeError(f"tree must be a Tree, got {type(tree).__name__}")
        if method not in ("betting", "order", "sharp"):
            raise ValueError("method must be 'betting', 'order' or 'sharp' (the paper's "
                             f"certificate does not compose), got {method!r}")
        if not 0.0 < delta < 1.0:
            raise ValueError(f"delta must be in (0, 1), got {delta}")
        if not (math.isfinite(sigma) and sigma >= 0):
            raise ValueError(f"sigma must be finite and >= 0, got {sigma}")
        if not (math.isfinite(z) and z > 0):
            raise ValueError(f"z must be finite and > 0, got {z}")
        self.tree, self.method, self.delta, self.z = tree, method, float(delta), float(z)
        self.value_range = check_value_range(value_range)
        self.low, self.width = self.value_range[0], self.value_range[1] - self.value_range[0]
        self.sigma = float(sigma)
        self.node_delta = self._check_node_delta(delta / tree.n_nodes if node_delta is None
                                                 else node_delta)
        self.push_setup = sharp_setup(self.sigma / self.width, self.node_delta, self.z, method)
        self.setup = self.push_setup
        self._row_of = np.full(tree.n_nodes, -1, dtype=np.int64)
        self._states = np.zeros((16, sharp_width(self.push_setup)))
        self._rows = 0
        self._own = np.zeros((tree.n_nodes, 2))
        self._own[:, 0] = 1.0
        self._up = np.ones(tree.n_nodes)
        self._low = np.zeros(tree.n_nodes)
        self._tree_arrays = (tree.parent, tree.child_ptr, tree.child_ids, tree.leaf_lo,
                             tree.leaf_hi)

    @staticmethod
    def _check_node_delta(value: float) -> float:
        if not 0.0 < value < 1.0:
            raise ValueError(f"node_delta must be in (0, 1), got {value}")
        return float(value)

    def set_node_delta(self, node_delta: float) -> None:
        """Change the level of every node's certificate (bounds are recomputed)."""
        self.node_delta = self._check_node_delta(node_delta)
        self.setup = relevel_setup(self.push_setup, self.node_delta, self.method)
        self._recompute()

    def _recompute(self) -> None:
        tree = self.tree
        for node in np.flatnonzero(self._row_of >= 0).tolist():
            self._own[node] = sharp_bounds(self._states[self._row_of[node]], self.setup,
                                         math.log(tree.n_leaves_under(node)))
        for node in np.argsort(-tree.level, kind="stable").tolist():
            kids = tree.children(node)
            kid_up, kid_low = 1.0, 0.0
            if kids.size:
                weights = (tree.leaf_hi[kids] - tree.leaf_lo[kids]) / tree.n_leaves_under(node)
                kid_up, kid_low = float(self._up[kids].max()), float(weights @ self._low[kids])
            self._up[node], self._low[node] = combine(self._own[node, 0], self._own[node, 1],
                                                      kid_up, kid_low)

    def _row(self, node: int) -> int:
        row = int(self._row_of[node])
        if row < 0:
            row = self._rows
            if row == self._states.shape[0]:
                grown = np.zeros((2 * row, self._states.shape[1]))
                grown[:row] = self._states
                self._states = grown
            self._row_of[node] = row
            self._rows += 1
        return row

    def update(self, node: int, value: float) -> None:
        """Add one observation of ``node`` (a probe, or an evaluation if it is a leaf)."""
        node = self.tree.check_node(node)
        x = (_check_value(value) - self.low) / self.width
        row = self._row(node)  # may grow the states array
        state = self._states[row]
        sharp_push(state, x, self.push_setup)
        self._own[node] = sharp_bounds(state, self.setup, math.log(self.tree.n_leaves_under(node)))
        refresh_path(node, self._own, self._up, self._low, *self._tree_arrays)

    def update_many(self, nodes: Sequence[int] | np.ndarray, values: np.ndarray) -> None:
        """Add observations ``values[i]`` of ``nodes[i]`` in order."""
        node_ids = np.asarray(nodes, dtype=np.int64).ravel()
        x = _check_samples(values)
        if node_ids.size != x.size:
            raise ValueError(f"{node_ids.size} nodes for {x.size} values")
        if node_ids.size == 0:
            return
        if node_ids.min() < 0 or node_ids.max() >= self.tree.n_nodes:
            raise IndexError(f"nodes must lie in 0..{self.tree.n_nodes - 1}")
        for node in np.unique(node_ids).tolist():
            self._row(node)
        _push_many(node_ids, (x - self.low) / self.width, self._states, self._row_of,
                   self.push_setup, self.setup, self._own, self._up, self._low,
                   *self._tree_arrays)

    def upper(self, nodes: int | np.ndarray) -> np.ndarray | float:
        """Certified upper bound on the best leaf value below each node."""
        return self._up[nodes] * self.width + self.low

    def lower(self, nodes: int | np.ndarray) -> np.ndarray | float:
        """Certified lower bound on each node's subtree average f(v)."""
        return self._low[nodes] * self.width + self.low

    def bound(self, nodes: int | np.ndarray) -> np.ndarray | float:
        """Certified aggregation-bias bound of each node: ``max(upper - lower, 0)``."""
        return np.maximum(self._up[nodes] - self._low[nodes], 0.0) * self.width

    def n_observations(self, node: int) -> int:
        row = int(self._row_of[self.tree.check_node(node)])
        return 0 if row < 0 else int(self._states[row, 0])


@numba.njit(cache=True)
def _push_many(nodes: np.ndarray, x: np.ndarray, states: np.ndarray, row_of: np.ndarray,
               push_setup: np.ndarray, setup: np.ndarray, own: np.ndarray, up: np.ndarray,
               low: np.ndarray, parent: np.ndarray, child_ptr: np.ndarray,
               child_ids: np.ndarray, leaf_lo: np.ndarray, leaf_hi: np.ndarray) -> None:
    """Push observations in order, refreshing each one's path (one pass per node batch)."""
    for i in range(nodes.size):
        v = nodes[i]
        state = states[row_of[v]]
        sharp_push(state, x[i], push_setup)
        if i + 1 < nodes.size and nodes[i + 1] == v:
            continue  # the next observation is of the same node: refresh once at the end
        own[v, 0], own[v, 1] = sharp_bounds(state, setup, math.log(leaf_hi[v] - leaf_lo[v]))
        refresh_path(v, own, up, low, parent, child_ptr, child_ids, leaf_lo, leaf_hi)
