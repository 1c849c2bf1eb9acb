"""Routers on one interface: ``route(region) -> model`` and
``update(region, model, quality, cost)`` (paper Section 5, "Routing": regions are task
categories, arms are models, reward is ``quality - lam * cost``).

* :class:`RegionalRouter` - a learner per region whose statistics back off to the parent
  region and to the whole pool (:mod:`canopy.apps.routing.learners`), on a region tree of any
  depth; ``learner="ucb"`` (UCB1-Tuned) or ``"thompson"``.
* :class:`FlatRouter` - the same learner with a single region (the structure-blind baseline).
* :class:`ThompsonRouter` - the regional router with Thompson sampling.
* :class:`FixedRouter`, :class:`RandomRouter` - non-learning baselines.
* :class:`CategoryOracle`, :class:`QueryOracle` - offline references that see the truth:
  the best model per region, and per query, at the given ``lam``.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from typing import Protocol, runtime_checkable

import numpy as np

from canopy.apps.routing import learners
from canopy.apps.routing.outcomes import Outcomes
from canopy.apps.routing.regions import RegionTree, normalize_region
from canopy.stats import check_observation

__all__ = [
    "CategoryOracle",
    "FixedRouter",
    "FlatRouter",
    "QueryOracle",
    "RandomRouter",
    "RegionalRouter",
    "Router",
    "ThompsonRouter",
    "check_feedback",
]


@runtime_checkable
class Router(Protocol):
    """What every router offers."""

    models: tuple[str, ...]

    def route(self, region: str, *, query: Hashable | None = None) -> str: ...

    def update(self, region: str, model: str, quality: float, cost: float) -> None: ...


def _check_models(models: Sequence[str]) -> tuple[str, ...]:
    if isinstance(models, str) or not all(isinstance(m, str) and m for m in models):
        raise TypeError(f"models must be a sequence of non-empty names, got {models!r}")
    models = tuple(models)
    if not models:
        raise ValueError("models is empty")
    if len(set(models)) != len(models):
        raise ValueError(f"models has repeated names: {models}")
    return models


def _check_lam(lam: float) -> float:
    if not isinstance(lam, (int, float)) or not math.isfinite(lam) or lam < 0:
        raise ValueError(f"lam must be a finite number >= 0, got {lam!r}")
    return float(lam)


def check_feedback(models: Sequence[str], model: str, quality: float, cost: float
                   ) -> tuple[int, float, float]:
    """Validate one outcome: known model, quality in [0, 1], finite cost >= 0."""
    if model not in models:
        raise KeyError(f"unknown model {model!r}; known: {', '.join(models)}")
    quality = check_observation(quality, 0.0, 1.0)
    cost = check_observation(cost, 0.0)
    return models.index(model), quality, cost


class _Learner:
    """Shared state of the learning routers: a region tree and per-node moments."""

    _kind: int

    def __init__(self, models: Sequence[str], *, lam: float = 0.0,
                 regions: Sequence[str] = (), kappa: float = 5.0, explore: float = 1.0,
                 seed: int | np.random.Generator | None = 0) -> None:
        self.models = _check_models(models)
        self.lam = _check_lam(lam)
        if not math.isfinite(kappa) or kappa < 0:
            raise ValueError(f"kappa must be finite and >= 0, got {kappa!r}")
        if not math.isfinite(explore) or explore < 0:
            raise ValueError(f"explore must be finite and >= 0, got {explore!r}")
        self.kappa = float(kappa)
        self.explore = float(explore)
        self.rng = np.random.default_rng(seed)
        self.regions = RegionTree()
        self._stats = np.zeros((1, len(self.models), 3))
        self._chains = np.zeros((1, 1), dtype=np.int64)
        for region in regions:
            self._node(region)

    # -- regions -----------------------------------------------------------------------
    def _node(self, region: str) -> int:
        node = self.regions.add(region)
        if self.regions.n_nodes > self._stats.shape[0]:
            grown = np.zeros((self.regions.n_nodes, len(self.models), 3))
            grown[:self._stats.shape[0]] = self._stats
            self._stats = grown
            self._chains = self.regions.ancestors()
        return node

    def chain(self, region: str) -> np.ndarray:
        """Root-to-region node chain (padded with -1) as the kernels read it."""
        node = self._node(region)
        return self._chains[node]

    # -- learning ------------------------------------------------------------------------
    def scores(self, region: str) -> np.ndarray:
        """Each model's index in ``region`` (higher is routed first)."""
        k = len(self.models)
        z = self.rng.standard_normal(k) if self._kind == learners.THOMPSON else np.zeros(k)
        out = np.empty(k)
        chain = self.chain(region)  # may grow the statistics: take it first
        learners.scores(self._stats, chain, self._kind, self.kappa, self.explore, z,
                        np.empty((k, 3)), out)
        return out

    def ranking(self, region: str) -> list[str]:
        """Models from best to worst index (the fallback order of the proxy)."""
        order = np.argsort(-self.scores(region), kind="stable")
        return [self.models[int(m)] for m in order]

    def route(self, region: str, *, query: Hashable | None = None) -> str:
        return self.ranking(region)[0]

    def update(self, region: str, model: str, quality: float, cost: float) -> None:
        index, quality, cost = check_feedback(self.models, model, quality, cost)
        chain = self.chain(region)  # may grow the statistics: take it first
        learners.push(self._stats, chain, index, quality - self.lam * cost)

    def estimates(self) -> list[dict[str, object]]:
        """Per (region, model): own count and mean reward, and the backed-off estimate."""
        rows = []
        est = np.empty((len(self.models), 3))
        for node, path in enumerate(self.regions.paths):
            learners.backoff(self._stats, self._chains[node], self.kappa, est)
            for m, model in enumerate(self.models):
                count, mean, _ = self._stats[node, m]
                rows.append({"region": path or "/", "model": model, "count": int(count),
                             "mean_reward": float(mean), "effective_count": float(est[m, 0]),
                             "estimate": float(est[m, 1])})
        return rows

    # -- persistence ---------------------------------------------------------------------
    def state(self) -> dict[str, object]:
        """Everything learned, as plain data (region paths and moments)."""
        return {"models": list(self.models), "lam": self.lam,
                "regions": list(self.regions.paths), "stats": self._stats.tolist()}

    def load_state(self, state: dict[str, object]) -> None:
        """Restore :meth:`state` output; refuses a state for other models or another lam."""
        if list(state["models"]) != list(self.models):
            raise ValueError(f"saved state is for models {state['models']}, not {self.models}")
        if float(state["lam"]) != self.lam:
            raise ValueError(f"saved state is for lam={state['lam']}, not {self.lam}")
        stats = np.asarray(state["stats"], dtype=float)
        regions = list(state["regions"])
        if stats.shape != (len(regions), len(self.models), 3):
            raise ValueError(f"saved stats have shape {stats.shape}")
        tree = RegionTree(regions)
        if list(tree.paths) != regions:
            raise ValueError("saved regions are not in tree order")
        self.regions = tree
        self._stats = stats.copy()
        self._chains = tree.ancestors()


