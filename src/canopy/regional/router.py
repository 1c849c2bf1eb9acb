"""Regional learners on the router interface: ``route(region) -> model`` and
``update(region, model, quality, cost)`` (paper Section 4, "Routing": regions are task
categories, arms are models, reward is ``quality - lam * cost``). They are the depth-one (or
shallow) tree bandit, used by routing and trimming alike.

* :class:`RegionalRouter` - a learner per region that shares its parent region's statistics
  until a test shows it differs (:mod:`canopy.sharing`; ``sharing="backoff"`` keeps the fixed
  prior weight), on a region tree of bounded depth; ``learner="ucb"`` or ``"thompson"``.
* :class:`FlatRouter` - the same learner with a single region (the structure-blind baseline).
* :class:`ThompsonRouter` - the regional router with Thompson sampling.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from canopy import sharing as sharing_module
from canopy.regional import kernels
from canopy.regional.regions import RegionTree
from canopy.stats import check_observation
from canopy.validation import check_nonnegative, check_positive

if TYPE_CHECKING:
    from canopy.regional.outcomes import Outcomes

__all__ = [
    "FlatRouter",
    "RegionalRouter",
    "Router",
    "ThompsonRouter",
    "check_feedback",
    "check_models",
    "logged_moments",
]


@runtime_checkable
class Router(Protocol):
    """What every router offers."""

    models: tuple[str, ...]

    def route(self, region: str, *, query: Hashable | None = None) -> str: ...

    def update(self, region: str, model: str, quality: float, cost: float) -> None: ...


def check_models(models: Sequence[str]) -> tuple[str, ...]:
    if isinstance(models, str) or not all(isinstance(m, str) and m for m in models):
        raise TypeError(f"models must be a sequence of non-empty names, got {models!r}")
    models = tuple(models)
    if not models:
        raise ValueError("models is empty")
    if len(set(models)) != len(models):
        raise ValueError(f"models has repeated names: {models}")
    return models


def check_feedback(models: Sequence[str], model: str, quality: float, cost: float
                   ) -> tuple[int, float, float]:
    """Validate one outcome: known model, quality in [0, 1], finite cost >= 0."""
    if model not in models:
        raise KeyError(f"unknown model {model!r}; known: {', '.join(models)}")
    quality = check_observation(quality, 0.0, 1.0)
    cost = check_observation(cost, 0.0)
    return models.index(model), quality, cost


def logged_moments(chains: np.ndarray, quality: np.ndarray, cost: np.ndarray, lam: float, *,
                   n_nodes: int, max_count: float | None = None) -> np.ndarray:
    """``(count, mean, m2)`` per node and model of the rewards ``quality - lam * cost`` of
    logged queries (every model's outcome on every query: full information), each pushed
    along its root-to-node chain (``chains[i]``, ``-1``-padded) as the learners push their own
    observations. With ``max_count``, a query's outcome weighs
    ``min(1, max_count / n)`` with ``n`` the logged queries of its own region: a region's log
    counts as at most ``max_count`` fresh observations per model, so that many contrary ones
    move its estimate halfway back (the learner can unlearn a stale log). Weighted moments
    merge exactly as unweighted ones, so a parent's moments stay the pool of its children's
    and the sharing kernel's take-out (:func:`canopy.regional.kernels.share`) stays exact."""
    chains = np.asarray(chains, dtype=np.int64)
    reward = np.asarray(quality, float) - lam * np.asarray(cost, float)
    if reward.ndim != 2 or chains.ndim != 2 or chains.shape[0] != reward.shape[0]:
        raise ValueError(f"need one chain per logged query, got {chains.shape} chains for "
                         f"{reward.shape} outcomes")
    if not np.all(np.isfinite(reward)):
        raise ValueError("logged rewards must be finite")
    depth = (chains >= 0).sum(1)
    own = chains[np.arange(chains.shape[0]), depth - 1]  # each query's own region
    weight = np.ones(chains.shape[0])
    if max_count is not None:
        check_positive(max_count, "max_count")
        weight = np.minimum(1.0, max_count / np.bincount(own, minlength=n_nodes)[own])
    k = reward.shape[1]
    sums = np.zeros((n_nodes, k, 2))  # (sum of weights, weighted sum of rewards)
    for level in range(chains.shape[1]):
        rows = np.flatnonzero(chains[:, level] >= 0)
        np.add.at(sums, (chains[rows, level], slice(None), 0), weight[rows, None])
        np.add.at(sums, (chains[rows, level], slice(None), 1),
                  weight[rows, None] * reward[rows])
    out = np.zeros((n_nodes, k, 3))
    out[..., 0] = sums[..., 0]
    np.divide(sums[..., 1], sums[..., 0], out=out[..., 1], where=sums[..., 0] > 0)
    for level in range(chains.shape[1]):  # second pass: squares about each node's mean
        rows = np.flatnonzero(chains[:, level] >= 0)
        nodes = chains[rows, level]
        np.add.at(out, (nodes, slice(None), 2),
                  weight[rows, None] * (reward[rows] - out[nodes, :, 1]) ** 2)
    return out


def merge_moments(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Chan's merge of two ``(..., 3)`` arrays of ``(count, mean, m2)``."""
    n = a[..., 0] + b[..., 0]
    safe = np.where(n > 0, n, 1.0)
    delta = b[..., 1] - a[..., 1]
    out = np.empty_like(a)
    out[..., 0] = n
    out[..., 1] = a[..., 1] + delta * b[..., 0] / safe
    out[..., 2] = a[..., 2] + b[..., 2] + delta ** 2 * a[..., 0] * b[..., 0] / safe
    return out


class _Learner:
    """Shared state of the learning routers: a region tree and per-node moments."""

    _kind: int

    def __init__(self, models: Sequence[str], *, lam: float = 0.0,
                 regions: Sequence[str] = (), sharing: str = "test", delta: float = 0.01,
                 kappa: float = 5.0, explore: float = 1.0,
                 seed: int | np.random.Generator | None = 0) -> None:
        self.models = check_models(models)
        self.lam = check_nonnegative(lam, "lam")
        self._rule = sharing_module.sharing_rule(sharing, delta=delta, kappa=kappa,
                                                 arms=len(self.models))
        check_nonnegative(explore, "explore")
        self.sharing, self.delta, self.kappa = sharing, float(delta), float(kappa)
        self.explore = float(explore)
        self.rng = np.random.default_rng(seed)
        self._no_draw = np.zeros(len(self.models))  # UCB's z: made once, only read
        self.regions = RegionTree()
        self._set_tables(np.zeros((1, len(self.models), 3)))
        self._cost_max = 0.0
        for region in regions:
            self._node(region)

    # -- regions -----------------------------------------------------------------------
    def _set_tables(self, stats: np.ndarray) -> None:
        """Per-node moments and root-to-node chains, as views of arrays with room to grow."""
        self._room, self._chain_room = stats, self.regions.ancestors()
        self._stats, self._chains = self._room, self._chain_room

    def _node(self, region: str) -> int:
        node = self.regions.add(region)
        have = self._stats.shape[0]
        if self.regions.n_nodes > have:  # new nodes: room doubles, so growth is linear
            n = self.regions.n_nodes
            if n > self._room.shape[0]:
                room = np.zeros((2 * n, *self._stats.shape[1:]))
                room[:have] = self._stats
                chains = np.full((2 * n, self._chains.shape[1]), -1, dtype=np.int64)
                chains[:have] = self._chains
                self._room, self._chain_room = room, chains
            self._chain_room[have:n] = self.regions.ancestors(have)
            self._stats, self._chains = self._room[:n], self._chain_room[:n]
        return node

    def chain(self, region: str) -> np.ndarray:
        """Root-to-region node chain (padded with -1) as the kernels read it."""
        node = self._node(region)
        return self._chains[node]

    # -- learning ------------------------------------------------------------------------
    def _observe_cost(self, cost: float) -> None:
        """The anytime test needs the rewards' range, ``1 + lam * (largest cost seen)``."""
        if cost > self._cost_max:
            self._cost_max = cost
            self._rule[sharing_module.RANGE] = 1.0 + self.lam * cost

    def _draw(self) -> np.ndarray:
        """The scores' ``z``: Thompson sampling's normals, drawn now; zeros for UCB."""
        if self._kind == kernels.THOMPSON:
            return self.rng.standard_normal(len(self.models))
        return self._no_draw

    def scores(self, region: str) -> np.ndarray:
        """Each model's index in ``region`` (higher is routed first)."""
        k = len(self.models)
        z = self._draw()
        out = np.empty(k)
        chain = self.chain(region)  # may grow the statistics: take it first
        kernels.scores(self._stats, chain, self._kind, self._rule, self.explore, z,
                       np.empty((k, 3)), out)
        return out

    def ranking(self, region: str) -> list[str]:
        """Models from best to worst index (the fallback order of the proxy)."""
        order = np.argsort(-self.scores(region), kind="stable")
        return [self.models[int(m)] for m in order]

    def route(self, region: str, *, query: Hashable | None = None) -> str:
        return self.ranking(region)[0]

    def reward(self, quality: float, cost: float) -> float:
        """The reward of an outcome, ``quality - lam * cost`` (paper Section 4, "Routing"):
        the one place the router's trade-off is applied."""
        return quality - self.lam * cost

    def update(self, region: str, model: str, quality: float, cost: float) -> None:
        index, quality, cost = check_feedback(self.models, model, quality, cost)
        chain = self.chain(region)  # may grow the statistics: take it first
        kernels.push(self._stats, chain, index, self.reward(quality, cost))
        self._observe_cost(cost)

    def chain_paths(self, region: str) -> list[str]:
        """Region paths an outcome in ``region`` updates, from the root down."""
        return [self.regions.path(int(v)) for v in self.chain(region) if v >= 0]

    def set_moments(self, region: str, model: str, count: float, mean: float, m2: float,
                    *, cost_max: float = 0.0) -> None:
        """Overwrite ``model``'s moments at ``region`` (as a store shared by several
        processes holds them) and raise the largest cost seen to ``cost_max``."""
        index = self.models.index(model)
        node = self._node(region)  # may grow the statistics: take it first
        self._stats[node, index] = (count, mean, m2)
        self._observe_cost(check_observation(cost_max, 0.0))

    def fit(self, outcomes: Outcomes, *, max_count: float | None = 100.0) -> None:
        """Warm start from a log (:class:`~canopy.regional.outcomes.Outcomes`, e.g. the long
        format ``query_id,region,model,quality,cost`` read by
        :func:`canopy.apps.routing.logs.read_long`): every logged outcome is added to the
        statistics as an observation of reward ``quality - lam * cost`` in its region, each
        region's log weighing at most ``max_count`` observations per model
        (:func:`logged_moments`; ``None``: every logged outcome counts as one). Adds to what
        the router has learned; the log must hold every model of the router (extra models
        are ignored), else ``KeyError``."""
        missing = [m for m in self.models if m not in outcomes.models]
        if missing:
            raise KeyError(f"the log has no outcomes for models {missing}")
        columns = [outcomes.models.index(m) for m in self.models]
        names = sorted(set(outcomes.regions))
        chain_of = {region: self.chain(region) for region in names}  # may grow the tables
        chains = np.stack([chain_of[r] for r in outcomes.regions])
        logged = logged_moments(chains, outcomes.quality[:, columns],
                                outcomes.cost[:, columns], self.lam,
                                n_nodes=self._stats.shape[0], max_count=max_count)
        self._stats[:] = merge_moments(self._stats, logged)
        self._observe_cost(float(outcomes.cost[:, columns].max()))

    def estimates(self) -> list[dict[str, Any]]:
        """Per (region, model): own count and mean reward, and the shared estimate with the
        effective count it rests on."""
        rows = []
        est = np.empty((len(self.models), 3))
        for node, path in enumerate(self.regions.paths):
            kernels.share(self._stats, self._chains[node], self._rule, est)
            for m, model in enumerate(self.models):
                count, mean, _ = self._stats[node, m]
                rows.append({"region": path or "/", "model": model, "count": int(count),
                             "mean_reward": float(mean), "effective_count": float(est[m, 0]),
                             "estimate": float(est[m, 1])})
        return rows

    # -- persistence ---------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """Everything learned, as plain data (region paths, moments, largest cost seen)."""
        return {"models": list(self.models), "lam": self.lam,
                "regions": list(self.regions.paths), "stats": self._stats.tolist(),
                "cost_max": self._cost_max}

    def load_state(self, state: dict[str, Any]) -> None:
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
        self._set_tables(stats.copy())
        self._observe_cost(check_observation(float(state.get("cost_max", 0.0)), 0.0))


class RegionalRouter(_Learner):
    """Regional learner (UCB1-Tuned by default) sharing statistics along the region tree.

    ``sharing`` is the rule of :mod:`canopy.sharing`: ``"test"`` (default; a region is its
    parent's pool until a level-``delta`` test per look separates them), ``"anytime"`` (a
    time-uniform test: its level holds over the whole run, it splits much later) or
    ``"backoff"`` (the fixed prior weight ``kappa``, for comparison)."""

    def __init__(self, models: Sequence[str], *, lam: float = 0.0,
                 regions: Sequence[str] = (), learner: str = "ucb", sharing: str = "test",
                 delta: float = 0.01, kappa: float = 5.0, explore: float = 1.0,
                 seed: int | np.random.Generator | None = 0) -> None:
        kinds = {"ucb": kernels.UCB, "thompson": kernels.THOMPSON}
        if learner not in kinds:
            raise ValueError(f"learner must be one of {sorted(kinds)}, got {learner!r}")
        self._kind = kinds[learner]
        self.learner = learner
        super().__init__(models, lam=lam, regions=regions, sharing=sharing, delta=delta,
                         kappa=kappa, explore=explore, seed=seed)


class ThompsonRouter(RegionalRouter):
    """The regional router with Gaussian Thompson sampling as its learner."""

    def __init__(self, models: Sequence[str], *, lam: float = 0.0,
                 regions: Sequence[str] = (), sharing: str = "test", delta: float = 0.01,
                 kappa: float = 5.0, seed: int | np.random.Generator | None = 0) -> None:
        super().__init__(models, lam=lam, regions=regions, learner="thompson",
                         sharing=sharing, delta=delta, kappa=kappa, seed=seed)


class FlatRouter(RegionalRouter):
    """The same learner with one region: every query is routed from the pool's statistics."""

    def chain(self, region: str) -> np.ndarray:
        return self._chains[0]
