"""The ask/tell surface every policy shares.

A policy is configured once (keyword-only, validated in the constructor, stored as given) and
then started on a problem's :class:`~canopy.problem.ProblemSpec` with a budget and a seed::

    policy.start(spec, budget=600.0, seed=0)
    while (query := policy.ask()) is not None:
        policy.tell(query, observe(query))      # may happen elsewhere, later, in any order
    best = policy.recommend(k=5)

or, many at a time (vectorised bookkeeping; a batch holds queries of one kind)::

    while len(batch := policy.ask_batch(1024)):
        policy.tell_batch(batch, observe_many(batch))

``ask`` charges the policy's own :class:`~canopy.problem.Ledger` when it issues a query, so a
policy never spends past its budget even when many queries are outstanding, and returns
``None`` once it cannot afford another query or has nothing left to ask. ``tell`` rejects
NaN, infinite and out-of-range observations before they reach any statistic. Fitted state
carries a trailing underscore (``spec_``, ``ledger_``, ``rng_``).
"""

from __future__ import annotations

import inspect
import math
from abc import ABC, abstractmethod
from typing import Any

import numpy as np

from canopy.problem import Ledger, ProblemSpec, Query, QueryBatch
from canopy.stats import check_observation
from canopy.validation import check_count

__all__ = ["Policy", "check_k", "top_k"]

_REAL = (int, float, np.integer, np.floating)


def check_k(k: int, n_leaves: int) -> int:
    """Validate a top-``k`` request against the number of leaves (:func:`check_count` with
    ``high=n_leaves``)."""
    return check_count(k, "k", high=n_leaves)


def top_k(k: int, *keys: np.ndarray) -> np.ndarray:
    """The first ``k`` indices of ``np.lexsort(keys[::-1])`` (``keys[0]`` primary, all
    ascending), by partial selection key by key: each key keeps the entries strictly ahead
    of the ``k``-th and passes only those tied with it to the next key, so only about ``k``
    entries are ever fully sorted (ties on every key resolve by index, as lexsort's are)."""
    chosen: list[np.ndarray] = []
    tied = np.arange(keys[0].size)
    for key in keys:
        need = k - sum(part.size for part in chosen)
        if tied.size <= need:
            break
        values = key[tied]
        kth = np.partition(values, need - 1)[need - 1]
        chosen.append(tied[values < kth])
        tied = tied[values == kth]
    chosen.append(tied)
    candidates = np.concatenate(chosen)
    order = np.lexsort(tuple(key[candidates] for key in reversed(keys)))
    return candidates[order[:k]]


def _node_array(nodes: list) -> np.ndarray:
    """Node ids as an ``int64`` array, or an object array for cell pairs of a lazy tree."""
    if all(isinstance(node, (int, np.integer)) for node in nodes):
        return np.array(nodes, dtype=np.int64)
    out = np.empty(len(nodes), dtype=object)
    out[:] = nodes
    return out