class RegionalRouter(_Learner):
    """Regional learner (UCB1-Tuned by default) with back-off along the region tree."""

    def __init__(self, models: Sequence[str], *, lam: float = 0.0,
                 regions: Sequence[str] = (), learner: str = "ucb", kappa: float = 5.0,
                 explore: float = 1.0, seed: int | np.random.Generator | None = 0) -> None:
        kinds = {"ucb": learners.UCB, "thompson": learners.THOMPSON}
        if learner not in kinds:
            raise ValueError(f"learner must be one of {sorted(kinds)}, got {learner!r}")
        self._kind = kinds[learner]
        self.learner = learner
        super().__init__(models, lam=lam, regions=regions, kappa=kappa, explore=explore,
                         seed=seed)


class ThompsonRouter(RegionalRouter):
    """The regional router with Gaussian Thompson sampling as its learner."""

    def __init__(self, models: Sequence[str], *, lam: float = 0.0,
                 regions: Sequence[str] = (), kappa: float = 5.0,
                 seed: int | np.random.Generator | None = 0) -> None:
        super().__init__(models, lam=lam, regions=regions, learner="thompson", kappa=kappa,
                         seed=seed)


class FlatRouter(RegionalRouter):
    """The same learner with one region: every query is routed from the pool's statistics."""

    def chain(self, region: str) -> np.ndarray:
        return self._chains[0]


