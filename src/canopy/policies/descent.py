"""Regret play by optimistic descent (paper Section 3.2, Eqs. 4-6; Section 3.3; Thm 3).

Each round descends the explored tree from the root along the child of largest
``B(v) = min(U(v), max_children B)`` with ``U(v) = mean(v) + c sqrt(2 ln t / T(v)) + spread(v)``
(Eq. 4), plays (probes) the explored leaf it reaches, and folds the observation back along the
path. The explored tree grows by the expand rule; ``spread(v)`` is the bias bonus.

Choices the paper leaves open, fixed here:

- ``T(v)`` and ``mean(v)`` count the node's *own* probes only (HCT-style), so ``mean(v)``
  estimates the subtree average f(v) of Eq. (1) without bias and the certificate sees uniform
  random-path probes. (:class:`~canopy.policies.hoo.HOO` keeps HOO's path statistics.)
- ``t`` in ``ln t`` is the number of observations told so far; ``U`` and ``B`` are refreshed
  only on the played path, so off-path values are stale between visits (as in HCT).
- Ties in ``B`` (unplayed children all have ``B = +inf``) go to the first child: the policy
  makes no random choice, and the seed only matters through the problem's noise.
- Children are allocated as a block when a node is split; ``n_stored_`` counts allocated rows,
  played or not. A split node keeps its statistics and keeps bounding its subtree through
  ``B = min(U, ...)``, but is no longer played itself.
- Eq. (6) is used as written, ``T(v) >= c^2 ln t / spread(v)^2`` (the radius of Eq. 4 carries a
  factor 2 that Eq. 6 drops).
- Asynchronous use: ``ask`` without an intervening ``tell`` repeats the current descent.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

import numpy as np

from canopy.certificate import default_lambdas
from canopy.policies import _explored as ex
from canopy.policies.base import Policy, check_k
from canopy.problem import ProblemSpec, Query
from canopy.tree import LazyTree, Tree

__all__ = ["MemoryBoundedDescent", "OptimisticDescent", "per_round_overhead_us"]

_SPREADS = {"assumed": ex.ASSUMED, "certified": ex.CERTIFIED, "hybrid": ex.HYBRID}
_EXPANDS = {"refine": ex.REFINE, "always": ex.ALWAYS, "fixed": ex.FIXED}
_INITIAL_CAPACITY = 64
_EMPTY = np.zeros(1, dtype=np.int64)


def check_positive(value: float, name: str) -> float:
    """A finite number > 0, or a ``ValueError``/``TypeError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be finite and > 0, got {value}")
    return float(value)


