"""Fixed-budget identification on the tree (Section 3.4, Appendix B, Section 4 "Top-k").

Three policies share one skeleton: probe cells cheaply, discard cells, and end with a race of
leaf evaluations (successive rejects, ``sr_schedule``) over
the leaves that remain. They differ in how cells are discarded.

- :class:`TopKBeam`: best-first focusing. Level by level, every child of the beam is probed
  equally and the ``width`` cells of largest score ``mean + spread`` stay (not worst-case
  valid: a cell can be dropped by noise).
- :class:`TopKSound`: worst-case-valid pruning only. A cell is dropped only when at least
  ``k`` leaves elsewhere are certainly better than its best leaf (upper bound
  ``mean + radius + spread``), Theorem 2's descent.
- :class:`EdgeTargeted`: Section 3.4 / Appendix B. Detection of violation cells with cheap
  probes, successive rejects at probe cost over the unflagged cells level by level, and leaf
  certification (successive rejects with leaf evaluations) inside the deepest flagged cells.

Choices the paper leaves open, shared by all three:

- ``spread``: the bias bound of a cell at level ``l``. ``"assumed"``: ``L rho^l`` (Eq. 3);
  ``"certified"``: the certificate of Algorithm 1 on the cell's own probes (level
  ``delta`` split evenly over the cells probed, Corollary 1), with ``certificate`` choosing
  the method: the default ``"sharp"`` (and ``"betting"``/``"order"``) composes the cells'
  certificates up the tree (:class:`~canopy.certified_tree.CertifiedTree`, leaf evaluations
  included), ``"paper"`` is Algorithm 1 on each cell's own probes (the former behaviour);
  ``"hybrid"``: ``L rho^l`` unless
  the violation test of ``canopy.policies._identify_spread`` flags the cell, then the
  certificate (detect and relax).
- ``rho = None``: ``1 / b`` with ``b`` the mean number of children of internal nodes (Section
  3.1's ``rho = 1/b`` on complete trees).
- ``lipschitz = None``: estimated by a pre-pass charged to the budget: every internal child of
  the root gets ``clip(floor(0.05 B / (c_p n_1)), 8, 200)`` probes; ``L = max_v osc(v) / rho``
  with ``osc`` the oscillation estimate ``2 sqrt(3)`` times the noise-deconvolved within-cell
  deviation. The pre-pass probes also count in the descent's statistics.
- Budget split (Appendix B, step 4): equalising ``B_probe / c_0 = B_leaf / (c_l h)`` with one
  common gap and one common variance for every arm gives ``B_probe / B = c_p A_p /
  (c_p A_p + c_l A_l)``, ``A_p`` the cells the plan will probe and ``A_l`` the leaves it will
  race. Every probed cell gets the same number of probes (at least 2).
- Top-k focus: an optional keyword ``k`` (default 1) sets how many leaves the pruning and the
  final race keep; ``recommend(k)`` answers any ``k`` (survivors first, then later-rejected).
"""

from __future__ import annotations

import math
from collections.abc import Generator

import numpy as np

from canopy.certificate import DEFAULT_METHOD, METHODS, default_lambdas, state_bound
from canopy.certified_tree import CertifiedTree
from canopy.policies._bookkeeping import beam_level, children_of, concat_ranges
from canopy.policies._identify_core import Batch, PhasedPolicy
from canopy.policies._identify_spread import (
    oscillation_estimate,
    push_probes,
    radius,
    violation_test,
)
from canopy.validation import check_count, check_open_unit, check_positive

__all__ = ["EdgeTargeted", "TopKBeam", "TopKSound"]

SPREADS = ("assumed", "certified", "hybrid")
PREPASS_FRACTION = 0.05
PREPASS_PROBES = (8, 200)


