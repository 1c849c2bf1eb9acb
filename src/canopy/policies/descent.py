"""Regret play by optimistic descent (paper Section 3.2, Eqs. 4-6; Section 3.3; Thm 3).

Each round descends the explored tree from the root along the child of largest
``B(v) = min(U(v), max_children B)`` with ``U(v) = mean(v) + c sqrt(2 ln t / T(v)) + spread(v)``
(Eq. 4), plays (probes) the explored leaf it reaches, and folds the observation back along the
path. The explored tree grows by the expand rule; ``spread(v)`` is the bias bonus.

Choices the paper leaves open, fixed here:

- ``T(v)`` and ``mean(v)`` count the node's *own* probes only (HCT-style), so ``mean(v)``
  estimates the subtree average f(v) of Eq. (1) without bias and the certificate sees uniform
  random-path probes. (:class:`~canopy.policies.hoo.HOO` keeps HOO's path statistics, and so
  does :class:`MemoryBoundedDescent` by default, ``stats="path"``.)
- ``t`` in ``ln t`` is the number of observations told so far; ``U`` and ``B`` are refreshed
  only on the played path, so off-path values are stale between visits (as in HCT).
- Ties in ``B`` (unplayed children all have ``B = +inf``) go to the first child: the policy
  makes no random choice, and the seed only matters through the problem's noise.
- Children are allocated as a block when a node is split; ``n_stored_`` counts allocated rows,
  played or not. A split node keeps its statistics and keeps bounding its subtree through
  ``B = min(U, ...)``, but is no longer played itself.
- Eq. (6) is used as written, ``T(v) >= c^2 ln t / spread(v)^2`` (the radius of Eq. 4 carries a
  factor 2 that Eq. 6 drops), or, with ``split="variance"`` (the memory-bounded descent's
  default), the variance-scaled ``T(v) >= V_hat(v) / spread(v)^2``.
- Asynchronous use: ``ask`` without an intervening ``tell`` repeats the current descent.
- ``c`` defaults to the problem's noise sd ``sigma`` (:func:`radius_scale`): Eq. (4)'s radius
  is then the UCB radius of the declared noise, and Eq. (6) splits a cell once its confidence
  width falls to its spread. A constant ``c = 1`` (the former default) explores as if the
  noise were ``1 / sigma`` times larger and splits ``1 / sigma^2`` times later.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from canopy.certificate import (
    DEFAULT_METHOD,
    METHODS,
    check_value_range,
    default_lambdas,
    sharp_setup,
    sharp_width,
)
from canopy.policies import _explored as ex
from canopy.policies.base import Policy, check_k
from canopy.problem import ProblemSpec, Query, QueryBatch
from canopy.tree import LazyTree, Tree
from canopy.validation import check_count, check_open_unit, check_positive

__all__ = ["KnownBiasDescent", "MemoryBoundedDescent", "OptimisticDescent"]

_SPREADS = {"assumed": ex.ASSUMED, "certified": ex.CERTIFIED, "hybrid": ex.HYBRID,
            "estimated": ex.ESTIMATED}
_EXPANDS = {"refine": ex.REFINE, "always": ex.ALWAYS, "fixed": ex.FIXED}
_SPLITS = {"eq6": ex.EQ6, "variance": ex.VARIANCE}
_PROBES = {"uniform": 0, "centre": 1}
_FORGETS = {"any": ex.ANY, "balanced": ex.BALANCED}
_RADII = {"eq4": ex.EQ4, "moss": ex.MOSS}
_STATS = {"own": 0, "path": 1}
_INITIAL_CAPACITY = 64
_EMPTY = np.zeros(1, dtype=np.int64)


def _check_choice(value: str, choices: dict[str, int], name: str) -> str:
    if value not in choices:
        raise ValueError(f"{name} must be one of {sorted(choices)}, got {value!r}")
    return value


def _check_level(value: int | None, name: str) -> int | None:
    """``None``, or ``value`` checked to be an int >= 0."""
    return None if value is None else check_count(value, name, low=0)


def _lazy_tree(spec: ProblemSpec) -> LazyTree:
    """``spec.tree``, which the lazy-tree paths (``_lazy``, :class:`MemoryBoundedDescent`) hold
    to be a :class:`LazyTree`."""
    if not isinstance(spec.tree, LazyTree):
        raise TypeError(f"a LazyTree is needed here, got {type(spec.tree).__name__}")
    return spec.tree


def max_branching(tree: Tree | LazyTree) -> int:
    """The largest number of children of any node (the arity of a :class:`LazyTree`)."""
    if isinstance(tree, LazyTree):
        return tree.arity
    return int(np.diff(tree.child_ptr).max()) if tree.n_nodes > 1 else 1


class ExploredTreePolicy(Policy):
    """Shared machinery of the descent family: the explored tree in growable packed arrays
    (see ``canopy.policies._explored``), the ask/tell plumbing and ``recommend``.

    Subclasses set the configuration through ``_configure`` and call ``_begin`` from
    ``_start``; a forest of ``len(schedules)`` explored trees (one root per schedule)
    serves POO."""

    # ------------------------------------------------------------------ setup
    def _begin(self, *, schedules: Sequence[tuple[float, float | None]], spread: str,
               expand: str, max_depth: int | None, path_stats: bool, c: float,
               delta: float = 0.05, z: float = 3.0, max_nodes: int = 0,
               certificate: str = "paper", split: str = "eq6", probe: str = "uniform",
               forget: str = "any", radius: str = "eq4") -> None:
        spec = self.spec_
        tree = spec.tree
        lazy = isinstance(tree, LazyTree)
        branching = max_branching(tree)
        default_rho = 1.0 / max(branching, 2)
        depth_cap = float(max_depth) if max_depth is not None else math.inf
        if isinstance(tree, LazyTree):
            depth_cap = min(depth_cap, math.floor(62 / math.log2(tree.arity)))
            if tree.max_depth is not None:
                depth_cap = min(depth_cap, float(tree.max_depth))
        rounds = max(spec_rounds(spec, self.ledger_.budget), 2.0)
        n_inst = len(schedules)
        ctl = np.zeros(ex.INST0 + 3 * n_inst)
        ctl[ex.P_C] = c
        ctl[ex.P_DELTA] = delta
        ctl[ex.P_SIGMA] = spec.sigma
        ctl[ex.P_Z] = z
        ctl[ex.P_SPREAD] = _SPREADS[spread]
        ctl[ex.P_EXPAND] = _EXPANDS[expand]
        ctl[ex.P_SPLIT] = _SPLITS[split]
        ctl[ex.P_FORGET] = _FORGETS[forget]
        ctl[ex.P_RADIUS] = _RADII[radius]
        ctl[ex.P_MAXDEPTH] = depth_cap
        ctl[ex.P_PATH] = 1.0 if path_stats else 0.0
        ctl[ex.P_ARITY] = tree.arity if isinstance(tree, LazyTree) else 0
        ctl[ex.P_MAXNODES] = max_nodes
        ctl[ex.P_DEPTHM] = (min(depth_cap, math.ceil(math.log(rounds, tree.arity)))
                            if isinstance(tree, LazyTree) else 0.0)
        low, high = spec_value_range(spec)
        ctl[ex.P_LOW], ctl[ex.P_WIDTH] = low, high - low
        for i, (lip, rho) in enumerate(schedules):
            ctl[ex.INST0 + 3 * i:ex.INST0 + 3 * i + 2] = (lip, default_rho if rho is None else rho)
        ctl[ex.M_USED] = ctl[ex.M_STORED] = ctl[ex.M_PEAK] = n_inst
        self._ctl = ctl
        self._lazy = lazy
        # centre probes: a cell is probed through its descendant at the deepest level the
        # tree allows that holds the centre of the cell's box (LazyTree.centre)
        self._probe_level = int(depth_cap) if lazy and probe == "centre" else -1
        self._max_kids = branching
        certified = spread in ("certified", "hybrid")
        tree_cert = certified and certificate != "paper"
        ctl[ex.P_TREECERT] = 1.0 if tree_cert else 0.0
        if tree_cert:
            # Corollary 1: delta split evenly over every node the explored tree may hold
            nodes = (tree.n_nodes_to_level(int(ctl[ex.P_DEPTHM])) if isinstance(tree, LazyTree)
                     else tree.n_nodes)
            self._lambdas = sharp_setup(spec.sigma / (high - low), delta / nodes, z, certificate)
            state = sharp_width(self._lambdas)
        else:
            self._lambdas = default_lambdas(spec.sigma, z) if certified else np.ones(1)
            state = 3 + 2 * self._lambdas.size if certified else 0
        width = ex.N_FLOAT + state
        capacity = max(_INITIAL_CAPACITY, 2 * n_inst + branching)
        self._fs = np.zeros((capacity, width))
        self._ist = np.zeros((capacity, ex.N_INT), dtype=np.int64)
        if isinstance(tree, LazyTree):
            self._tree_arrays = (_EMPTY, _EMPTY, _EMPTY, _EMPTY)
        else:
            self._tree_arrays = (tree.child_ptr, tree.child_ids, tree.leaf_lo, tree.leaf_hi)
        root_kids = 0 if depth_cap <= 0 else (tree.arity if isinstance(tree, LazyTree)
                                              else int(tree.child_ptr[1]))
        root_log_m = (ctl[ex.P_DEPTHM] * math.log(tree.arity) if isinstance(tree, LazyTree)
                      else math.log(tree.n_leaves))
        for i, (lip, _) in enumerate(schedules):
            self._ist[i] = (0, 0, -1, -1, root_kids, i, 0 if lazy or root_kids else 1, 0)
            start_spread = 1.0 if spread in ("certified", "estimated") else lip
            if tree_cert and spread == "certified":
                start_spread = high - low
            self._fs[i, :ex.N_FLOAT] = (0.0, 0.0, start_spread, np.inf, np.inf, 1.0, 1.0, lip,
                                        0.0, root_log_m, 0.0, 1.0, 0.0, 1.0, 0.0)
        self._forest = n_inst > 1
        self._plain = not (self._forest or lazy)
        self._bind_kernel()
        self._asked: dict[object, list[int]] = {}  # forest: rows asked per node, by schedule
        self._row_of: dict[object, int] = {}  # one tree: a node's row is unique
        self._queries: dict[int, Query] = {}
        self._out = None
        self._next = 0
        self._ready = None if self._forest else self._new_query(0)

    def _bind_kernel(self) -> None:
        """The compiled observe and split kernels for this run's arrays (numba closures, so
        they are not pickled but bound again on unpickling: the state itself is the
        arrays)."""
        arrays = (self._fs, self._ist, self._ctl)
        self._observe_kernel = ex.entry_point(ex.observe, 0, 0.0, *arrays, self._lambdas)
        self._split_kernel = ex.entry_point(ex.split, 0, *arrays, *self._tree_arrays)

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state.pop("_observe_kernel", None)
        state.pop("_split_kernel", None)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        if "_fs" in state:
            self._bind_kernel()

    @property
    def n_stored_(self) -> int:
        """Explored rows stored now (children are allocated as a block)."""
        return int(self._ctl[ex.M_STORED])

    @property
    def max_stored_(self) -> int:
        """The peak of :attr:`n_stored_` over the run."""
        return int(self._ctl[ex.M_PEAK])

    def _grow(self) -> None:
        capacity = 2 * self._fs.shape[0]
        for name in ("_fs", "_ist"):
            old = getattr(self, name)
            new = np.zeros((capacity, *old.shape[1:]), dtype=old.dtype)
            new[:old.shape[0]] = old
            setattr(self, name, new)

    # ------------------------------------------------------------------ ask / tell
    # The common loop (ask, then tell that very query) takes a short path on one tree: ``ask``
    # hands out ``_ready``, the query of the row to play next (built by the previous round),
    # and keeps it in ``_out`` instead of the base class's outstanding record; its ``tell``
    # folds the observation into the row it was asked for. Anything else (a second query out,
    # an equal copy told, an observation that is not a finite (numpy) float in range, a batch,
    # ``abandon``, a forest) first moves ``_out`` into the outstanding record (:meth:`_settle`)
    # and takes the base class's path, errors and all. Elsewhere a told node maps straight to
    # its row (``_row_of`` holds only rows that still hold their node: entries of cells the
    # memory bound forgets leave it at once).
    _out: Query | None = None  # asked by the short path, not yet told
    _ready: Query | None = None  # the next query (one tree, started)

    def ask(self) -> Query | None:
        query = self._ready
        if query is None or self._out is not None or self._held is not None:
            self._settle()
            return super().ask()
        kind = query[0]
        if not self.ledger_.try_charge(kind, self._probe_cost if kind == "probe"
                                       else self._leaf_cost):
            return None
        self._out = query
        return query

    def tell(self, query: Query, value: float) -> None:
        out = self._out
        # a Python or numpy float, finite (NaN fails every comparison) and in range
        if (query is not out or out is None
                or (type(value) is not float and type(value) is not np.float64)
                or not (-math.inf < value < math.inf and self._low <= value <= self._high)):
            self._settle()
            super().tell(query, value)
            return
        self._out = None
        self._play(self._next, value)

    def abandon(self, query: Query, *, refund: bool = False) -> None:
        self._settle()
        super().abandon(query, refund=refund)

    def _take_outstanding(self, batch: QueryBatch) -> None:
        self._settle()
        super()._take_outstanding(batch)

    def _settle(self) -> None:
        """Move the short path's outstanding query into the base class's record."""
        out = self._out
        if out is not None:
            self._out = None
            self._outstanding[out] = self._outstanding.get(out, 0) + 1

    def _next_query(self) -> Query | None:
        row = self._next
        query = self._queries.get(row) or self._new_query(row)
        if self._forest:
            self._asked.setdefault(query.node, []).append(row)
        return query

    def _new_query(self, row: int) -> Query:
        fields = self._ist[row].tolist()
        node, level, is_leaf = fields[ex.NODE], fields[ex.LEVEL], fields[ex.ISLEAF]
        if self._lazy:
            node = (level, node)
            if self._probe_level > level:  # centre probes
                node = _lazy_tree(self.spec_).centre(node, self._probe_level)
        query = Query("leaf" if is_leaf else "probe", node)
        self._queries[row] = query
        self._row_of[query.node] = row
        return query

    def _observe(self, query: Query, value: float) -> None:
        row = self._told_row(query) if self._forest else self._row_of.get(query.node, -1)
        if row >= 0:  # else its cell was forgotten by the memory bound while the query was out
            self._play(row, value)

    def _play(self, row: int, value: float) -> None:
        """Fold ``value`` into ``row`` (the kernels), and choose the next row and, on one
        tree, its query."""
        step = self._observe_kernel(row, value, self._fs, self._ist, self._ctl, self._lambdas)
        self._next = step = step if step >= 0 else self._split(row)
        if not self._forest:
            self._ready = self._queries.get(step) or self._new_query(step)

    def _told_row(self, query: Query) -> int:
        """The row a told query was asked for in a forest (POO; no memory bound)."""
        rows = self._asked[query.node]
        row = rows.pop()
        if not rows:
            del self._asked[query.node]
        return row

    def _split(self, row: int) -> int:
        if self._ctl[ex.M_USED] + self._max_kids > self._fs.shape[0]:
            self._grow()
        step = self._split_kernel(row, self._fs, self._ist, self._ctl, *self._tree_arrays)
        # the block the memory bound forgets is the one this split reuses (the top of the
        # free stack), so dropping the new block's rows drops every forgotten cell
        first = int(self._ist[row, ex.FIRST])
        for kid in range(first, first + self._max_kids):
            query = self._queries.pop(kid, None)
            if query is not None and self._row_of.get(query.node) == kid:
                del self._row_of[query.node]
        return step

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
            nxt: list[int] = []
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
        check_count(k, "k")
        used = int(self._ctl[ex.M_USED])
        ist, fs = self._ist[:used], self._fs[:used]
        alive = (ist[:, ex.LEVEL] >= 0) & (ist[:, ex.FIRST] < 0) & (fs[:, ex.COUNT] > 0)
        others = np.flatnonzero(alive & (np.arange(used) != row))
        order = [row, *others[np.argsort(-fs[others, ex.MEAN], kind="stable")]][:k]
        if len(order) < k:
            raise ValueError(f"only {len(order)} explored cells to recommend, asked for {k}")
        return np.array([[ist[v, ex.LEVEL], ist[v, ex.NODE]] for v in order], dtype=np.int64)


def spec_value_range(spec: ProblemSpec) -> tuple[float, float]:
    """The range of the leaf means the certificate assumes: the problem's declared
    ``value_range`` when finite, else the paper's ``[0, 1]``."""
    low, high = spec.value_range
    if math.isfinite(low) and math.isfinite(high):
        return check_value_range((low, high))
    return 0.0, 1.0