class FixedRouter:
    """Always the same model."""

    def __init__(self, models: Sequence[str], model: str) -> None:
        self.models = _check_models(models)
        if model not in self.models:
            raise KeyError(f"unknown model {model!r}; known: {', '.join(self.models)}")
        self.model = model

    def route(self, region: str, *, query: Hashable | None = None) -> str:
        return self.model

    def update(self, region: str, model: str, quality: float, cost: float) -> None:
        check_feedback(self.models, model, quality, cost)


class RandomRouter:
    """A uniformly random model per query."""

    def __init__(self, models: Sequence[str], *,
                 seed: int | np.random.Generator | None = 0) -> None:
        self.models = _check_models(models)
        self.rng = np.random.default_rng(seed)

    def route(self, region: str, *, query: Hashable | None = None) -> str:
        return self.models[int(self.rng.integers(len(self.models)))]

    def update(self, region: str, model: str, quality: float, cost: float) -> None:
        check_feedback(self.models, model, quality, cost)


def category_choices(outcomes: Outcomes, lam: float) -> tuple[np.ndarray, np.ndarray]:
    """Per-category oracle: ``(best model per query, region means of the reward)``.

    The best model of a region maximises the mean of ``quality - lam * cost`` over the
    region's queries (ties to the cheaper, then the lower index)."""
    _, nodes = outcomes.region_tree()
    reward = outcomes.reward(_check_lam(lam))
    n_nodes = int(nodes.max()) + 1
    sums = np.zeros((n_nodes, outcomes.n_models))
    np.add.at(sums, nodes, reward)
    counts = np.bincount(nodes, minlength=n_nodes)[:, None]
    means = np.divide(sums, counts, out=np.full_like(sums, -np.inf), where=counts > 0)
    cost_sums = np.zeros_like(sums)
    np.add.at(cost_sums, nodes, outcomes.cost)
    best = np.lexsort((cost_sums.T, -means.T), axis=0)[0] if outcomes.n_models > 1 else \
        np.zeros(n_nodes, dtype=np.int64)
    return best[nodes], means[nodes]


def query_choices(outcomes: Outcomes, lam: float) -> np.ndarray:
    """Per-query oracle: the best model of each query (ties to the cheaper)."""
    reward = outcomes.reward(_check_lam(lam))
    return np.lexsort((outcomes.cost.T, -reward.T), axis=0)[0]


class _Oracle:
    def __init__(self, outcomes: Outcomes, *, lam: float = 0.0) -> None:
        self.models = outcomes.models
        self.lam = _check_lam(lam)
        self._outcomes = outcomes

    def update(self, region: str, model: str, quality: float, cost: float) -> None:
        check_feedback(self.models, model, quality, cost)


class CategoryOracle(_Oracle):
    """The best model per region in hindsight (offline reference; sees the truth)."""

    def __init__(self, outcomes: Outcomes, *, lam: float = 0.0) -> None:
        super().__init__(outcomes, lam=lam)
        best, _ = category_choices(outcomes, self.lam)
        self._by_region = {r: self.models[int(b)]
                           for r, b in zip(outcomes.regions, best, strict=True)}

    def route(self, region: str, *, query: Hashable | None = None) -> str:
        try:
            return self._by_region[normalize_region(region)]
        except KeyError:
            raise KeyError(f"the oracle has no data for region {region!r}") from None


class QueryOracle(_Oracle):
    """The best model per query in hindsight (offline reference; needs ``query=``)."""

    def __init__(self, outcomes: Outcomes, *, lam: float = 0.0) -> None:
        super().__init__(outcomes, lam=lam)
        best = query_choices(outcomes, self.lam)
        self._by_query = {q: self.models[int(b)]
                          for q, b in zip(outcomes.query_ids, best, strict=True)}

    def route(self, region: str, *, query: Hashable | None = None) -> str:
        if query not in self._by_query:
            raise KeyError(f"the per-query oracle needs a known query id, got {query!r}")
        return self._by_query[query]
