"""Shared machinery of the fixed-budget policies (identification and structure-blind baselines).

- :class:`TreeStatsPolicy`: running sums of probes per node and of evaluations per leaf, and the
  ranking every policy answers ``recommend(k)`` from. Leaves carry a *stage* (how long they
  survived: never rejected ranks first, then later rejections before earlier ones) and a
  *score* (their own empirical mean once evaluated, else the score of the cell they were
  pruned with); ties fall to a seeded random permutation, so any ``1 <= k <= n_leaves`` gets
  ``k`` distinct leaves and the same seed gives the same answer.
- :class:`PhasedPolicy`: the ask/tell form of a phase-based algorithm. A subclass writes
  :meth:`PhasedPolicy._plan` as a generator that yields one batch ``(kind, node ids)`` per
  phase and reads the statistics after each ``yield``: the next batch is planned only when
  every query of the previous one has been told. So with several asks in flight, ``ask``
  answers ``None`` at a phase boundary until the outstanding queries are told (the barrier);
  in the sequential :func:`canopy.run.run` loop this never happens. Phases are planned from
  :attr:`Policy.remaining`, and the base class refuses any query the budget cannot pay for.
  A generator cannot be pickled, so the plan's inputs are kept as data instead: every batch
  of observations folded into the statistics and the ledger at every resumption of the plan
  (the plan reads nothing else that changes). Unpickling starts the policy again from its
  recorded seed and replays the plan against that log, which brings the plan to the same
  point with bit-identical statistics; the log is dropped once the plan is done.
- :func:`sr_schedule`: the phase lengths of successive rejects (Audibert, Bubeck and Munos,
  2010), generalised to stop when ``keep`` arms remain, and the race built on it.
"""

from __future__ import annotations

import copy
import itertools
import math
from abc import abstractmethod
from collections.abc import Generator

import numpy as np

from canopy.policies._bookkeeping import (
    add_moments,
    all_within,
    fill_leaves,
    keep_best,
    keep_best_means,
    means_at,
    round_robin,
)
from canopy.policies.base import Policy, check_k, top_k
from canopy.problem import ProblemSpec, Query, QueryBatch
from canopy.tree import Tree
from canopy.validation import check_count

__all__ = ["Batch", "PhasedPolicy", "TreeStatsPolicy", "halving_entrants", "sr_schedule"]

Batch = tuple[str, np.ndarray]
ALIVE = np.iinfo(np.int64).max


def sr_schedule(n_arms: int, n_pulls: int, keep: int = 1) -> np.ndarray:
    """Cumulative pulls per surviving arm after each phase of successive rejects.

    Audibert et al. (2010): with ``K`` arms and ``n`` pulls, phase ``j = 1..K-1`` brings every
    surviving arm to ``n_j = ceil((n - K) / (logbar(K) (K + 1 - j)))`` pulls, with
    ``logbar(K) = 1/2 + sum_{i=2}^K 1/i``, and then rejects the empirically worst arm. Stopping
    when ``keep = m`` arms remain (phases ``j = 1..K-m``) the same count gives
    ``logbar_m(K) = m/(m+1) + sum_{i=m+1}^K 1/i``, which is ``logbar(K)`` at ``m = 1``; the total
    ``sum_j n_j + m n_{K-m}`` stays at most ``n``. At ``n = K`` the formula gives 0 and every
    arm gets its one pull; below ``n = K`` entries are 0 (the race first cuts arms).
    """
    keep = max(int(keep), 1)
    if n_arms <= keep:
        return np.zeros(0, dtype=np.int64)
    logbar = keep / (keep + 1) + float(np.sum(1.0 / np.arange(keep + 1, n_arms + 1)))
    phase = np.arange(1, n_arms - keep + 1)
    counts = np.ceil((n_pulls - n_arms) / (logbar * (n_arms + 1 - phase)))
    return np.maximum(counts, 1 if n_pulls >= n_arms else 0).astype(np.int64)