def _check_schedule(lipschitz: float, rho: float | None, c: float | None) -> None:
    check_positive(lipschitz, "lipschitz")
    check_open_unit(rho, "rho", allow_none=True)
    if c is not None:  # None: the problem's noise sd (radius_scale)
        check_positive(c, "c")


def _check_certificate(value: str) -> str:
    if value not in METHODS:
        raise ValueError(f"certificate must be one of {METHODS}, got {value!r}")
    return value


def spec_rounds(spec: ProblemSpec, budget: float) -> float:
    """The most rounds a budget can pay for (every round at the cheaper, probe cost)."""
    return budget / spec.probe_cost


def radius_scale(c: float | None, spec: ProblemSpec) -> float:
    """``c`` of Eq. (4) and Eq. (6): as given, or by default (``None``) the problem's noise
    sd ``sigma``, the sub-Gaussian scale of a probe's noise (``c sqrt(2 ln t / T)`` is then
    the UCB radius of ``sigma``-sub-Gaussian noise); half the value range when
    ``sigma = 0`` (Hoeffding's scale of a bounded probe)."""
    if c is not None:
        return c
    if spec.sigma > 0:
        return spec.sigma
    low, high = spec_value_range(spec)
    return (high - low) / 2


class OptimisticDescent(ExploredTreePolicy):
    """Optimistic descent for regret play on a finite :class:`~canopy.tree.Tree`.

    Args:
        spread: the bias bonus ``spread(v)`` of Eq. (4).

            - ``"assumed"``: the floor ``L rho^level`` of Eq. (3).
            - ``"estimated"``: Section 3.3's data-driven bonus ``sigma_w sqrt(2 log m)``
              (the certificate's light-tail rate, Appendix A) with the plug-in
              ``sigma_w = sqrt(max(var(own probes) - sigma^2, 0))``, the noise-deconvolved
              within-cell sd from O(1) running moments of the node's own probes, and ``m``
              the node's number of leaves; capped at 1. Once a node has
              ``MIN_PROBES = 9`` own probes (the sample variance's relative standard error
              ``sqrt(2/(n-1))`` is then at most 1/2) it holds the per-subtree estimate
              ``L_hat(v) = bonus(v) / rho^level``; a node with fewer own probes uses
              ``L_hat(parent) rho^level`` (the parent's estimate, frozen at the split, as the
              parent is no longer played). The prior before any data is the trivial bound 1
              at the root, which is played alone until it has its own estimate: under this
              spread no node is split before ``MIN_PROBES`` own probes. A point estimate,
              not a bound: it can under-state the bias of a cell with a narrow peak, and a
              cell estimated flat (bonus 0) is never split (Eq. 6's threshold is infinite).
              ``lipschitz`` is unused.
            - ``"certified"``: the rigorous variant. With the default
              ``certificate="sharp"`` (or ``"betting"``/``"order"``), the node's certified
              bias as :class:`canopy.certified_tree.CertifiedTree` computes it: its own
              certificate on its own probes, composed with its explored children's
              (``min`` of the upper bounds on the best leaf, ``max`` of the lower bounds on
              the value), ``delta`` split evenly over the tree's nodes (Corollary 1), in the
              problem's value range (``[0, 1]`` when it declares none); a node without two
              own probes has the range as its bound. Refreshed on the played path each
              round, so a split node keeps tightening from its children's probes.
              With ``certificate="paper"`` (the former behaviour, for reproduction): the
              node's own certificate (Algorithm 1
              on its own probes, O(grid size) running state) gives ``own(v) = min(1, bound)``;
              each node carries ``L_hat(v) = min(L_hat(parent), own(v) / rho^level)``
              (``L_hat(root) = 1``, the trivial bias bound), and
              ``spread(v) = L_hat(v) rho^level``. So before a node's own certificate is
              tighter than its ancestors' estimate, it uses the estimate of its nearest
              certified ancestor scaled down the levels, and after, its own bound.
              Conservative: the bound holds with probability ``1 - delta`` on every instance,
              and at the ``~ c^2 ln t / spread^2`` own probes Eq. (6) leaves a node before it
              splits it is wider than ``rho^level``, so on benign instances it rarely binds
              and the policy then plays as ``"assumed"`` with ``L = 1``.
              ``lipschitz`` is unused.
            - ``"hybrid"``: the floor ``L rho^level`` unless the node is flagged (the lower
              confidence bound on its noise-deconvolved within-cell sd exceeds the floor, as
              :func:`canopy.certificate.is_violation`), then ``max(floor, bound)`` with the
              certified bound above (``min(1, own bound)`` under ``certificate="paper"``).
        lipschitz: ``L`` of the floor (> 0).
        rho: the floor's ratio in (0, 1); ``None`` is ``1 / max number of children``.
        c: scale of the confidence radius (> 0); ``None`` (the default) is the problem's
            noise sd (:func:`radius_scale`).
        expand: ``"refine"`` (Eq. 6: split an explored leaf once
            ``T(v) >= c^2 ln t / spread(v)^2``, else play it again), ``"always"`` (HOO-style:
            split a node after its first play, so each round plays a new node) or ``"fixed"``
            (``"always"`` down to ``max_depth`` and never deeper: fixed-resolution play).
        max_depth: deepest level the explored tree may reach (required by ``"fixed"``).
        split: the refine rule's threshold: ``"eq6"`` (Eq. 6 as written, the default here)
            or ``"variance"`` (``T(v) >= V_hat(v) / spread(v)^2``, as
            :class:`MemoryBoundedDescent`, whose default it is).
        delta: level of the certificates: split evenly over the tree's nodes for the
            composed certificates; under ``certificate="paper"`` each node uses ``delta``
            itself (no union bound over nodes, the former behaviour).
        z: truncation level of the certificate's probes.
        certificate: the certificate method (:data:`canopy.certificate.METHODS`) of the
            certified and hybrid spreads.
    """

    query_kinds = ("probe", "leaf")

    def __init__(self, *, spread: str = "assumed", lipschitz: float = 1.0,
                 rho: float | None = None, c: float | None = None, expand: str = "refine",
                 max_depth: int | None = None, delta: float = 0.05, z: float = 3.0,
                 certificate: str = DEFAULT_METHOD, split: str = "eq6") -> None:
        self.spread = _check_choice(spread, _SPREADS, "spread")
        self.split = _check_choice(split, _SPLITS, "split")
        self.certificate = _check_certificate(certificate)
        _check_schedule(lipschitz, rho, c)
        self.lipschitz, self.rho, self.c = lipschitz, rho, c
        self.expand = _check_choice(expand, _EXPANDS, "expand")
        self.max_depth = _check_level(max_depth, "max_depth")
        if expand == "fixed" and max_depth is None:
            raise ValueError('expand="fixed" needs max_depth (the resolution to play at)')
        check_open_unit(delta, "delta")
        check_positive(z, "z")
        self.delta, self.z = delta, z

    @property
    def name(self) -> str:  # type: ignore[override]
        return f"descent-{self.spread}"

    def _start(self) -> None:
        if not isinstance(self.spec_.tree, Tree):
            raise TypeError("OptimisticDescent needs a finite Tree; use MemoryBoundedDescent "
                            "on a LazyTree")
        self._begin(schedules=[(self.lipschitz, self.rho)], spread=self.spread,
                    expand=self.expand, max_depth=self.max_depth, path_stats=False,
                    c=radius_scale(self.c, self.spec_), delta=self.delta, z=self.z,
                    certificate=self.certificate, split=self.split)