class _TreeIdentifier(PhasedPolicy):
    """Shared configuration and per-cell statistics of the tree policies."""

    spread: str = "assumed"
    detect_fraction: float | None = None
    DETECT_PROBES = 6
    DEFAULT_DETECT_FRACTION = 0.5

    def _configure(self, *, lipschitz: float | None, rho: float | None, delta: float,
                   z: float, k: int, spread: str, prepass: bool,
                   certificate: str = DEFAULT_METHOD) -> None:
        if spread not in SPREADS:
            raise ValueError(f"spread must be one of {SPREADS}, got {spread!r}")
        if certificate not in METHODS:
            raise ValueError(f"certificate must be one of {METHODS}, got {certificate!r}")
        check_positive(lipschitz, "lipschitz", allow_none=True)
        check_open_unit(rho, "rho", allow_none=True)
        check_open_unit(delta, "delta")
        check_positive(z, "z")
        check_count(k, "k")
        # stored as given (scikit-learn's convention: clone rebuilds from these)
        self.certificate, self.lipschitz, self.rho = certificate, lipschitz, rho
        self.delta, self.z, self.k, self.spread, self.prepass = delta, z, k, spread, prepass
        if lipschitz is None and not prepass and spread != "certified":
            raise ValueError(f"spread={spread!r} with lipschitz=None needs prepass=True to "
                             "estimate the Lipschitz constant")

    # ------------------------------------------------------------------ state
    def _start(self) -> None:
        super()._start()
        tree = self.tree_
        self._internal = tree.n_children > 0
        n_internal = tree.n_nodes - tree.n_leaves  # every node but the root is one child
        mean_b = (tree.n_nodes - 1) / n_internal if n_internal else 2.0
        self.rho_ = self.rho if self.rho is not None else 1.0 / max(mean_b, 1.0 + 1e-9)
        self._rho_powers = self.rho_ ** np.arange(tree.depth + 1, dtype=float)
        self.lipschitz_ = self.lipschitz
        self._mean_branching = mean_b
        self._flag = np.zeros(tree.n_nodes, dtype=bool)
        self._delta_cell = self.delta
        # the certified spread's state: Algorithm 1's running states per probed cell
        # (certificate="paper") or the composed certificate of the tree
        self._cert_row: dict[int, int] = {}
        self._cert_states: np.ndarray | None = None
        self._ctree: CertifiedTree | None = None
        if self.spread != "assumed" and self.certificate == "paper":
            self._lambdas = default_lambdas(self.spec_.sigma, self.z)
            self._cert_states = np.zeros((64, 3 + 2 * self._lambdas.size))
        elif self.spread != "assumed":
            from canopy.policies.descent import spec_value_range

            self._ctree = CertifiedTree(tree, self.spec_.sigma, delta=self.delta,
                                        method=self.certificate, z=self.z,
                                        value_range=spec_value_range(self.spec_),
                                        node_delta=self.delta / tree.n_nodes)
        self.n_pruned_ = 0
        self.n_judged_ = 0

    @property
    def flagged_cells_(self) -> np.ndarray:
        """Node ids the violation test flagged, in id order."""
        self._check_started()
        return np.flatnonzero(self._flag)

    @property
    def n_violations_(self) -> int:
        """Recovered violation count: the flagged cells none of whose children is flagged
        (one per discontinuity on the event that detection succeeds)."""
        return int(self._deepest_flagged().size)

    def _deepest_flagged(self) -> np.ndarray:
        self._check_started()
        flagged = np.flatnonzero(self._flag)
        parents = self.tree_.parent[flagged]
        has_flagged_child = np.zeros(self.tree_.n_nodes, dtype=bool)
        has_flagged_child[parents[parents >= 0]] = True
        return flagged[~has_flagged_child[flagged]]

    def _fold(self, kind: str, nodes: np.ndarray, values: np.ndarray) -> None:
        super()._fold(kind, nodes, values)
        if self._ctree is not None:
            self._ctree.update_many(nodes, values)
        elif kind == "probe" and self._cert_states is not None:
            rows = self._cert_rows(nodes)
            push_probes(self._cert_states, rows, values, self._lambdas, self.spec_.sigma,
                        self.z)

    def _cert_rows(self, nodes: np.ndarray) -> np.ndarray:
        """Rows of the certificate states of ``nodes`` (allocated on first sight)."""
        row_of = self._cert_row
        for node in np.unique(nodes).tolist():
            if node not in row_of:
                row_of[node] = len(row_of)
        if len(row_of) > self._cert_states.shape[0]:
            grown = np.zeros((2 * len(row_of), self._cert_states.shape[1]))
            grown[:self._cert_states.shape[0]] = self._cert_states
            self._cert_states = grown
        return np.array([row_of[node] for node in nodes.tolist()], dtype=np.int64)

    # ------------------------------------------------------------------ cell quantities
    def _floor(self, nodes: np.ndarray) -> np.ndarray:
        """The assumed schedule ``L rho^level`` of Eq. (3)."""
        return self.lipschitz_ * self._rho_powers[self.tree_.level[nodes]]

    def _certified(self, nodes: np.ndarray) -> np.ndarray:
        """The certified bias bound per cell: composed (at level ``delta_cell`` per node),
        or Algorithm 1's on the cell's own probes (``inf`` below two) with
        ``certificate="paper"``."""
        if self._ctree is not None:
            self._sync_ctree()
            return np.asarray(self._ctree.bound(nodes), dtype=float)
        tree = self.tree_
        out = np.full(nodes.size, np.inf)
        log_m = np.log(tree.leaf_hi[nodes] - tree.leaf_lo[nodes])
        for i, node in enumerate(nodes.tolist()):
            row = self._cert_row.get(node)
            if row is not None:
                out[i] = state_bound(self._cert_states[row], self._lambdas, float(log_m[i]),
                                     self.spec_.sigma, self._delta_cell, self.z)
        return np.minimum(out, 1.0 + self.z * self.spec_.sigma)

    def _sync_ctree(self) -> None:
        if self._ctree is not None and self._ctree.node_delta != self._delta_cell:
            self._ctree.set_node_delta(self._delta_cell)

    def _certified_upper(self, nodes: np.ndarray) -> np.ndarray:
        """Certified upper bound on the best leaf of each cell (``inf`` without a composed
        certificate)."""
        if self._ctree is None:
            return np.full(nodes.size, np.inf)
        self._sync_ctree()
        return np.asarray(self._ctree.upper(nodes), dtype=float)

    def _test(self, nodes: np.ndarray) -> None:
        """Run the violation test on ``nodes`` and record the flags."""
        hit = violation_test(self._node_n[nodes], self._probe_m2(nodes), self.spec_.sigma,
                             self._floor(nodes), self._delta_cell)
        self._flag[nodes[hit]] = True

    def _spread(self, nodes: np.ndarray) -> np.ndarray:
        if self.spread == "assumed":
            return self._floor(nodes)
        if self.spread == "certified":
            return self._certified(nodes)
        self._test(nodes)
        flagged = self._flag[nodes]
        out = self._floor(nodes)
        if flagged.any():
            out[flagged] = self._certified(nodes[flagged])
        return out

    def _radius(self, nodes: np.ndarray) -> np.ndarray:
        """Confidence radius of the probe means; sub-Gaussian where smoothness is assumed,
        empirical Bernstein where it is certified or flagged."""
        n, m2 = self._node_n[nodes], self._probe_m2(nodes)
        sigma = self.spec_.sigma
        if self.spread == "certified":
            return radius(n, m2, sigma, None, self._delta_cell, self.z)
        out = radius(n, m2, sigma, self._floor(nodes), self._delta_cell, self.z)
        flagged = self._flag[nodes]
        if self.spread == "hybrid" and flagged.any():
            out[flagged] = radius(n[flagged], m2[flagged], sigma, None, self._delta_cell,
                                  self.z)
        return out

    # ------------------------------------------------------------------ plan pieces
    def _children(self, nodes: np.ndarray) -> np.ndarray:
        return children_of(self.tree_.child_ptr, self.tree_.child_ids, nodes)

    def _leaf_nodes_below(self, cells: np.ndarray) -> np.ndarray:
        tree = self.tree_
        return tree.leaf_node[concat_ranges(tree.leaf_lo[cells], tree.leaf_hi[cells])]

    def _probe_split(self, probe_cells: float, race_leaves: float) -> int:
        """Probes per cell from the budget split of Appendix B, step 4 (module docstring)."""
        cp, cl = self.spec_.probe_cost, self.spec_.leaf_cost
        if probe_cells <= 0:
            return 0
        share = cp * probe_cells / (cp * probe_cells + cl * max(race_leaves, 1.0))
        return max(int(share * self.remaining / (cp * probe_cells)), 2)

    def _maybe_prepass(self) -> Generator[Batch, None, None]:
        """Estimate ``L`` from the root's internal children when it is not given."""
        if self.lipschitz_ is not None:
            return
        if not self.prepass:
            self.lipschitz_ = 1.0  # unused: certified spread, no floor needed
            return
        tree = self.tree_
        cells = tree.children(tree.root)
        cells = cells[self._internal[cells]]
        if cells.size == 0:
            self.lipschitz_ = 1.0
            return
        low, high = PREPASS_PROBES
        n_pre = int(PREPASS_FRACTION * self.ledger_.budget
                    / (self.spec_.probe_cost * cells.size))
        yield from self._top_up("probe", cells, min(max(n_pre, low), high))
        osc = oscillation_estimate(self._node_n[cells], self._probe_m2(cells), self.spec_.sigma)
        level_scale = self._rho_powers[tree.level[cells]]
        self.lipschitz_ = max(float(np.max(osc / level_scale)), 1e-9)

    def _detect(self, delta: float) -> Generator[Batch, None, np.ndarray]:
        """Two-look detection at level ``delta`` over the detection level, then the children
        of flagged cells; returns the cells of the detection level (:class:`EdgeTargeted`,
        step 1)."""
        tree = self.tree_
        fraction = (self.DEFAULT_DETECT_FRACTION if self.detect_fraction is None
                    else self.detect_fraction)
        cp = self.spec_.probe_cost
        stop = self.ledger_.spent + fraction * self.remaining
        counts = self.tree_.internal_per_level
        first_look = fraction * self.remaining / 2.0
        affordable = np.flatnonzero(
            (counts[1:] > 0) & (counts[1:] * self.DETECT_PROBES * cp <= first_look)) + 1
        level = int(affordable.max()) if affordable.size else 1
        cells = np.flatnonzero(self._internal & (tree.level == level))
        if cells.size == 0:
            return cells
        # Half of delta to the detection level (two looks per cell), half to the children
        # of flagged cells (one look each, at most as many cells again).
        self._delta_cell = delta / (4.0 * cells.size)
        n_first = max(int(first_look / (cells.size * cp)), self.DETECT_PROBES)
        yield from self._top_up("probe", cells, n_first)
        self._test(cells)
        self._set_scores(cells, self._probe_mean(cells))
        yield from self._second_look(cells, stop, deeper=level < tree.depth - 1)
        self._delta_cell = delta / (2.0 * cells.size)
        unit = n_first * cp
        tested = self._children(cells[self._flag[cells]])
        tested = tested[self._internal[tested]]
        while tested.size and self.ledger_.spent + tested.size * unit <= stop:
            yield from self._top_up("probe", tested, n_first)
            self._test(tested)
            self._set_scores(tested, self._probe_mean(tested))
            kids = self._children(tested[self._flag[tested]])
            tested = kids[self._internal[kids]]
        return cells

    def _second_look(self, cells: np.ndarray, stop: float, *, deeper: bool
                     ) -> Generator[Batch, None, None]:
        """Give the ``ceil(sqrt(cells))`` unflagged cells of largest probe spread the rest of
        the detection budget (half of it when flagged cells' children will be tested too)
        and test them again on all their probes."""
        suspects = cells[~self._flag[cells]]
        order = np.argsort(-self._probe_m2(suspects), kind="stable")
        suspects = np.sort(suspects[order[:math.ceil(math.sqrt(cells.size))]])
        money = (stop - self.ledger_.spent) / (2.0 if deeper else 1.0)
        extra = int(money / (max(suspects.size, 1) * self.spec_.probe_cost))
        if suspects.size and extra > 0:
            yield from self._top_up("probe", suspects, int(self._node_n[suspects].max()) + extra)
            self._test(suspects)
            self._set_scores(suspects, self._probe_mean(suspects))

    def _final_race(self, candidates: np.ndarray) -> Generator[Batch, None, None]:
        """Successive rejects with leaf evaluations over the candidate leaf nodes (all other
        leaves rank after them, :meth:`_retire`); when the
        budget is short, the best-scored
        :func:`~canopy.policies._identify_core.halving_entrants` of them race (the probes'
        ranking chooses the entrants, the leaf evaluations decide)."""
        self._retire(candidates)
        if candidates.size:
            yield from self._race("leaf", candidates, self._affordable_count("leaf"), self.k,
                                  focus=True)