def halving_entrants(n_pulls: int, keep: int) -> int:
    """The most arms ``A`` a race of ``n_pulls`` observations can take while every arm still
    gets one observation in each of the ``ceil(log2(A / keep))`` rounds that halving ``A``
    down to ``keep`` takes: the largest ``A >= keep`` with ``A ceil(log2(A / keep)) <=
    n_pulls`` (``keep`` when even that fails). With fewer pulls than this, a race decides on
    single observations, which at the noise of a leaf evaluation is a coin toss."""
    keep, n_pulls = max(int(keep), 1), int(n_pulls)
    best, rounds = keep, 1
    # the arms A with ceil(log2(A / keep)) = r are keep 2^(r-1) < A <= keep 2^r; the most of
    # them that fit is min(keep 2^r, n_pulls // r), if that is still above keep 2^(r-1)
    while keep << (rounds - 1) < n_pulls // rounds:
        best = max(best, min(keep << rounds, n_pulls // rounds))
        rounds += 1
    return best


class TreeStatsPolicy(Policy):
    """Per-node probe sums, per-leaf evaluation sums, and the stage/score ranking."""

    def _start(self) -> None:
        tree = self.spec_.tree
        if not isinstance(tree, Tree):
            raise TypeError(f"{type(self).__name__} needs a finite Tree, got "
                            f"{type(tree).__name__}")
        self.tree_ = tree
        n_nodes, n_leaves = tree.n_nodes, tree.n_leaves
        # one allocation per shape: separate large arrays cost a page-mapping each
        self._node_n, self._node_sum, self._node_sq = np.zeros((3, n_nodes))
        self._leaf_n, self._leaf_sum = np.zeros((2, n_leaves))
        self._stage = np.full(n_leaves, ALIVE, dtype=np.int64)
        self._score = np.full(n_leaves, -np.inf)
        self._events = 0
        self._tiebreak = self.rng_.permutation(n_leaves)

    def _observe(self, query: Query, value: float) -> None:
        node = query.node
        if query.kind == "probe":
            self._node_n[node] += 1.0
            self._node_sum[node] += value
            self._node_sq[node] += value * value
        else:
            leaf = self.tree_.node_leaf[node]
            self._leaf_n[leaf] += 1.0
            self._leaf_sum[leaf] += value

    def _fold(self, kind: str, nodes: np.ndarray, values: np.ndarray) -> None:
        """Add a batch of observations of one kind (node ids, values) to the statistics."""
        if kind == "probe":
            add_moments(self._node_n, self._node_sum, self._node_sq, nodes, values)
        else:
            add_moments(self._leaf_n, self._leaf_sum, None, self.tree_.node_leaf[nodes],
                         values)

    # ------------------------------------------------------------------ statistics
    def _probe_mean(self, nodes: np.ndarray) -> np.ndarray:
        return means_at(self._node_sum, self._node_n, nodes)

    def _probe_m2(self, nodes: np.ndarray) -> np.ndarray:
        """Sum of squared deviations from the mean of each node's probes."""
        n = self._node_n[nodes]
        with np.errstate(invalid="ignore", divide="ignore"):
            m2 = self._node_sq[nodes] - np.where(n > 0, self._node_sum[nodes] ** 2 / n, 0.0)
        return np.maximum(m2, 0.0)

    def _leaf_mean(self, leaves: np.ndarray) -> np.ndarray:
        return means_at(self._leaf_sum, self._leaf_n, leaves)

    def _arm_mean(self, kind: str, nodes: np.ndarray) -> np.ndarray:
        """Empirical means of arms given as node ids: probe means, or leaf means for leaf
        nodes (``-inf`` for an arm not yet observed)."""
        if kind == "probe":
            return self._probe_mean(nodes)
        return self._leaf_mean(self.tree_.node_leaf[nodes])

    def _arm_order(self, scores: np.ndarray, nodes: np.ndarray) -> np.ndarray:
        """Positions of ``nodes`` from best to worst score, ties by the seeded permutation."""
        return np.lexsort((self._tiebreak[self.tree_.leaf_lo[nodes]], -scores))

    # ------------------------------------------------------------------ ranking
    def _reject(self, nodes: np.ndarray, scores: np.ndarray) -> None:
        """One rejection event: every leaf below ``nodes`` ranks after the survivors and after
        later rejections, ordered inside the event by ``scores`` (their cells' scores)."""
        nodes = np.atleast_1d(nodes)
        fill_leaves(self._stage, nodes, self.tree_.leaf_lo, self.tree_.leaf_hi,
                    np.full(nodes.size, self._events, dtype=np.int64))
        self._set_scores(nodes, scores)
        self._events += 1

    def _keep_best(self, nodes: np.ndarray, scores: np.ndarray, n_keep: int) -> np.ndarray:
        """Keep the ``n_keep`` of ``nodes`` of best score (ties by the seeded permutation) and
        reject the others in one event (:meth:`_reject`); returns the kept nodes in their
        given order."""
        tree = self.tree_
        kept = keep_best(nodes, np.asarray(scores, dtype=float), int(n_keep), self._tiebreak,
                         tree.leaf_lo, tree.leaf_hi, self._stage, self._score, self._events)
        self._events += 1
        return kept

    def _keep_best_means(self, kind: str, arms: np.ndarray, n_keep: int) -> np.ndarray:
        """:meth:`_keep_best` scored by the arms' empirical means (:meth:`_arm_mean`)."""
        tree = self.tree_
        if kind == "probe":
            index, total, count = arms, self._node_sum, self._node_n
        else:
            index, total, count = tree.node_leaf[arms], self._leaf_sum, self._leaf_n
        kept = keep_best_means(arms, index, total, count, int(n_keep), self._tiebreak,
                               tree.leaf_lo, tree.leaf_hi, self._stage, self._score,
                               self._events)
        self._events += 1
        return kept

    def _retire(self, keep: np.ndarray) -> None:
        """One rejection event for every surviving leaf outside the leaf nodes ``keep``
        (each keeps its current score); the leaves ``keep`` survive, also those an earlier
        event had rejected (a flagged cell's leaves, re-admitted by leaf certification)."""
        alive = self._stage == ALIVE
        kept = self.tree_.node_leaf[keep]
        alive[kept] = False
        self._stage[alive] = self._events
        self._stage[kept] = ALIVE
        self._events += 1

    def _set_scores(self, nodes: np.ndarray, scores: np.ndarray) -> None:
        """Provisional score of the leaves below surviving cells (deeper cells overwrite);
        one score per node."""
        fill_leaves(self._score, nodes, self.tree_.leaf_lo, self.tree_.leaf_hi,
                    np.asarray(scores, dtype=float))

    def recommend(self, k: int = 1) -> np.ndarray:
        """The ``k`` leaves ranked best: survivors first, then by stage; inside a stage by
        empirical leaf mean where evaluated, else by the score of the leaf's cell."""
        self._check_started()
        k = check_k(k, self.tree_.n_leaves)
        score = self._score.copy()
        seen = self._leaf_n > 0
        score[seen] = self._leaf_sum[seen] / self._leaf_n[seen]
        return top_k(k, -self._stage, -score, self._tiebreak)


class PhasedPolicy(TreeStatsPolicy):
    """A phase-based algorithm driven through ask/tell by a generator of batches.

    Per-query work is kept to list operations: a batch is turned into :class:`Query`
    objects a chunk at a time, and observations are buffered and folded into the statistics
    in one vectorised step (:meth:`_fold`) when the plan resumes or a recommendation is asked
    (the plan reads statistics only at phase boundaries)."""

    CHUNK = 4096
    _within = staticmethod(all_within)
    # the ask/tell plumbing a checkpoint carries as it is; the rest is rebuilt by replay
    _PLUMBING = ("ledger_", "rng_", "_outstanding", "_held", "_batches", "_tokens",
                 "_batch_kind", "_batch_nodes", "_batch_pos", "_chunk", "_chunk_pos", "_buffer",
                 "_arrays", "_log", "_plan_done")

    def start(self, spec: ProblemSpec, *, budget: float,
              seed: int | np.random.Generator | None = None) -> PhasedPolicy:
        """As :meth:`Policy.start`, keeping the seed's state for a replay of the plan."""
        rng = np.random.default_rng(seed)
        self._rng_at_start = copy.deepcopy(rng)  # where a replay of the plan starts from
        return super().start(spec, budget=budget, seed=rng)

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state.pop("_plan_iter", None)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        if "_log" not in state:
            return  # pickled before start: configuration only
        if state["_plan_done"]:
            self._plan_iter = iter(())
            return
        self.start(self.spec_, budget=self.ledger_.budget,
                   seed=copy.deepcopy(state["_rng_at_start"]))
        for entry in state["_log"]:
            if isinstance(entry, tuple):
                self._fold(*entry)
            else:  # the ledger as the plan saw it when it resumed
                self.ledger_ = copy.copy(entry)
                next(self._plan_iter, None)
        for name in self._PLUMBING:
            setattr(self, name, state[name])

    def _start(self) -> None:
        super()._start()
        self._log: list = []  # folded batches and ledgers at resumptions, for a replay
        self._plan_done = False
        self._batch_kind = "leaf"
        self._batch_nodes = np.zeros(0, dtype=np.int64)
        self._batch_pos = 0
        self._chunk: list[Query] = []
        self._chunk_pos = 0
        self._buffer: dict[str, tuple[list, list]] = {"probe": ([], []), "leaf": ([], [])}
        self._arrays: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {"probe": [],
                                                                         "leaf": []}
        self._plan_iter = self._plan()

    def _observe(self, query: Query, value: float) -> None:
        nodes, values = self._buffer[query.kind]
        nodes.append(query.node)
        values.append(value)

    def _flush(self) -> None:
        """Fold the buffered observations into the statistics."""
        for kind, (nodes, values) in self._buffer.items():
            if nodes:
                self._record(kind, np.array(nodes, dtype=np.int64), np.array(values, dtype=float))
                nodes.clear()
                values.clear()
        for kind, parts in self._arrays.items():
            if len(parts) == 1:
                self._record(kind, *parts[0])
            elif parts:
                self._record(kind, np.concatenate([n for n, _ in parts]),
                             np.concatenate([v for _, v in parts]))
            parts.clear()

    def _record(self, kind: str, nodes: np.ndarray, values: np.ndarray) -> None:
        """Fold a batch into the statistics and keep it in the replay log while the plan
        runs."""
        self._fold(kind, nodes, values)
        if not self._plan_done:
            self._log.append((kind, nodes, values))

    def recommend(self, k: int = 1) -> np.ndarray:
        self._check_started()
        self._flush()
        return super().recommend(k)

    @abstractmethod
    def _plan(self) -> Generator[Batch, None, None]:
        """Yield ``(kind, node ids)`` batches; statistics are complete after each yield."""

    def _next_query(self) -> Query | None:
        pos = self._chunk_pos
        if pos < len(self._chunk):
            self._chunk_pos = pos + 1
            return self._chunk[pos]
        if not self._advance():
            return None
        stop = self._batch_pos + self.CHUNK
        kind = self._batch_kind
        self._chunk = [Query(kind, node) for node in
                       self._batch_nodes[self._batch_pos:stop].tolist()]
        self._batch_pos = min(stop, self._batch_nodes.size)
        self._chunk_pos = 1
        return self._chunk[0]

    def _advance(self) -> bool:
        """Make the current plan batch have queries left: plan the next phase once every
        observation of this one is in. ``False`` at a barrier or when the plan is done."""
        while self._batch_pos >= self._batch_nodes.size:
            if self._waiting():
                return False  # phase barrier: the next phase needs these observations
            self._flush()
            if self._plan_done:
                return False
            self._log.append(copy.copy(self.ledger_))
            batch = next(self._plan_iter, None)
            if batch is None:
                self._plan_done = True
                self._log.clear()  # nothing left to replay
                return False
            self._batch_kind, nodes = batch
            self._batch_nodes = np.asarray(nodes, dtype=np.int64).ravel()
            self._batch_pos = 0
        return True

    def ask_batch(self, n: int) -> QueryBatch:
        """Vectorised: a slice of the current phase, charged at once."""
        if self._held is not None or self._chunk_pos < len(self._chunk):
            return super().ask_batch(n)  # queries already built by ask() go first
        self._check_started()
        n = check_count(n, "n")
        if not self._advance():
            return QueryBatch(self._batch_kind, np.zeros(0, dtype=np.int64))
        kind, cost = self._batch_kind, self._cost(self._batch_kind)
        take = min(n, self._batch_nodes.size - self._batch_pos,
                   self.ledger_.affordable(cost))
        nodes = self._batch_nodes[self._batch_pos:self._batch_pos + take].copy()
        self._batch_pos += take
        self.ledger_.charge_many(kind, cost, take)
        return self._hand_out(kind, nodes)

    def _observe_many(self, kind: str, nodes: np.ndarray, values: np.ndarray) -> None:
        self._arrays[kind].append((nodes, values))

    # ------------------------------------------------------------------ planning helpers
    def _cost(self, kind: str) -> float:
        return self.spec_.probe_cost if kind == "probe" else self.spec_.leaf_cost

    def _affordable_count(self, kind: str, budget: float | None = None) -> int:
        """How many queries of ``kind`` the remaining budget (or ``budget``) pays for."""
        money = self.remaining if budget is None else min(budget, self.remaining)
        return max(math.floor(money / self._cost(kind) * (1.0 + 1e-12)), 0)

    def _counts(self, kind: str, nodes: np.ndarray) -> np.ndarray:
        if kind == "probe":
            return self._node_n[nodes]
        return self._leaf_n[self.tree_.node_leaf[nodes]]

    def _top_up(self, kind: str, nodes: np.ndarray, target: int
                ) -> Generator[Batch, None, None]:
        """Bring every arm in ``nodes`` to ``target`` observations, one round at a time
        (round-robin, so a budget cut leaves the arms balanced)."""
        batch = round_robin(nodes, self._counts(kind, nodes), int(target))
        if batch.size:
            yield kind, batch

    def _race(self, kind: str, arms: np.ndarray, n_pulls: int, keep: int, *,
              focus: bool = False) -> Generator[Batch, None, np.ndarray]:
        """Successive rejects over ``arms`` (node ids) with ``n_pulls`` fresh observations,
        rejecting one arm per phase (:func:`sr_schedule`) until ``keep`` remain; returns the
        survivors, best first. Earlier observations of the arms count in their means. With
        fewer pulls than arms (``focus``: than :func:`halving_entrants` allows), only that
        many arms of best current score race (the score of their cells, seeded order where
        there is none)."""
        alive = np.asarray(arms, dtype=np.int64)
        keep = min(max(int(keep), 1), max(alive.size, 1))
        entrants = max(halving_entrants(n_pulls, keep) if focus else n_pulls, keep)
        if entrants < alive.size:
            alive = self._keep_best(alive, self._score[self.tree_.leaf_lo[alive]], entrants)
        done = 0
        # Phases that add no pulls reject on unchanged means, so a run of them rejects its
        # arms at once (one event ranks them by mean, as separate events would).
        for pulls, phases in itertools.groupby(sr_schedule(alive.size, n_pulls, keep).tolist()):
            run = len(list(phases))
            if pulls > done:
                yield kind, np.concatenate([alive] * (pulls - done))
                done = pulls
                run_first = 1
            else:
                run_first = run
            for size in (run_first, run - run_first):
                if size == 0:
                    continue
                alive = self._keep_best_means(kind, alive, alive.size - size)
        return alive[self._arm_order(self._arm_mean(kind, alive), alive)]