class KnownBiasDescent(OptimisticDescent):
    """:class:`OptimisticDescent` whose ``spread(v)`` is a given per-node bias, e.g. each
    node's true aggregation bias (Eq. 2, :meth:`~canopy.problem.LeafMeans.aggregation_biases`).

    An instrument, not a policy a user can run blind: with the true biases it is the limit
    every valid certificate approaches from above (a valid bound is at least the true bias
    with probability ``1 - delta``), so it separates what the data-driven spreads lose to
    their width from what a perfect certificate would still lose. Eq. (6) and Eq. (4) as in
    :class:`OptimisticDescent` (``expand="refine"``).

    Args:
        bias: the spread of each node of the problem's tree, indexed by node id (>= 0).
        c: scale of the confidence radius (> 0); ``None`` is the problem's noise sd.
    """

    def __init__(self, bias: np.ndarray, *, c: float | None = None) -> None:
        super().__init__(spread="assumed", c=c)
        values = np.asarray(bias, dtype=float)
        if values.ndim != 1 or not np.all(np.isfinite(values) & (values >= 0)):
            raise ValueError("bias must be a 1-d array of finite values >= 0, one per node")
        self.bias = bias

    @property
    def name(self) -> str:  # type: ignore[override]
        return "descent-known-bias"

    def _start(self) -> None:
        tree = self.spec_.tree
        self._bias = np.asarray(self.bias, dtype=float)
        if isinstance(tree, Tree) and self._bias.size != tree.n_nodes:
            raise ValueError(f"bias has {self._bias.size} entries, the tree {tree.n_nodes} "
                             "nodes")
        super()._start()
        self._set_spread(0)

    def _set_spread(self, row: int) -> None:
        node = int(self._ist[row, ex.NODE])
        self._fs[row, ex.FLOOR] = self._fs[row, ex.SPREAD] = self._bias[node]

    def _split(self, row: int) -> int:
        step = super()._split(row)  # the new children are not played before this returns
        first = int(self._ist[row, ex.FIRST])
        for kid in range(first, first + int(self._ist[row, ex.NKIDS])):
            self._set_spread(kid)
        return step


