"""Tree topology: immutable, in flat numpy arrays (paper Section 3.1).

A :class:`Tree` holds node ids ``0 .. n_nodes-1`` (the root is ``0``), each node's parent and
level, its children in CSR form, and the contiguous range ``[leaf_lo, leaf_hi)`` of leaf indices
below it. Leaves are numbered ``0 .. n_leaves-1`` in depth-first (left-to-right) order, so every
subtree owns a contiguous block of leaf indices, and a uniform leaf of a subtree is one integer
draw. Irregular trees are first-class: leaves may sit at different depths, and a probe of a node
draws a uniform leaf of its subtree, whose expectation is the subtree average of Eq. (1).

Trees too large to materialise are served by :class:`LazyTree`, whose nodes are
``(level, index)`` pairs computed on demand.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from canopy.validation import check_count

__all__ = ["LazyTree", "Tree", "inverse_permutation"]


def _as_index_array(values: object, name: str) -> np.ndarray:
    array = np.asarray(values)
    if array.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {array.shape}")
    if array.size and not np.issubdtype(array.dtype, np.integer):
        raise TypeError(f"{name} must hold integers, got dtype {array.dtype}")
    return array.astype(np.int64, copy=False)



def inverse_permutation(permutation: np.ndarray) -> np.ndarray:
    """``out[permutation[i]] = i`` (e.g. the leaf of each row from the row of each leaf)."""
    out = np.empty_like(permutation)
    out[permutation] = np.arange(permutation.size)
    return out

@dataclass(frozen=True, eq=False)
class Tree:
    """Immutable rooted tree in flat arrays; build it with a ``from_*`` constructor or
    :meth:`complete`.

    Attributes:
        parent: parent id of each node, ``-1`` for the root.
        level: depth of each node, ``0`` for the root.
        child_ptr, child_ids: children in CSR form: the children of ``v`` are
            ``child_ids[child_ptr[v]:child_ptr[v + 1]]`` in their given order.
        leaf_lo, leaf_hi: the leaf indices below ``v`` are ``range(leaf_lo[v], leaf_hi[v])``.
        leaf_node: node id of each leaf index; ``node_leaf`` is its inverse (``-1`` for
            internal nodes).
        names: optional label of each leaf (a path, a model name), for users' own trees.
    """

    parent: np.ndarray
    level: np.ndarray
    child_ptr: np.ndarray
    child_ids: np.ndarray
    leaf_lo: np.ndarray
    leaf_hi: np.ndarray
    leaf_node: np.ndarray
    names: tuple[str, ...] | None = field(default=None)
    node_leaf: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        node_leaf = np.full(self.parent.size, -1, dtype=np.int64)
        node_leaf[self.leaf_node] = np.arange(self.leaf_node.size)
        object.__setattr__(self, "node_leaf", node_leaf)
        for array in (self.parent, self.level, self.child_ptr, self.child_ids, self.leaf_lo,
                      self.leaf_hi, self.leaf_node, self.node_leaf):
            array.setflags(write=False)

    # ------------------------------------------------------------------ constructors
    @classmethod
    def complete(cls, branching: int, depth: int) -> Tree:
        """Complete ``branching``-ary tree of ``depth`` levels below the root (``b**D`` leaves).

        Node ids are in level order (heap layout): the children of ``v`` are
        ``b*v + 1 .. b*v + b``; leaf ``i`` is node ``(b**D - 1)/(b - 1) + i``.
        """
        branching, depth = check_count(branching, "branching"), int(depth)
        if depth < 0:
            raise ValueError(f"depth must be >= 0, got {depth}")
        n_leaves = branching**depth
        n_nodes = sum(branching**level for level in range(depth + 1))
        if n_nodes > 50_000_000:
            raise ValueError(
                f"a complete tree with branching={branching}, depth={depth} has {n_nodes} nodes; "
                "use LazyTree for trees too large to materialise"
            )
        ids = np.arange(n_nodes, dtype=np.int64)
        parent = np.where(ids == 0, -1, (ids - 1) // branching)
        level = np.zeros(n_nodes, dtype=np.int64)
        first = 0
        for depth_here in range(depth + 1):
            width = branching**depth_here
            level[first:first + width] = depth_here
            first += width
        n_internal = n_nodes - n_leaves
        child_ptr = np.concatenate([
            np.arange(n_internal + 1, dtype=np.int64) * branching,
            np.full(n_leaves, n_internal * branching, dtype=np.int64),
        ])
        child_ids = np.arange(1, n_nodes, dtype=np.int64)
        span = branching ** (depth - level)
        offset = ids - (branching**level - 1) // max(branching - 1, 1)
        if branching == 1:
            offset = np.zeros(n_nodes, dtype=np.int64)
        leaf_lo = offset * span
        leaf_hi = leaf_lo + span
        leaf_node = np.arange(n_internal, n_nodes, dtype=np.int64)
        return cls(parent, level, child_ptr, child_ids, leaf_lo, leaf_hi, leaf_node)

    @classmethod
    def from_parents(cls, parents: Sequence[int] | np.ndarray,
                     names: Sequence[str] | None = None) -> Tree:
        """Tree from a parent array: ``parents[v]`` is the parent of node ``v``, ``-1`` for the
        single root, which must be node ``0``. Children keep the order of their ids.
        ``names``, if given, labels the leaves in leaf-index order."""
        parent = _as_index_array(parents, "parents")
        n = parent.size
        if n == 0:
            raise ValueError("parents is empty: a tree needs at least a root")
        if parent[0] != -1:
            raise ValueError(f"node 0 must be the root (parent -1), got parent {parent[0]}")
        roots = np.flatnonzero(parent == -1)
        if roots.size != 1:
            raise ValueError(f"a tree has exactly one root, found {roots.size}: nodes {roots[:5]}")
        bad = np.flatnonzero((parent < -1) | (parent >= n))
        if bad.size:
            raise ValueError(f"parent of node {bad[0]} is {parent[bad[0]]}, outside 0..{n - 1}")
        order = np.argsort(parent[1:], kind="stable") + 1
        counts = np.bincount(parent[1:], minlength=n)
        child_ptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        child_ids = order.astype(np.int64)
        level = np.full(n, -1, dtype=np.int64)
        leaf_lo = np.zeros(n, dtype=np.int64)
        leaf_hi = np.zeros(n, dtype=np.int64)
        leaf_nodes: list[int] = []
        level[0] = 0
        stack: list[tuple[int, bool]] = [(0, False)]
        visited = 0
        while stack:
            node, done = stack.pop()
            if done:
                kids = child_ids[child_ptr[node]:child_ptr[node + 1]]
                leaf_hi[node] = leaf_hi[kids[-1]] if kids.size else leaf_lo[node] + 1
                continue
            visited += 1
            leaf_lo[node] = len(leaf_nodes)
            kids = child_ids[child_ptr[node]:child_ptr[node + 1]]
            if kids.size == 0:
                leaf_nodes.append(node)
            stack.append((node, True))
            for kid in kids[::-1]:
                level[kid] = level[node] + 1
                stack.append((int(kid), False))
        if visited != n:
            unreachable = np.flatnonzero(level < 0)
            raise ValueError(
                f"parents has a cycle or a node not connected to the root: node {unreachable[0]}"
            )
        tree_names = _check_names(names, len(leaf_nodes))
        return cls(parent, level, child_ptr, child_ids, leaf_lo, leaf_hi,
                   np.asarray(leaf_nodes, dtype=np.int64), tree_names)

    @classmethod
    def from_paths(cls, paths: Iterable[Sequence[Hashable]],
                   names: Sequence[str] | None = None) -> Tree:
        """Prefix trie: each path (token ids, ``("stem", "physics", "q17")``, ...) is one leaf.

        Every path must end at a leaf: a path that is a proper prefix of another, or a repeat,
        raises ``ValueError``. Leaves keep the order in which their paths were given only
        within each parent; leaf indices follow the trie's depth-first order, and
        :attr:`names` (default: the paths joined by ``/``) labels them.
        """
        paths = [tuple(path) for path in paths]
        if not paths:
            raise ValueError("paths is empty: a tree needs at least one leaf")
        parents = [-1]
        children: list[dict[Hashable, int]] = [{}]
        path_end: list[int] = []
        for number, path in enumerate(paths):
            if not path:
                raise ValueError(f"path {number} is empty")
            node = 0
            for token in path:
                nxt = children[node].get(token)
                if nxt is None:
                    nxt = len(parents)
                    parents.append(node)
                    children.append({})
                    children[node][token] = nxt
                node = nxt
            path_end.append(node)
        if len(set(path_end)) != len(path_end):
            raise ValueError("paths contains a repeated path")
        is_end = np.zeros(len(parents), dtype=bool)
        is_end[path_end] = True
        for number, node in enumerate(path_end):
            if children[node]:
                raise ValueError(f"path {number} {paths[number]!r} is a prefix of another path")
        tree = cls.from_parents(parents)
        by_node = {node: number for number, node in enumerate(path_end)}
        labels = names if names is not None else ["/".join(map(str, p)) for p in paths]
        if len(labels) != len(paths):
            raise ValueError(f"names has {len(labels)} entries for {len(paths)} paths")
        ordered = tuple(str(labels[by_node[int(node)]]) for node in tree.leaf_node)
        return tree.with_names(ordered)

    @classmethod
    def from_features(cls, features: np.ndarray, *, branching: int, depth: int,
                      seed: int | np.random.Generator | None = 0,
                      names: Sequence[str] | None = None) -> Tree:
        """Recursive clustering of feature vectors (one row a leaf) into a tree of the given
        branching and depth: k-means splits each cell into at most ``branching`` parts, down to
        ``depth`` levels. Cells with fewer rows than ``branching`` stop early, and cells still
        larger than one row at ``depth`` get one leaf child per row, so no row is dropped.
        The result records ``row_of_leaf`` and ``leaf_of_row`` to map leaves back to rows."""
        x = np.asarray(features, dtype=float)
        if x.ndim != 2 or x.shape[0] == 0:
            raise ValueError(f"features must be a non-empty 2-D array, got shape {x.shape}")
        if not np.all(np.isfinite(x)):
            raise ValueError("features contain NaN or infinite values")
        branching = check_count(branching, "branching")
        if branching < 2:
            raise ValueError(f"branching must be >= 2 for clustering, got {branching}")
        depth = check_count(depth, "depth")
        rng = np.random.default_rng(seed)
        scale = x.std(axis=0)
        z = (x - x.mean(axis=0)) / np.where(scale > 0, scale, 1.0)
        parents: list[int] = [-1]
        leaf_rows: dict[int, int] = {}

        def split(node: int, rows: np.ndarray, level: int) -> None:
            if rows.size == 1:
                leaf_rows[node] = int(rows[0])
                return
            if level >= depth or rows.size <= branching:
                groups = [rows[i:i + 1] for i in range(rows.size)]
            else:
                groups = _kmeans_groups(z[rows], rows, branching, rng)
            for group in groups:
                child = len(parents)
                parents.append(node)
                split(child, group, level + 1)

        split(0, np.arange(x.shape[0]), 0)
        tree = cls.from_parents(parents)
        rows = np.array([leaf_rows[int(node)] for node in tree.leaf_node], dtype=np.int64)
        labels = None if names is None else [str(names[r]) for r in rows]
        if names is not None and len(names) != x.shape[0]:
            raise ValueError(f"names has {len(names)} entries for {x.shape[0]} rows")
        return _ClusteredTree.wrap(tree, rows, labels)

    # ------------------------------------------------------------------ queries
    @property
    def n_nodes(self) -> int:
        return int(self.parent.size)

    @property
    def n_leaves(self) -> int:
        return int(self.leaf_node.size)

    @cached_property
    def depth(self) -> int:
        return int(self.level.max())

    @cached_property
    def n_children(self) -> np.ndarray:
        """Number of children of each node (0 at leaves); read-only."""
        counts = np.diff(self.child_ptr)
        counts.setflags(write=False)
        return counts

    @cached_property
    def internal_per_level(self) -> np.ndarray:
        """Number of internal nodes at each level (index = level, ``depth + 1`` entries);
        read-only."""
        counts = np.bincount(self.level[self.n_children > 0], minlength=self.depth + 1)
        counts.setflags(write=False)
        return counts

    @property
    def root(self) -> int:
        return 0

    def check_node(self, node: int) -> int:
        node_id = int(node)
        if not 0 <= node_id < self.n_nodes:
            raise IndexError(f"node {node} is out of range 0..{self.n_nodes - 1}")
        return node_id

    def check_leaf(self, leaf: int) -> int:
        leaf_id = int(leaf)
        if not 0 <= leaf_id < self.n_leaves:
            raise IndexError(f"leaf {leaf} is out of range 0..{self.n_leaves - 1}")
        return leaf_id

    def children(self, node: int) -> np.ndarray:
        node = self.check_node(node)
        return self.child_ids[self.child_ptr[node]:self.child_ptr[node + 1]]

    def is_leaf(self, node: int) -> bool:
        node = self.check_node(node)
        return bool(self.child_ptr[node] == self.child_ptr[node + 1])

    def n_leaves_under(self, node: int) -> int:
        node = self.check_node(node)
        return int(self.leaf_hi[node] - self.leaf_lo[node])

    def leaves_under(self, node: int) -> range:
        node = self.check_node(node)
        return range(int(self.leaf_lo[node]), int(self.leaf_hi[node]))

    def path_to_root(self, node: int) -> list[int]:
        """Node ids from ``node`` up to the root, inclusive."""
        node = self.check_node(node)
        path = [node]
        while self.parent[node] >= 0:
            node = int(self.parent[node])
            path.append(node)
        return path

    def nodes_at_level(self, level: int) -> np.ndarray:
        return np.flatnonzero(self.level == level)

    def subtree_means(self, leaf_values: np.ndarray) -> np.ndarray:
        """Eq. (1): the average of ``leaf_values`` over the leaves below every node."""
        values = np.asarray(leaf_values, dtype=float)
        if values.shape != (self.n_leaves,):
            raise ValueError(f"leaf_values has shape {values.shape}, expected ({self.n_leaves},)")
        cumulative = np.concatenate([[0.0], np.cumsum(values)])
        return (cumulative[self.leaf_hi] - cumulative[self.leaf_lo]) / (self.leaf_hi - self.leaf_lo)

    def subtree_max(self, leaf_values: np.ndarray) -> np.ndarray:
        """The largest of ``leaf_values`` below every node."""
        values = np.asarray(leaf_values, dtype=float)
        out = np.empty(self.n_nodes)
        out[self.leaf_node] = values
        for node in np.argsort(-self.level, kind="stable"):
            kids = self.child_ids[self.child_ptr[node]:self.child_ptr[node + 1]]
            if kids.size:
                out[node] = out[kids].max()
        return out

    def with_names(self, names: Sequence[str] | None) -> Tree:
        """The same topology with leaf labels."""
        return Tree(self.parent, self.level, self.child_ptr, self.child_ids, self.leaf_lo,
                    self.leaf_hi, self.leaf_node, _check_names(names, self.n_leaves))

    def __repr__(self) -> str:
        return f"Tree(n_nodes={self.n_nodes}, n_leaves={self.n_leaves}, depth={self.depth})"


@dataclass(frozen=True, eq=False, repr=False)
class _ClusteredTree(Tree):
    """A :class:`Tree` built from feature rows; ``row_of_leaf[i]`` is the input row of leaf
    ``i`` and ``leaf_of_row[r]`` the leaf index of row ``r``."""

    row_of_leaf: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))

    @classmethod
    def wrap(cls, tree: Tree, rows: np.ndarray, names: Sequence[str] | None) -> _ClusteredTree:
        return cls(tree.parent, tree.level, tree.child_ptr, tree.child_ids, tree.leaf_lo,
                   tree.leaf_hi, tree.leaf_node, _check_names(names, tree.n_leaves), rows)

    @property
    def leaf_of_row(self) -> np.ndarray:
        return inverse_permutation(self.row_of_leaf)

    def with_names(self, names: Sequence[str] | None) -> _ClusteredTree:
        return _ClusteredTree.wrap(self, self.row_of_leaf, names)


@dataclass(frozen=True)
class LazyTree:
    """Complete ``arity``-ary tree of unbounded (or very large) depth, expanded on demand.

    A node is a ``(level, index)`` pair with ``0 <= index < arity**level``; it covers the
    interval ``[index / arity**level, (index + 1) / arity**level)`` of ``[0, 1)``, so the
    leaves of an infinite tree are the points of ``[0, 1)`` and a probe draws a uniform point of
    the node's interval. Nothing is stored per node.

    ``dims`` declares the cells' geometry: with ``dims = d`` the interval is the Morton code of
    a box in ``d`` dimensions, each level splitting the box in ``arity`` along the dimensions in
    turn; :meth:`centre` then finds the box's centre (with ``d = 1``, the interval's middle).
    """

    arity: int
    max_depth: int | None = None
    dims: int = 1

    def __post_init__(self) -> None:
        check_count(self.arity, "arity")
        if self.arity < 2:
            raise ValueError(f"arity must be >= 2, got {self.arity}")
        if self.max_depth is not None and self.max_depth < 0:
            raise ValueError(f"max_depth must be >= 0 or None, got {self.max_depth}")
        check_count(self.dims, "dims")

    root: tuple[int, int] = (0, 0)

    def children(self, node: tuple[int, int]) -> list[tuple[int, int]]:
        level, index = self.check_node(node)
        if self.max_depth is not None and level >= self.max_depth:
            return []
        return [(level + 1, index * self.arity + j) for j in range(self.arity)]

    def is_leaf(self, node: tuple[int, int]) -> bool:
        level, _ = self.check_node(node)
        return self.max_depth is not None and level >= self.max_depth

    def interval(self, node: tuple[int, int]) -> tuple[float, float]:
        level, index = self.check_node(node)
        width = float(self.arity) ** -level
        return index * width, (index + 1) * width

    def centre(self, node: tuple[int, int], level: int) -> tuple[int, int]:
        """The descendant of ``node`` at ``level`` whose cell holds the centre of ``node``'s
        box (its lowest corner, for an even arity). Below the node the centre's base-``arity``
        digits are ``arity // 2`` along each of the ``dims`` dimensions once, then ``0`` for
        an even arity (``arity // 2`` again for an odd one); digits interleave by dimension.
        """
        top, index = self.check_node(node)
        below = level - top
        if below < 0:
            raise ValueError(f"level {level} is above node {node!r}")
        span = self.arity**below
        if self.arity % 2:
            return level, index * span + span // 2
        rest = self.arity ** max(below - self.dims, 0)
        return level, index * span + self.arity // 2 * (span - rest) // (self.arity - 1)

    def n_nodes_to_level(self, level: int) -> int:
        """Nodes in the complete tree down to ``level`` inclusive."""
        return (self.arity ** (level + 1) - 1) // (self.arity - 1)

    def check_node(self, node: tuple[int, int]) -> tuple[int, int]:
        try:
            level, index = (int(node[0]), int(node[1]))
        except (TypeError, IndexError, ValueError):
            raise TypeError(f"a LazyTree node is a (level, index) pair, got {node!r}") from None
        if level < 0 or not 0 <= index < self.arity**level:
            raise IndexError(f"node {node!r} is outside the tree")
        if self.max_depth is not None and level > self.max_depth:
            raise IndexError(f"node {node!r} is below max_depth={self.max_depth}")
        return level, index


def _check_names(names: Sequence[str] | None, n_leaves: int) -> tuple[str, ...] | None:
    if names is None:
        return None
    labels = tuple(str(name) for name in names)
    if len(labels) != n_leaves:
        raise ValueError(f"names has {len(labels)} entries for {n_leaves} leaves")
    return labels


def _kmeans_groups(points: np.ndarray, rows: np.ndarray, k: int,
                   rng: np.random.Generator) -> list[np.ndarray]:
    """Split ``rows`` into at most ``k`` non-empty groups by k-means on ``points``; identical
    points (or a split that collapses to one group) fall back to even chunks."""
    from scipy.cluster.vq import kmeans2

    if np.unique(points, axis=0).shape[0] >= k:
        _, labels = kmeans2(points, k, minit="++", rng=rng, missing="raise")
        groups = [rows[labels == g] for g in range(k) if np.any(labels == g)]
        if len(groups) > 1:
            return groups
    return [chunk for chunk in np.array_split(rows, k) if chunk.size]