class Policy(ABC):
    """Base class: budget bookkeeping, seeding, validation of ask/tell.

    Subclasses implement ``_start``, ``_next_query``, ``_observe`` and
    :meth:`recommend`, and set ``query_kinds`` to the kinds they issue (structure-blind
    policies issue leaf evaluations only).
    """

    query_kinds: tuple[str, ...] = ("probe", "leaf")
    name: str = "policy"

    spec_: ProblemSpec
    ledger_: Ledger
    rng_: np.random.Generator

    # ------------------------------------------------------------------ configuration
    @classmethod
    def _param_names(cls) -> list[str]:
        """The constructor's parameters (scikit-learn's convention: each is stored, as given,
        under its own name)."""
        return [p.name for p in inspect.signature(cls.__init__).parameters.values()
                if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        """The constructor's parameters as given (``deep`` is accepted for scikit-learn's
        ``clone``; no parameter is itself an estimator)."""
        return {name: getattr(self, name) for name in self._param_names()}

    def set_params(self, **params: Any) -> Policy:
        """Change parameters, validated as the constructor validates them; a started policy
        keeps its state until the next :meth:`start`. Returns ``self``."""
        names = self._param_names()
        unknown = sorted(set(params) - set(names))
        if unknown:
            raise ValueError(f"{type(self).__name__} has no parameter {unknown[0]!r}; "
                             f"valid: {', '.join(names)}")
        configured = type(self)(**{**self.get_params(), **params})
        vars(self).update(vars(configured))
        return self

    # ------------------------------------------------------------------ public surface
    def start(self, spec: ProblemSpec, *, budget: float,
              seed: int | np.random.Generator | None = None) -> Policy:
        """Reset the policy for a new problem and budget. Returns ``self``."""
        if not isinstance(spec, ProblemSpec):
            raise TypeError(f"spec must be a ProblemSpec, got {type(spec).__name__}")
        if isinstance(getattr(self, "k", None), (int, np.integer)):  # top-k identifiers
            check_k(self.k, spec.tree.n_leaves)
        self.spec_ = spec
        self.ledger_ = Ledger(budget)
        cheapest = min(spec.probe_cost if kind == "probe" else spec.leaf_cost
                       for kind in self.query_kinds)
        if budget < cheapest:
            raise ValueError(
                f"budget {budget:g} is smaller than one query ({cheapest:g}) of {self.name}"
            )
        self.rng_ = np.random.default_rng(seed)
        self._probe_cost, self._leaf_cost = spec.probe_cost, spec.leaf_cost
        self._low, self._high = spec.value_range
        self._outstanding: dict[Query, int] = {}
        self._held: Query | None = None  # asked by ask_batch, not yet handed out
        self._batches: dict[int, QueryBatch] = {}  # vectorised batches not yet told
        self._tokens = 0
        self._start()
        return self

    def ask(self) -> Query | None:
        """The next query, already paid for, or ``None`` when the policy is done."""
        try:
            ledger = self.ledger_
        except AttributeError:
            self._check_started()
        if self._held is not None:
            query, self._held = self._held, None
            return query
        query = self._next_query()
        if query is None:
            return None
        kind = query[0]
        if not ledger.try_charge(kind, self._probe_cost if kind == "probe" else self._leaf_cost):
            return None
        outstanding = self._outstanding
        outstanding[query] = outstanding.get(query, 0) + 1
        return query

    def tell(self, query: Query, value: float) -> None:
        """Report the observation of a query this policy asked (queries compare by value, so an
        equal ``Query`` rebuilt elsewhere is accepted)."""
        try:
            outstanding = self._outstanding
        except AttributeError:
            self._check_started()
        pending = outstanding.get(query, 0)
        if pending == 0 and self._batches:  # one query of a vectorised batch, told alone
            self._unbatch()
            pending = outstanding.get(query, 0)
        if pending == 0:
            raise ValueError(f"{query!r} was not asked by this policy, or was already told")
        if type(value) is float:  # the common case, checked without a call
            observation = value
        elif isinstance(value, _REAL) and not isinstance(value, (bool, np.bool_)):
            observation = float(value)
        else:  # strings, booleans, complex numbers: not an observation
            raise TypeError(f"observation must be a real number, got {value!r}")
        # NaN and +-inf give a non-zero difference; the fast path avoids a call per round.
        if observation - observation != 0.0 or not self._low <= observation <= self._high:
            check_observation(observation, self._low, self._high)
        if pending == 1:
            del outstanding[query]
        else:
            outstanding[query] = pending - 1
        self._observe(query, observation)

    def abandon(self, query: Query, *, refund: bool = False) -> None:
        """Give up on an outstanding query (its evaluation was lost): the policy stops waiting
        for it, so a phased policy moves on with one observation fewer. ``refund`` returns its
        cost to the budget (the evaluation never ran), else it stays spent."""
        self._check_started()
        pending = self._outstanding.get(query, 0)
        if pending == 0 and self._batches:
            self._unbatch()
            pending = self._outstanding.get(query, 0)
        if pending == 0:
            raise ValueError(f"{query!r} was not asked by this policy, or was already told")
        if pending == 1:
            del self._outstanding[query]
        else:
            self._outstanding[query] = pending - 1
        if refund:
            self.ledger_.refund(query.kind, self._probe_cost if query.kind == "probe"
                                else self._leaf_cost)

    def ask_batch(self, n: int) -> QueryBatch:
        """Up to ``n`` queries of one kind, each already paid for; fewer at a phase barrier, at
        a change of kind or when the budget ends, and none (an empty batch) once the policy
        is done or waits for outstanding observations."""
        self._check_started()
        n = check_count(n, "n")
        nodes: list = []
        kind = None
        while len(nodes) < n:
            query = self.ask()
            if query is None:
                break
            if kind is not None and query.kind != kind:
                self._held = query  # the next batch starts with it
                break
            kind = query.kind
            nodes.append(query.node)
        return QueryBatch(kind or "leaf", _node_array(nodes))

    def tell_batch(self, batch: QueryBatch, values: np.ndarray) -> None:
        """Report ``values[i]`` for the ``i``-th query of ``batch``. All or nothing: a value
        that is not finite or outside the declared range, or a query not outstanding, raises
        before any statistic changes."""
        self._check_started()
        if not isinstance(batch, QueryBatch):
            raise TypeError(f"batch must be a QueryBatch from ask_batch, got "
                            f"{type(batch).__name__}")
        try:
            observed = np.array(values, dtype=float)  # a copy: the caller may reuse its buffer
        except (TypeError, ValueError):
            raise TypeError("values must be real numbers") from None
        if observed.shape != (len(batch),):
            raise ValueError(f"values must have shape ({len(batch)},), got {observed.shape}")
        if observed.size and not self._within(observed, self._low, self._high):
            bad = ~(np.isfinite(observed) & (observed >= self._low) & (observed <= self._high))
            check_observation(float(observed[np.flatnonzero(bad)[0]]), self._low, self._high)
        self._take_outstanding(batch)
        self._observe_many(batch.kind, batch.nodes, observed)

    @abstractmethod
    def recommend(self, k: int = 1) -> np.ndarray:
        """The ``k`` leaf indices the policy believes best, best first."""

    @property
    def spent(self) -> float:
        return self.ledger_.spent

    @property
    def remaining(self) -> float:
        return self.ledger_.remaining

    # ------------------------------------------------------------------ subclass hooks
    @abstractmethod
    def _start(self) -> None:
        """Allocate per-run state from ``self.spec_``, ``self.ledger_`` and ``self.rng_``."""

    @abstractmethod
    def _next_query(self) -> Query | None:
        """Choose the next query (the base class checks and charges its cost)."""

    @abstractmethod
    def _observe(self, query: Query, value: float) -> None:
        """Fold one validated observation into the statistics."""

    def _observe_many(self, kind: str, nodes: np.ndarray, values: np.ndarray) -> None:
        """Fold validated observations of one kind (subclasses vectorise this)."""
        for node, value in zip(nodes.tolist(), values.tolist(), strict=True):
            self._observe(Query(kind, node), value)

    # ------------------------------------------------------------------ batch bookkeeping
    def _hand_out(self, kind: str, nodes: np.ndarray) -> QueryBatch:
        """A vectorised batch, recorded as outstanding as a whole (O(1))."""
        self._tokens += 1
        batch = QueryBatch(kind, nodes, self._tokens)
        self._batches[self._tokens] = batch
        return batch

    def _unbatch(self) -> None:
        """Turn the outstanding vectorised batches into per-query records (once, when a
        query of one is told or abandoned alone; the whole-batch path never does)."""
        outstanding = self._outstanding
        for batch in self._batches.values():
            for one in batch:
                outstanding[one] = outstanding.get(one, 0) + 1
        self._batches.clear()

    def _take_outstanding(self, batch: QueryBatch) -> None:
        """Take every query of ``batch`` off the outstanding records, or raise and change
        nothing if one was not asked (or was already told)."""
        if self._batches.get(batch.token) is batch:
            del self._batches[batch.token]
            return
        self._unbatch()
        need: dict[Query, int] = {}
        for query in batch:
            need[query] = need.get(query, 0) + 1
        for query, count in need.items():
            if self._outstanding.get(query, 0) < count:
                raise ValueError(f"{query!r} was not asked by this policy, or was already told")
        for query, count in need.items():
            left = self._outstanding[query] - count
            if left:
                self._outstanding[query] = left
            else:
                del self._outstanding[query]

    def _waiting(self) -> bool:
        """Whether observations are still outstanding (a phased policy's barrier)."""
        return bool(self._outstanding) or bool(self._batches)

    # ------------------------------------------------------------------ helpers
    @staticmethod
    def _within(values: np.ndarray, low: float, high: float) -> bool:
        """Whether every value is finite and in ``[low, high]`` (a NaN propagates into the
        reductions); the phased policies use a compiled pass instead."""
        if low == -math.inf and high == math.inf:
            return bool(np.isfinite(values).all())
        lo, hi = float(values.min()), float(values.max())
        return low <= lo and hi <= high and math.isfinite(lo) and math.isfinite(hi)

    def _check_started(self) -> None:
        if not hasattr(self, "ledger_"):
            raise RuntimeError(f"{type(self).__name__}.start(spec, budget=..., seed=...) first")

    def _affordable(self, kind: str, count: int = 1) -> bool:
        cost = self.spec_.probe_cost if kind == "probe" else self.spec_.leaf_cost
        return self.ledger_.can_afford(cost * count)

    def __repr__(self) -> str:
        params = ", ".join(f"{key}={value!r}" for key, value in vars(self).items()
                           if not key.endswith("_") and not key.startswith("_"))
        return f"{type(self).__name__}({params})"