class MemoryBoundedDescent(ExploredTreePolicy):
    """Optimistic descent with a refine rule under a hard memory cap, for trees of unbounded
    depth (:class:`~canopy.tree.LazyTree`; finite-state compression, Appendix D).

    Five options, each composable with the others and with the memory bound; ``split``
    alone switches between the default and the paper's rule (``split="eq6"``: Eq. 6, the
    uniform probe of Eq. 1, ``forget="any"``, Eq. 4's radius and a cell's own statistics,
    unless ``probe``, ``forget``, ``radius`` or ``stats`` is given):

    - ``split``: ``"variance"`` (default) splits an explored leaf once one standard error of
      its mean is within its spread, ``T(v) >= V_hat(v) / spread(v)^2`` with ``V_hat`` the
      sample variance of its own probes, at least the noise's ``sigma^2`` (the model's floor;
      at least two probes). The ``ln t`` of Eq. (6) is the optimism of Eq. (4), which decides
      *where* to play; the split only decides at what resolution, and splitting loses nothing
      (the cell keeps bounding its subtree through ``B = min(U, ...)``). ``"eq6"``: Eq. (6)
      as written, ``T(v) >= c^2 ln t / spread(v)^2``.
    - ``probe``: ``"centre"`` probes a cell at its centre, through its descendant at the
      deepest level the tree allows (62 for ``b = 2``) that holds the centre of its box
      (``LazyTree.centre``: the interval's middle, or with ``dims = d`` the centre of a
      ``d``-dimensional box): a fixed point a cell, as X-armed bandits play. If ``f`` is
      Hoelder with exponent ``alpha`` around a maximum placed uniformly in the cell, the
      centre's expected gap is ``(2 + alpha) / 2^(alpha + 1)`` of a uniform point's (3/4 at
      ``alpha = 1``). ``"uniform"``: Eq. (1)'s probe, the one the data-driven spreads need.
      ``None``: ``"centre"`` under ``split="variance"`` with the assumed spread, else
      ``"uniform"``.
    - ``forget``: when a split would take the explored tree past ``max_nodes`` rows, the
      policy forgets the children of the explored node of lowest ``B`` whose children are all
      explored leaves (never the parent of the node being split); the forgotten node keeps
      its own statistics and becomes an explored leaf again, and if nothing can be forgotten
      the split waits. ``"any"`` may forget any such node (the paper's rule); ``"balanced"``
      only one the splitting cell ``v`` dominates (its ``B`` below ``v``'s lower confidence
      bound ``mean(v) - c sqrt(2 ln t / T(v))``) or one deeper than ``v`` (its region then
      stays at least as fine as ``v``'s children), so memory is shared evenly among regions
      that may hold the optimum instead of being passed back and forth between them.
      ``None``: ``"balanced"`` under ``split="variance"`` with the assumed spread, else
      ``"any"`` (the balanced rule reads depth as resolution, true of ``L rho^level`` only).
    - ``radius``: ``"moss"`` takes Eq. (4)'s radius as ``c sqrt(2 ln+(t / T(v)) / T(v))``,
      MOSS's confidence level (Audibert and Bubeck 2009, anytime form with one arm): the
      ``ln t`` of Eq. (4) pays for a bound valid at every round, while a cell played
      ``T(v)`` times needs it over the ``t / T(v)`` rounds' worth of plays it competes for,
      so a cell played often stops being explored on the optimism it no longer needs.
      ``"eq4"``: Eq. (4) as written. ``None``: ``"moss"`` under ``split="variance"`` with
      the assumed spread, else ``"eq4"``. The balanced rule's lower bound keeps ``ln t``.
    - ``stats``: ``"path"`` counts every probe made in a cell's subtree in its ``T(v)`` and
      mean (Eq. 4 as the paper states it, "updates ``mu_hat``, ``T``, ``U`` and ``B`` along
      the path"; HOO's path statistics). Each such probe is at a point of the cell, whose
      value is within ``spread(v)`` of the cell's best point (Eq. 2), so ``U(v)`` stays an
      upper bound and keeps falling after the split while the children are played: a
      suboptimal cell's subtree is dropped at the rate of the cell itself instead of anew in
      every child. An explored leaf's statistics are its own probes either way (the split
      rule reads them); a cell whose children the memory bound forgets keeps its subtree's.
      ``"own"``: the cell's own probes, frozen at its split. ``None``: ``"path"`` under
      ``split="variance"`` with the assumed spread, else ``"own"``.

    ``max_nodes=None`` is ``2 b ceil(log_b n) + 1`` with ``b`` the arity and
    ``n = budget / probe_cost`` the horizon: room for a path down to the depth a cell is
    resolved by one probe, twice over.

    ``spread`` is ``"assumed"``, ``"estimated"`` or ``"certified"`` (with ``certificate``)
    as in :class:`OptimisticDescent` (the composed certificate splits ``delta`` over the
    ``LazyTree.n_nodes_to_level(D)`` cells down to level ``D``); the estimate and the
    certificate treat a cell at ``level`` as
    ``m = b^(D - level)`` leaves, ``D = ceil(log_b n)`` (a modelling choice: the leaves of an
    infinite tree are a continuum; cells at level ``D`` and below get bonus 0 from data).
    After a run: ``depth_reached_`` (deepest level explored) and ``tree_nodes_``
    (``LazyTree.n_nodes_to_level(depth_reached_)``, the tree that depth spans).
    """

    name = "memory-bounded"
    query_kinds = ("probe",)

    def __init__(self, *, lipschitz: float = 1.0, rho: float | None = None,
                 c: float | None = None, spread: str = "assumed", max_nodes: int | None = None,
                 delta: float = 0.05, z: float = 3.0, certificate: str = DEFAULT_METHOD,
                 split: str = "variance", probe: str | None = None,
                 forget: str | None = None, radius: str | None = None,
                 stats: str | None = None) -> None:
        self.certificate = _check_certificate(certificate)
        self.split = _check_choice(split, _SPLITS, "split")
        self.probe = None if probe is None else _check_choice(probe, _PROBES, "probe")
        self.forget = None if forget is None else _check_choice(forget, _FORGETS, "forget")
        self.radius = None if radius is None else _check_choice(radius, _RADII, "radius")
        self.stats = None if stats is None else _check_choice(stats, _STATS, "stats")
        _check_schedule(lipschitz, rho, c)
        self.lipschitz, self.rho, self.c = lipschitz, rho, c
        if spread not in ("assumed", "estimated", "certified"):
            raise ValueError("spread must be 'assumed', 'estimated' or 'certified', "
                             f"got {spread!r}")
        self.spread = spread
        self.max_nodes = _check_level(max_nodes, "max_nodes")
        check_open_unit(delta, "delta")
        check_positive(z, "z")
        self.delta, self.z = delta, z

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
                    expand="refine", max_depth=None, path_stats=self.stats_ == "path",
                    c=radius_scale(self.c, self.spec_), delta=self.delta, z=self.z,
                    max_nodes=cap, certificate=self.certificate, split=self.split,
                    probe=self.probe_, forget=self.forget_, radius=self.radius_)

    @property
    def probe_(self) -> str:
        """The probe played: ``probe`` as given; by default (``None``) the paper's uniform
        probe (Eq. 1) under ``split="eq6"`` or a data-driven spread (whose estimates rest on
        uniform probes), else ``"centre"``."""
        if self.probe is not None:
            return self.probe
        return "centre" if self._variance_assumed() else "uniform"

    @property
    def forget_(self) -> str:
        """The memory bound's rule: ``forget`` as given; by default (``None``)
        ``"balanced"`` under ``split="variance"`` with the assumed spread, else the paper's
        ``"any"`` (the balanced rule reads a cell's depth as its resolution, which holds for
        the assumed spread ``L rho^level`` and not for a data-driven one)."""
        if self.forget is not None:
            return self.forget
        return "balanced" if self._variance_assumed() else "any"

    @property
    def radius_(self) -> str:
        """Eq. (4)'s radius: ``radius`` as given; by default (``None``) ``"moss"`` under
        ``split="variance"`` with the assumed spread, else Eq. (4) as written (``"eq4"``)."""
        if self.radius is not None:
            return self.radius
        return "moss" if self._variance_assumed() else "eq4"

    @property
    def stats_(self) -> str:
        """The statistics of a split cell's ``U``: ``stats`` as given; by default (``None``)
        ``"path"`` under ``split="variance"`` with the assumed spread, else the cell's own
        probes (``"own"``)."""
        if self.stats is not None:
            return self.stats
        return "path" if self._variance_assumed() else "own"

    def _variance_assumed(self) -> bool:
        """Whether the defaults of the variance-scaled split with the assumed spread apply."""
        return self.split == "variance" and self.spread == "assumed"

    @property
    def depth_reached_(self) -> int:
        """The deepest level the explored tree has reached."""
        return int(self._ctl[ex.M_DEEPEST])

    @property
    def tree_nodes_(self) -> int:
        """``LazyTree.n_nodes_to_level(depth_reached_)``: the tree that depth spans."""
        return _lazy_tree(self.spec_).n_nodes_to_level(self.depth_reached_)