class TopKBeam(_TreeIdentifier):
    """Top-k identification by best-first focusing (Section 4, App. D; beam width 20).

    From the root's children down, each level's cells are probed equally (the budget split of
    the module docstring, planned for ``min(cells at the level, width b)`` cells per level and
    ``width b`` raced leaves), scored by ``mean + spread`` (the beam score), and the ``width``
    best stay (``max(width, k)``); their children form the next level. Leaves met on the way
    join the candidates, which a successive-rejects race of leaf evaluations ranks with all
    the budget left. With ``spread="hybrid"`` (detect and relax) the beam is preceded by
    :class:`EdgeTargeted`'s two-look detection at level ``delta / 2`` (half the budget); the
    leaves of the deepest flagged cells join the candidates, scored with their cells'
    certified spread, and the beam's own tests get the other ``delta / 2``.

    Args:
        width: beam width.
        spread: ``"assumed"``, ``"certified"`` or ``"hybrid"`` (module docstring).
        lipschitz, rho: the schedule ``L rho^l``; ``None`` estimates/derives them.
        prepass: run the charged pre-pass that estimates ``L`` when it is ``None``.
        delta: confidence level, split evenly over the probed cells.
        z: truncation level of the certificate.
        k: how many leaves the beam and the race focus on.
        certificate: the certificate method of the certified/hybrid spread (module
            docstring).
    """

    name = "canopy-beam"

    def __init__(self, *, width: int = 20, spread: str = "assumed",
                 lipschitz: float | None = None, rho: float | None = None,
                 prepass: bool = True, delta: float = 0.05, z: float = 3.0, k: int = 1,
                 certificate: str = DEFAULT_METHOD) -> None:
        check_count(width, "width")
        self.width = width
        self._configure(lipschitz=lipschitz, rho=rho, delta=delta, z=z, k=k, spread=spread,
                        prepass=prepass, certificate=certificate)

    def _plan(self) -> Generator[Batch, None, None]:
        tree = self.tree_
        width = max(self.width, self.k)
        per_level = np.minimum(tree.internal_per_level[1:], width * self._mean_branching)
        yield from self._maybe_prepass()
        candidates: list[np.ndarray] = []
        beam_delta = self.delta
        if self.spread == "hybrid":
            # Detect and relax: EdgeTargeted's detection first (half of delta), then the
            # flagged cells' leaves join the candidates.
            beam_delta = self.delta / 2.0
            yield from self._detect(beam_delta)
            deepest = self._deepest_flagged()
            candidates.append(self._leaf_nodes_below(deepest))
        self._delta_cell = beam_delta / max(float(per_level.sum()), 1.0)
        n_probe = self._probe_split(float(per_level.sum()),
                                    min(tree.n_leaves, width * self._mean_branching))
        frontier = tree.children(tree.root)
        cells = frontier[self._internal[frontier]]
        candidates.append(frontier[~self._internal[frontier]])
        while cells.size:
            yield from self._top_up("probe", cells, n_probe)
            cells, leaves = self._beam_level(cells, width)
            candidates.append(leaves)
        if self.spread == "hybrid":
            # Relax: flagged cells are scored with their certified spread, so their leaves
            # enter the final race ahead of the smooth beam's.
            deepest = self._deepest_flagged()
            self._set_scores(deepest, self._probe_mean(deepest) + self._spread(deepest))
        yield from self._final_race(np.unique(np.concatenate(candidates)))

    def _beam_level(self, cells: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
        """Score the probed ``cells`` (``mean + spread``), keep the ``width`` best, and return
        their children: internal cells (the next level) and leaves (:func:`beam_level`)."""
        tree = self.tree_
        event = self._events
        if cells.size > width:
            self._events += 1
        return beam_level(cells, self._spread(cells), width, self._node_sum, self._node_n,
                          tree.n_children, tree.child_ptr, tree.child_ids, self._tiebreak,
                          tree.leaf_lo, tree.leaf_hi, self._stage, self._score, event)


class TopKSound(_TreeIdentifier):
    """Top-k identification with worst-case-valid pruning only (Theorem 2's descent).

    Level by level, every surviving cell is probed equally (the budget split re-planned at
    each level from the survivors: ``A_p`` their internal descendants, ``A_l`` their
    leaves), and a cell ``u`` is pruned when at least ``k`` leaves elsewhere are certainly
    better than ``u``'s best leaf, whose upper bound is ``mean + radius + spread``. Witnesses:
    every cell ``v`` holds one leaf at least ``mean_v - radius_v``; where smoothness is
    assumed (``"assumed"``, or ``"hybrid"`` and unflagged) all its ``m_v`` leaves are at least
    ``mean_v - radius_v - L rho^l``. Survivors' children form the next level; the surviving
    leaves are ranked by a successive-rejects race of leaf evaluations. Leaves are scored by
    their cell's probe mean (the certified spread is dominated by confidence terms at these
    sample sizes, so it would rank cells by noise).

    With a composed certificate a certified cell's upper bound is also at most the
    certificate's upper bound on its best leaf. After a run, ``n_pruned_`` of the
    ``n_judged_`` cells examined were pruned.

    Args: as :class:`TopKBeam`, without ``width``; ``spread`` defaults to ``"certified"``.
    """

    name = "canopy-sound"

    def __init__(self, *, spread: str = "certified", lipschitz: float | None = None,
                 rho: float | None = None, prepass: bool = True, delta: float = 0.05,
                 z: float = 3.0, k: int = 1, certificate: str = DEFAULT_METHOD) -> None:
        self._configure(lipschitz=lipschitz, rho=rho, delta=delta, z=z, k=k, spread=spread,
                        prepass=prepass, certificate=certificate)

    def _plan(self) -> Generator[Batch, None, None]:
        tree = self.tree_
        self._delta_cell = self.delta / max(float(self._internal.sum() - 1), 1.0)
        yield from self._maybe_prepass()
        frontier = tree.children(tree.root)
        candidates: list[np.ndarray] = []
        while frontier.size:
            cells = frontier[self._internal[frontier]]
            candidates.append(frontier[~self._internal[frontier]])
            if cells.size == 0:
                break
            below = self._internal_below(cells)
            leaves = float(np.sum(tree.leaf_hi[cells] - tree.leaf_lo[cells]))
            yield from self._top_up("probe", cells, self._probe_split(below, leaves))
            cells = self._prune(cells)
            frontier = self._children(cells)
        yield from self._final_race(np.concatenate(candidates))

    def _internal_below(self, cells: np.ndarray) -> float:
        """Internal nodes in the subtrees of ``cells`` (themselves included), from the leaf
        counts: a subtree with ``m`` leaves and mean branching ``b`` has ``(m-1)/(b-1)``."""
        tree = self.tree_
        m = (tree.leaf_hi[cells] - tree.leaf_lo[cells]).astype(float)
        b = max(self._mean_branching, 1.0 + 1e-9)
        return float(np.sum(np.maximum((m - 1.0) / (b - 1.0), 1.0)))

    def _prune(self, cells: np.ndarray) -> np.ndarray:
        """Drop the cells that provably hold none of the top ``k`` leaves; returns the rest."""
        tree = self.tree_
        mean = self._probe_mean(cells)
        spread = self._spread(cells)
        rad = self._radius(cells)
        upper = mean + rad + spread
        lower = mean - rad
        self._set_scores(cells, mean)
        smooth = np.zeros(cells.size, dtype=bool) if self.spread == "certified" else (
            ~self._flag[cells])
        if self._ctree is not None:  # the composed certificate bounds the best leaf directly
            upper = np.where(smooth, upper, np.minimum(upper, self._certified_upper(cells)))
        size = (tree.leaf_hi[cells] - tree.leaf_lo[cells]).astype(float)
        values = np.concatenate([lower, (lower - self._floor(cells))[smooth]])
        counts = np.concatenate([np.ones(cells.size), np.maximum(size[smooth] - 1.0, 0.0)])
        order = np.argsort(values)
        values, tail = values[order], np.cumsum(counts[order][::-1])[::-1]
        above = np.searchsorted(values, upper, side="right")
        n_better = np.where(above < values.size, tail[np.minimum(above, values.size - 1)], 0.0)
        out = n_better >= self.k
        self.n_judged_ += int(cells.size)
        self.n_pruned_ += int(out.sum())
        if out.any():
            self._reject(cells[out], mean[out])
        return cells[~out]


class EdgeTargeted(_TreeIdentifier):
    """The edge-targeted fixed-budget algorithm (Section 3.4, Theorem 2, Appendix B).

    1. Detection (budget ``detect_fraction B``, default 0.5), in two looks. The detection
       level is the deepest level whose cells can each get ``DETECT_PROBES = 6`` probes from
       half the detection budget (on a complete tree with budget enough, the penultimate
       cells, as Appendix B asks). First look: every internal cell there gets an equal share
       of that half and the violation test at floor ``L rho^l``. Second look: the
       ``ceil(sqrt(cells))`` unflagged cells of largest probe spread get the rest of the
       detection budget (half of it when the level is above the penultimate one) and are
       tested again on all their probes. Each look's sample size is fixed in advance, so a
       Bonferroni split ``delta / (4 cells)`` per look keeps the chance of flagging any
       smooth cell below ``delta / 2`` although the second look picks its cells from data.
       Then the internal children of flagged cells are tested in turn (``delta / (2 cells)``
       each) while the detection budget lasts. ``flagged_cells_`` and
       ``n_violations_`` read the outcome.
    2. Smooth search: successive rejects at probe cost over the unflagged cells of the
       detection level keep ``k``; their unflagged internal children race the same way, level
       by level, with the smooth budget split evenly over the levels. The winners' leaf
       children become candidates.
    3. Leaf certification: the leaves of the deepest flagged cells join the candidates, and a
       successive-rejects race of leaf evaluations ranks them with the budget left.

    The smooth/certification split is Appendix B's step 4 plug-in (module docstring) with
    ``A_p`` the unflagged detection cells plus ``b`` per level below and ``A_l`` the
    candidate leaves.

    Args:
        lipschitz, rho: the schedule ``L rho^l``; ``None`` estimates ``L`` by the pre-pass.
        delta: level of the violation test and the certificates.
        z: truncation level of the certificate.
        detect_fraction: share of the budget the detection may spend (``None``: 0.5).
        k: how many leaves the races keep.
        certificate: the certificate method of flagged cells' spread (module docstring).
    """

    name = "canopy-edge"

    def __init__(self, *, lipschitz: float | None = None, rho: float | None = None,
                 delta: float = 0.05, z: float = 3.0, detect_fraction: float | None = None,
                 k: int = 1, certificate: str = DEFAULT_METHOD) -> None:
        self._configure(lipschitz=lipschitz, rho=rho, delta=delta, z=z, k=k, spread="hybrid",
                        prepass=True, certificate=certificate)
        check_open_unit(detect_fraction, "detect_fraction", allow_none=True)
        self.detect_fraction = detect_fraction

    def _plan(self) -> Generator[Batch, None, None]:
        tree = self.tree_
        yield from self._maybe_prepass()
        cells = yield from self._detect(self.delta)
        deepest = self._deepest_flagged()
        uncovered = self._leaves_outside(cells)
        cert_leaves = float(np.sum(tree.leaf_hi[deepest] - tree.leaf_lo[deepest]) + uncovered.size)
        smooth = cells[~self._flag[cells]]
        levels_below = max(tree.depth - 1 - int(tree.level[cells].max(initial=0)), 0)
        probe_arms = smooth.size + self._mean_branching * levels_below
        n_probe = self._probe_split(probe_arms, cert_leaves + self._mean_branching * self.k)
        smooth_budget = n_probe * probe_arms * self.spec_.probe_cost
        winners = yield from self._smooth_search(smooth, smooth_budget, levels_below + 1)
        candidates = np.unique(np.concatenate([winners, uncovered,
                                               self._leaf_nodes_below(deepest)]))
        self._score[tree.node_leaf[uncovered]] = np.inf  # unprobed: optimism wins them entry
        yield from self._final_race(candidates)

    def _leaves_outside(self, cells: np.ndarray) -> np.ndarray:
        """Leaf nodes under none of ``cells``: on an irregular tree, leaves shallower than the
        detection level. No probe can rank them against each other, so they go straight to the
        leaf-certification race (a good model that is a shallow leaf must stay a candidate)."""
        tree = self.tree_
        covered = np.zeros(tree.n_leaves + 1, dtype=np.int64)
        np.add.at(covered, tree.leaf_lo[cells], 1)
        np.add.at(covered, tree.leaf_hi[cells], -1)
        return tree.leaf_node[np.cumsum(covered)[:-1] == 0]

    def _smooth_search(self, arms: np.ndarray, budget: float, n_levels: int
                       ) -> Generator[Batch, None, np.ndarray]:
        """Level-by-level successive rejects at probe cost over unflagged cells; returns the
        winners' leaf children (leaf nodes)."""
        found: list[np.ndarray] = []
        per_level = budget / max(n_levels, 1)
        while arms.size:
            pulls = self._affordable_count("probe", per_level)
            winners = yield from self._race("probe", arms, pulls, self.k)
            kids = self._children(winners)
            found.append(kids[~self._internal[kids]])
            kids = kids[self._internal[kids]]
            arms = kids[~self._flag[kids]]
        return np.concatenate(found) if found else np.zeros(0, dtype=np.int64)