def check_rho(rho: float | None, name: str = "rho") -> float | None:
    """``None`` (meaning ``1/branching``) or a number in (0, 1)."""
    if rho is None:
        return None
    if isinstance(rho, bool) or not isinstance(rho, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a number or None, got {type(rho).__name__}")
    if not 0.0 < rho < 1.0:
        raise ValueError(f"{name} must be in (0, 1), got {rho}")
    return float(rho)


def _check_choice(value: str, choices: dict[str, int], name: str) -> str:
    if value not in choices:
        raise ValueError(f"{name} must be one of {sorted(choices)}, got {value!r}")
    return value


def _check_level(value: int | None, name: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int or None, got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return int(value)


def _check_unit(value: float, name: str) -> float:
    if not 0.0 < value < 1.0:
        raise ValueError(f"{name} must be in (0, 1), got {value}")
    return float(value)


def max_branching(tree: Tree | LazyTree) -> int:
    """The largest number of children of any node (the arity of a :class:`LazyTree`)."""
    if isinstance(tree, LazyTree):
        return tree.arity
    return int(np.diff(tree.child_ptr).max()) if tree.n_nodes > 1 else 1


class ExploredTreePolicy(Policy):
    """Shared machinery of the descent family: the explored tree in growable packed arrays
    (see :mod:`canopy.policies._explored`), the ask/tell plumbing and ``recommend``.

    Subclasses set the configuration through :meth:`_configure` and call :meth:`_begin` from
    :meth:`_start`; a forest of ``len(schedules)`` explored trees (one root per schedule)
    serves POO."""

    n_stored_: int
    max_stored_: int

    # ------------------------------------------------------------------ setup
    def _begin(self, *, schedules: Sequence[tuple[float, float | None]], spread: str,
               expand: str, max_depth: int | None, path_stats: bool, c: float,
               delta: float = 0.05, z: float = 3.0, max_nodes: int = 0) -> None:
        spec = self.spec_
        tree = spec.tree
        lazy = isinstance(tree, LazyTree)
        branching = max_branching(tree)
        default_rho = 1.0 / max(branching, 2)
        depth_cap = float(max_depth) if max_depth is not None else math.inf
        if lazy:
            depth_cap = min(depth_cap, math.floor(62 / math.log2(tree.arity)))
            if tree.max_depth is not None:
                depth_cap = min(depth_cap, float(tree.max_depth))
        rounds = max(spec_rounds(spec, self.ledger_.budget), 2.0)
        params = np.zeros(ex.N_PARAMS)
        params[ex.P_C] = c
        params[ex.P_DELTA] = delta
        params[ex.P_SIGMA] = spec.sigma
        params[ex.P_Z] = z
        params[ex.P_SPREAD] = _SPREADS[spread]
        params[ex.P_EXPAND] = _EXPANDS[expand]
        params[ex.P_MAXDEPTH] = depth_cap
        params[ex.P_PATH] = 1.0 if path_stats else 0.0
        params[ex.P_ARITY] = tree.arity if lazy else 0
        params[ex.P_MAXNODES] = max_nodes
        params[ex.P_DEPTHM] = (min(depth_cap, math.ceil(math.log(rounds, tree.arity)))
                               if lazy else 0.0)
        self._params = params
        self._lazy = lazy
        self._max_kids = branching
        certified = spread != "assumed"
        self._lambdas = default_lambdas(spec.sigma, z) if certified else np.ones(1)
        width = 3 + 2 * self._lambdas.size if certified else 0
        n_inst = len(schedules)
        capacity = max(_INITIAL_CAPACITY, 2 * n_inst + branching)
        self._fs = np.zeros((capacity, ex.N_FLOAT))
        self._ist = np.zeros((capacity, ex.N_INT), dtype=np.int64)
        self._cert = np.zeros((capacity, width))
        self._free = np.zeros(capacity, dtype=np.int64)
        self._inst = np.array([[lip, default_rho if rho is None else rho, 0.0]
                               for lip, rho in schedules], dtype=float)
        if lazy:
            self._tree_arrays = (_EMPTY, _EMPTY, _EMPTY, _EMPTY)
        else:
            self._tree_arrays = (tree.child_ptr, tree.child_ids, tree.leaf_lo, tree.leaf_hi)
        root_kids = 0 if depth_cap <= 0 else (tree.arity if lazy else int(tree.child_ptr[1]))
        root_log_m = (params[ex.P_DEPTHM] * math.log(tree.arity) if lazy
                      else math.log(tree.n_leaves))
        for i in range(n_inst):
            lip = self._inst[i, 0]
            self._ist[i] = (0, 0, -1, -1, root_kids, i, 0 if lazy or root_kids else 1)
            floor = lip
            start_spread = 1.0 if spread == "certified" else floor
            self._fs[i] = (0.0, 0.0, start_spread, np.inf, np.inf, 1.0, 1.0, floor, 0.0,
                           root_log_m)
        self._meta = np.zeros(ex.N_META, dtype=np.int64)
        self._meta[ex.M_USED] = n_inst
        self._meta[ex.M_STORED] = n_inst
        self._meta[ex.M_PEAK] = n_inst
        self._asked: dict[object, list[int]] = {}
        self._next = (0, 0, 0, self._ist[0, ex.ISLEAF])
        self._sync_counts()

    def _sync_counts(self) -> None:
        self.n_stored_ = int(self._meta[ex.M_STORED])
        self.max_stored_ = int(self._meta[ex.M_PEAK])

    def _grow(self) -> None:
        capacity = 2 * self._fs.shape[0]
        for name in ("_fs", "_ist", "_cert", "_free"):
            old = getattr(self, name)
            new = np.zeros((capacity, *old.shape[1:]), dtype=old.dtype)
            new[:old.shape[0]] = old
            setattr(self, name, new)

    # ------------------------------------------------------------------ ask / tell
    def _next_query(self) -> Query | None:
        row, node, level, is_leaf = self._next
        key = (level, node) if self._lazy else node
        self._asked.setdefault(key, []).append(row)
        return Query("leaf" if is_leaf else "probe", key)

    def _observe(self, query: Query, value: float) -> None:
        rows = self._asked[query.node]
        row = rows.pop()
        if not rows:
            del self._asked[query.node]
        if self._lazy and not self._row_holds(row, query.node):
            return  # its cell was forgotten by the memory bound while the query was out
        if self._meta[ex.M_USED] + self._max_kids > self._fs.shape[0]:
            self._grow()
        self._next = ex.observe(row, value, self._fs, self._ist, self._cert, self._lambdas,
                                self._params, self._inst, self._meta, self._free,
                                *self._tree_arrays)
        self._sync_counts()

    def _row_holds(self, row: int, node: tuple[int, int]) -> bool:
        return (int(self._ist[row, ex.LEVEL]) == node[0]
                and int(self._ist[row, ex.NODE]) == node[1])

    # ------------------------------------------------------------------ recommend
    def _best_root(self) -> int:
        """The root to recommend from (the only one but for POO)."""
        return 0

    def _most_played_path_end(self, root: int) -> int:
        fs, ist = self._fs, self._ist
        v = root
        while ist[v, ex.FIRST] >= 0:
            first = int(ist[v, ex.FIRST])
            kids = first + np.arange(ist[v, ex.NKIDS])
            plays = fs[kids, ex.SUBN]
            if plays.max() <= 0:
                break
            v = int(kids[np.argmax(plays)])
        return v

    def _explored_below(self, row: int) -> list[int]:
        """Rows of the explored subtree of ``row`` in breadth-first (level) order."""
        out, frontier = [row], [row]
        while frontier:
            nxt = []
            for v in frontier:
                first = int(self._ist[v, ex.FIRST])
                if first >= 0:
                    nxt.extend(range(first, first + int(self._ist[v, ex.NKIDS])))
            out.extend(nxt)
            frontier = nxt
        return out

    def recommend(self, k: int = 1) -> np.ndarray:
        """``k`` leaves, best first: follow the most-played path (child with the most plays in
        its subtree) to its deepest explored node ``w``, climb until ``w`` has ``k`` leaves,
        then rank the leaves under ``w`` by the empirical mean of the deepest played explored
        node containing each (ties by leaf index). On a :class:`LazyTree` there are no leaf
        indices: the result is a ``(k, 2)`` array of ``(level, index)`` cells, the path's end
        first, then the other played explored leaves by empirical mean."""
        self._check_started()
        row = self._most_played_path_end(self._best_root())
        if self._lazy:
            return self._recommend_cells(row, k)
        tree: Tree = self.spec_.tree  # type: ignore[assignment]
        k = check_k(k, tree.n_leaves)
        while tree.leaf_hi[self._ist[row, ex.NODE]] - tree.leaf_lo[self._ist[row, ex.NODE]] < k:
            row = int(self._ist[row, ex.PARENT])
        top = int(self._ist[row, ex.NODE])
        lo = int(tree.leaf_lo[top])
        scores = np.full(int(tree.leaf_hi[top]) - lo, -np.inf)
        for v in self._explored_below(row):
            if self._fs[v, ex.COUNT] > 0:
                node = int(self._ist[v, ex.NODE])
                scores[tree.leaf_lo[node] - lo:tree.leaf_hi[node] - lo] = self._fs[v, ex.MEAN]
        return lo + np.argsort(-scores, kind="stable")[:k]

    def _recommend_cells(self, row: int, k: int) -> np.ndarray:
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise ValueError(f"k must be a positive int, got {k!r}")
        used = int(self._meta[ex.M_USED])
        ist, fs = self._ist[:used], self._fs[:used]
        alive = (ist[:, ex.LEVEL] >= 0) & (ist[:, ex.FIRST] < 0) & (fs[:, ex.COUNT] > 0)
        others = np.flatnonzero(alive & (np.arange(used) != row))
        order = [row, *others[np.argsort(-fs[others, ex.MEAN], kind="stable")]][:k]
        if len(order) < k:
            raise ValueError(f"only {len(order)} explored cells to recommend, asked for {k}")
        return np.array([[ist[v, ex.LEVEL], ist[v, ex.NODE]] for v in order], dtype=np.int64)


def spec_rounds(spec: ProblemSpec, budget: float) -> float:
    """The most rounds a budget can pay for (every round at the cheaper, probe cost)."""
    return budget / spec.probe_cost


class OptimisticDescent(ExploredTreePolicy):
    """Optimistic descent for regret play on a finite :class:`~canopy.tree.Tree`.

    Args:
        spread: the bias bonus ``spread(v)`` of Eq. (4).

            - ``"assumed"``: the floor ``L rho^level`` of Eq. (3).
            - ``"certified"``: estimated from data per subtree. The node's own certificate
              (Algorithm 1 on its own probes, O(|grid|) running state) gives
              ``own(v) = min(1, bound)``; each node carries a local Lipschitz estimate
              ``L_hat(v) = min(L_hat(parent), own(v) / rho^level)`` (``L_hat(root) = 1``, the
              trivial bias bound), and ``spread(v) = L_hat(v) rho^level``. So before a node's
              own certificate is tighter than its ancestors' estimate, it uses the estimate of
              its nearest certified ancestor scaled down the levels (Section 3.3), and after,
              its own bound. ``lipschitz`` is unused.
            - ``"hybrid"``: the floor ``L rho^level`` unless the node is flagged (the lower
              confidence bound on its noise-deconvolved within-cell sd exceeds the floor, as
              :func:`canopy.certificate.is_violation`), then ``max(floor, min(1, bound))``.
        lipschitz: ``L`` of the floor (> 0).
        rho: the floor's ratio in (0, 1); ``None`` is ``1 / max number of children``.
        c: scale of the confidence radius (> 0).
        expand: ``"refine"`` (Eq. 6: split an explored leaf once
            ``T(v) >= c^2 ln t / spread(v)^2``, else play it again), ``"always"`` (HOO-style:
            split a node after its first play, so each round plays a new node) or ``"fixed"``
            (``"always"`` down to ``max_depth`` and never deeper: fixed-resolution play).
        max_depth: deepest level the explored tree may reach (required by ``"fixed"``).
        delta: level of each node's certificate. Each node uses ``delta`` itself (no union
            bound over nodes: the bonus is an index, and Corollary 1's simultaneous guarantee
            needs ``delta`` divided by the number of nodes probed).
        z: truncation level of the certificate's probes.
    """

    query_kinds = ("probe", "leaf")

    def __init__(self, *, spread: str = "assumed", lipschitz: float = 1.0,
                 rho: float | None = None, c: float = 1.0, expand: str = "refine",
                 max_depth: int | None = None, delta: float = 0.05, z: float = 3.0) -> None:
        self.spread = _check_choice(spread, _SPREADS, "spread")
        self.lipschitz = check_positive(lipschitz, "lipschitz")
        self.rho = check_rho(rho)
        self.c = check_positive(c, "c")
        self.expand = _check_choice(expand, _EXPANDS, "expand")
        self.max_depth = _check_level(max_depth, "max_depth")
        if expand == "fixed" and max_depth is None:
            raise ValueError('expand="fixed" needs max_depth (the resolution to play at)')
        self.delta = _check_unit(delta, "delta")
        self.z = check_positive(z, "z")

    @property
    def name(self) -> str:  # type: ignore[override]
        return f"descent-{self.spread}"

    def _start(self) -> None:
        if not isinstance(self.spec_.tree, Tree):
            raise TypeError("OptimisticDescent needs a finite Tree; use MemoryBoundedDescent "
                            "on a LazyTree")
        self._begin(schedules=[(self.lipschitz, self.rho)], spread=self.spread,
                    expand=self.expand, max_depth=self.max_depth, path_stats=False, c=self.c,
                    delta=self.delta, z=self.z)


class MemoryBoundedDescent(ExploredTreePolicy):
    """Optimistic descent with the refine rule (Eq. 6) under a hard memory cap, for trees of
    unbounded depth (:class:`~canopy.tree.LazyTree`; finite-state compression, Appendix D).

    When a split would take the explored tree past ``max_nodes`` rows, the policy forgets the
    children of the explored node of lowest ``B`` whose children are all explored leaves (the
    least promising bottom cell; never the parent of the node being split). The forgotten
    node keeps its own statistics and becomes an explored leaf again. If nothing can be
    forgotten the split waits. ``max_nodes=None`` is ``2 b ceil(log_b n) + 1`` with ``b`` the
    arity and ``n = budget / probe_cost`` the horizon: room for a path down to the depth a cell
    is resolved by one probe, twice over.

    ``spread`` is ``"assumed"`` or ``"certified"`` as in :class:`OptimisticDescent`; the
    certificate treats a cell at ``level`` as ``b^(D - level)`` leaves, ``D = ceil(log_b n)``
    (a modelling choice: the leaves of an infinite tree are a continuum). After a run:
    ``depth_reached_`` (deepest level explored) and ``tree_nodes_``
    (``LazyTree.n_nodes_to_level(depth_reached_)``, the tree that depth spans).
    """

    name = "memory-bounded"
    query_kinds = ("probe",)

    depth_reached_: int
    tree_nodes_: int

    def __init__(self, *, lipschitz: float = 1.0, rho: float | None = None, c: float = 1.0,
                 spread: str = "assumed", max_nodes: int | None = None, delta: float = 0.05,
                 z: float = 3.0) -> None:
        self.lipschitz = check_positive(lipschitz, "lipschitz")
        self.rho = check_rho(rho)
        self.c = check_positive(c, "c")
        if spread not in ("assumed", "certified"):
            raise ValueError(f"spread must be 'assumed' or 'certified', got {spread!r}")
        self.spread = spread
        self.max_nodes = _check_level(max_nodes, "max_nodes")
        self.delta = _check_unit(delta, "delta")
        self.z = check_positive(z, "z")

    def _start(self) -> None:
        tree = self.spec_.tree
        if not isinstance(tree, LazyTree):
            raise TypeError("MemoryBoundedDescent needs a LazyTree; use OptimisticDescent on "
                            "a finite Tree")
        cap = self.max_nodes
        if cap is None:
            rounds = max(spec_rounds(self.spec_, self.ledger_.budget), 2.0)
            cap = 2 * tree.arity * math.ceil(math.log(rounds, tree.arity)) + 1
        if cap < 1 + tree.arity:
            raise ValueError(f"max_nodes must be at least 1 + arity = {1 + tree.arity}, "
                             f"got {cap}")
        self._begin(schedules=[(self.lipschitz, self.rho)], spread=self.spread,
                    expand="refine", max_depth=None, path_stats=False, c=self.c,
                    delta=self.delta, z=self.z, max_nodes=cap)

    def _sync_counts(self) -> None:
        super()._sync_counts()
        self.depth_reached_ = int(self._meta[ex.M_DEEPEST])
        self.tree_nodes_ = self.spec_.tree.n_nodes_to_level(self.depth_reached_)


def per_round_overhead_us(policy_factory: Callable[[], Policy], tree: Tree | LazyTree,
                          rounds: int, seed: int = 0) -> float:
    """Microseconds per round of ``ask`` + ``tell`` through the :class:`Policy` surface.

    Observations are a tree-Lipschitz value of the played node (or the garland at the cell's
    midpoint on a :class:`LazyTree`) plus N(0, 0.1^2) noise; the cost of producing them is
    measured on the same node sequence and subtracted."""
    rng = np.random.default_rng(seed)
    noise = 0.1 * rng.standard_normal(rounds)
    if isinstance(tree, Tree):
        from canopy.instances import tree_lipschitz_values

        leaf_values = tree_lipschitz_values(tree, 1.0, rng, branching=max_branching(tree))
        table = tree.subtree_means(leaf_values)

        def value_of(node: object) -> float:
            return table[node]  # type: ignore[index]
    else:
        from canopy.instances import garland

        def value_of(node: object) -> float:
            level, index = node  # type: ignore[misc]
            return float(garland(np.array([(index + 0.5) / tree.arity**level]))[0])

    spec = ProblemSpec(tree, 0.1, 1.0, 1.0)
    policy = policy_factory()
    policy.start(spec, budget=float(rounds), seed=seed)
    nodes: list[object] = []
    started = time.perf_counter()
    for i in range(rounds):
        query = policy.ask()
        if query is None:
            break
        nodes.append(query.node)
        policy.tell(query, value_of(query.node) + noise[i])
    total = time.perf_counter() - started
    started = time.perf_counter()
    for i, node in enumerate(nodes):
        _ = value_of(node) + noise[i]
    replay = time.perf_counter() - started
    return 1e6 * max(total - replay, 0.0) / max(len(nodes), 1)
