"""Offline bandit replay on logged per-query outcomes (paper Section 4, "Routing").

Queries arrive in a seeded random order; a learning router sees only the outcome of the
model it chose. Sweeping ``lam`` in the reward ``quality - lam * cost`` traces each router's
cost-quality frontier. Per router, lam and seed: mean quality, mean cost, and cumulative
(pseudo-)regret against the per-category oracle, ``sum_t mu_region(t)(best) -
mu_region(t)(chosen)`` with ``mu`` the region's true mean reward. Per router: AIQ
(:func:`canopy.apps.routing.frontier.aiq`) over the fixed models' cost range.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from canopy.apps.routing.frontier import aiq
from canopy.regional import kernels
from canopy.regional.outcomes import Outcomes, category_choices, query_choices
from canopy.regional.router import logged_moments
from canopy.sharing import sharing_rule
from canopy.stats import mean_ci

__all__ = ["LEARNERS", "ReplayResult", "default_lambdas", "default_routers", "replay"]

# name: (index, flat, sharing rule of canopy.sharing)
LEARNERS = {"regional": (kernels.UCB, False, "test"),
            "regional-anytime": (kernels.UCB, False, "anytime"),
            "regional-backoff": (kernels.UCB, False, "backoff"),
            "flat": (kernels.UCB, True, "test"),
            "thompson": (kernels.THOMPSON, False, "test"),
            "flat-thompson": (kernels.THOMPSON, True, "test")}
REFERENCES = ("random", "category-oracle", "query-oracle")


def default_routers(models: Sequence[str]) -> tuple[str, ...]:
    """Learners, references, and ``fixed:<model>`` for every model."""
    return (*LEARNERS, *REFERENCES, *(f"fixed:{m}" for m in models))


def default_lambdas(outcomes: Outcomes, size: int = 12) -> np.ndarray:
    """``0`` and a geometric grid with ``lam * spread`` from 0.01 to 3, where ``spread`` is the
    gap between the most and least expensive model's mean cost (so the grid crosses every
    quality gap of at most 1 between models)."""
    mean_cost = outcomes.cost.mean(0)
    spread = float(mean_cost.max() - mean_cost.min())
    if spread <= 0:
        return np.zeros(1)
    return np.concatenate([[0.0], np.geomspace(0.01, 3.0, size - 1) / spread])


@dataclass(frozen=True)
class ReplayResult:
    """Arrays indexed ``[router, lam, seed]`` (curves ``[router, lam, checkpoint]``, seed
    means)."""

    dataset: str
    routers: tuple[str, ...]
    models: tuple[str, ...]
    lambdas: np.ndarray
    seeds: tuple[int, ...]
    quality: np.ndarray
    cost: np.ndarray
    regret: np.ndarray
    steps: np.ndarray
    regret_curve: np.ndarray
    cost_range: tuple[float, float]

    def index(self, router: str) -> int:
        try:
            return self.routers.index(router)
        except ValueError:
            raise KeyError(f"no router {router!r} in this replay") from None

    def aiq(self, router: str) -> tuple[float, float]:
        """AIQ of the router's frontier per seed: mean and 95% half-width. ``fixed-hull`` is
        the hull of every fixed model together."""
        if router == "fixed-hull":
            rows = [i for i, r in enumerate(self.routers) if r.startswith("fixed:")]
            if not rows:
                raise KeyError("no fixed routers in this replay")
            q = self.quality[rows, 0, :]
            c = self.cost[rows, 0, :]
        else:
            r = self.index(router)
            q, c = self.quality[r], self.cost[r]
        per_seed = np.array([aiq(c[:, s], q[:, s], *self.cost_range)
                             for s in range(len(self.seeds))])
        mean, half = mean_ci(per_seed)
        return float(mean), float(half)

    def near_oracle(self, router: str = "regional", share: float = 0.95) -> list[float]:
        """The lams at which ``router`` reaches ``share`` of the per-category oracle's mean
        quality at no more than its mean cost."""
        r, o = self.index(router), self.index("category-oracle")
        q, c = self.quality.mean(2), self.cost.mean(2)
        ok = (q[r] >= share * q[o]) & (c[r] <= c[o])
        return [float(x) for x in self.lambdas[ok]]

    def to_dict(self) -> dict[str, object]:
        """Per router: per lam mean quality, mean cost (95% half-widths), final regret; AIQ."""
        q, qh = mean_ci(self.quality)
        c, ch = mean_ci(self.cost)
        g, gh = mean_ci(self.regret)
        out: dict[str, object] = {"dataset": self.dataset, "models": list(self.models),
                                  "seeds": len(self.seeds), "cost_range": list(self.cost_range),
                                  "lambdas": self.lambdas.tolist(), "routers": {}}
        for r, name in enumerate(self.routers):
            mean, half = self.aiq(name)
            out["routers"][name] = {
                "aiq": mean, "aiq_ci95": half,
                "points": [{"lambda": float(lam), "quality": float(q[r, i]),
                            "quality_ci95": float(qh[r, i]), "cost": float(c[r, i]),
                            "cost_ci95": float(ch[r, i]), "regret": float(g[r, i]),
                            "regret_ci95": float(gh[r, i])}
                           for i, lam in enumerate(self.lambdas)]}
        if any(r.startswith("fixed:") for r in self.routers):
            mean, half = self.aiq("fixed-hull")
            out["fixed_hull"] = {"aiq": mean, "aiq_ci95": half}
        return out


def _choices(router: str, outcomes: Outcomes, lam: float, order: np.ndarray,
             chains: np.ndarray, seed: int, kappa: float, explore: float,
             delta: float, prior: np.ndarray | None = None) -> np.ndarray:
    """The model chosen for each query of ``order`` (the queries replayed, in their order);
    ``prior[flat]`` holds the learners' starting statistics (``None``: none)."""
    n, k = order.size, outcomes.n_models
    if router in LEARNERS:
        kind, flat, sharing = LEARNERS[router]
        n_nodes = 1 if flat else int(chains.max()) + 1
        z = (np.random.default_rng([seed, 1]).standard_normal((n, k))
             if kind == kernels.THOMPSON else np.zeros((n, k)))
        use = np.zeros((n, 1), dtype=np.int64) if flat else chains[order]
        rule = sharing_rule(sharing, delta=delta, kappa=kappa, arms=k,
                            value_range=1.0 + lam * float(outcomes.cost.max()))
        stats = np.zeros((n_nodes, k, 3)) if prior is None else prior[int(flat)].copy()
        return kernels.replay_learner(stats, use, outcomes.quality[order],
                                      outcomes.cost[order], lam, kind, rule, explore, z)
    if router == "random":
        return np.random.default_rng([seed, 2]).integers(k, size=n)
    if router == "category-oracle":
        return category_choices(outcomes, lam)[0][order]
    if router == "query-oracle":
        return query_choices(outcomes, lam)[order]
    if router.startswith("fixed:"):
        model = router.removeprefix("fixed:")
        if model not in outcomes.models:
            raise KeyError(f"fixed router for unknown model {model!r}; known: "
                           f"{', '.join(outcomes.models)}")
        return np.full(n, outcomes.models.index(model))
    raise KeyError(f"unknown router {router!r}; known: learners {sorted(LEARNERS)}, "
                   f"{', '.join(REFERENCES)}, fixed:<model>")


def _rows(outcomes: Outcomes, rows: np.ndarray) -> Outcomes:
    """The queries ``rows`` of ``outcomes`` (the held-out rest of a warm-started replay)."""
    def pick(array: np.ndarray | None) -> np.ndarray | None:
        return None if array is None else array[rows]

    return Outcomes(outcomes.name, tuple(outcomes.query_ids[i] for i in rows),
                    tuple(outcomes.regions[i] for i in rows), outcomes.models,
                    outcomes.quality[rows], outcomes.cost[rows], pick(outcomes.input_tokens),
                    pick(outcomes.output_tokens), outcomes.notes)


def _priors(outcomes: Outcomes, train: np.ndarray, chains: np.ndarray, lam: float,
            max_count: float | None) -> np.ndarray:
    """Starting statistics ``[regional, flat]`` fitted on the logged queries ``train``, the
    way :meth:`~canopy.regional.router.RegionalRouter.fit` fits a router (padded to one
    shape; the flat learner uses node 0 only)."""
    n_nodes = int(chains.max()) + 1
    args = (outcomes.quality[train], outcomes.cost[train], lam)
    regional = logged_moments(chains[train], *args, n_nodes=n_nodes, max_count=max_count)
    flat = np.zeros_like(regional)
    flat[:1] = logged_moments(np.zeros((train.size, 1), dtype=np.int64), *args, n_nodes=1,
                              max_count=max_count)
    return np.stack([regional, flat])


def replay(outcomes: Outcomes, *, lambdas: Sequence[float] | np.ndarray | None = None,
           seeds: int | Sequence[int] = 10, routers: Sequence[str] | None = None,
           kappa: float = 5.0, explore: float = 1.0, delta: float = 0.01,
           checkpoints: int = 100, train_fraction: float | None = None,
           max_count: float | None = 100.0) -> ReplayResult:
    """Replay every router at every lam over every seed's query order (``kappa`` is the
    back-off weight of ``regional-backoff``, ``delta`` the sharing test's level).

    Warm start: with ``train_fraction`` F in (0, 1), the first F of each seed's shuffled
    queries are a log (every model's outcome) that every learner is fitted on first
    (:func:`~canopy.regional.router.logged_moments`, each region's log weighing at most
    ``max_count`` observations per model); every router, the fixed models and the oracles
    are then scored on the rest only."""
    lambdas = default_lambdas(outcomes) if lambdas is None else np.asarray(lambdas, float)
    if lambdas.ndim != 1 or lambdas.size == 0 or not np.all(np.isfinite(lambdas)) or \
            np.any(lambdas < 0):
        raise ValueError(f"lambdas must be a non-empty list of finite values >= 0, got "
                         f"{lambdas!r}")
    seeds = tuple(range(seeds)) if isinstance(seeds, int) else tuple(int(s) for s in seeds)
    if not seeds:
        raise ValueError("seeds must be a positive count or a non-empty list")
    n = outcomes.n_queries
    if train_fraction is not None and not (
            isinstance(train_fraction, (int, float)) and 0 < train_fraction < 1
            and 1 <= int(train_fraction * n) < n):
        raise ValueError(f"train_fraction must leave at least one query on each side of the "
                         f"split of {n}, got {train_fraction!r}")
    routers = default_routers(outcomes.models) if routers is None else tuple(routers)
    for name in routers:  # fail before computing anything
        if name not in LEARNERS and name not in REFERENCES and not (
                name.startswith("fixed:") and name.removeprefix("fixed:") in outcomes.models):
            raise KeyError(f"unknown router {name!r}; known: {', '.join(sorted(LEARNERS))}, "
                           f"{', '.join(REFERENCES)}, "
                           f"{', '.join('fixed:' + m for m in outcomes.models)}")
    tree, nodes = outcomes.region_tree()
    chains = tree.ancestors()[nodes]
    n_train = 0 if train_fraction is None else int(train_fraction * n)
    n_test = n - n_train
    steps = np.unique(np.linspace(1, n_test, min(checkpoints, n_test)).astype(np.int64))
    shape = (len(routers), lambdas.size, len(seeds))
    quality, cost, regret = np.zeros(shape), np.zeros(shape), np.zeros(shape)
    curve = np.zeros((len(routers), lambdas.size, steps.size))
    for si, seed in enumerate(seeds):
        order = np.random.default_rng([seed, 0]).permutation(n)
        train, test = order[:n_train], order[n_train:]
        scored = outcomes if n_train == 0 else _rows(outcomes, test)
        test_order = np.arange(n_test) if n_train else order
        for li, lam in enumerate(lambdas):
            best, region_means = category_choices(scored, float(lam))
            top = region_means[test_order, best[test_order]]
            prior = None if n_train == 0 else _priors(outcomes, train, chains, float(lam),
                                                      max_count)
            for ri, name in enumerate(routers):
                if name in LEARNERS:
                    chosen = _choices(name, outcomes, float(lam), test, chains, seed, kappa,
                                      explore, delta, prior)
                else:
                    chosen = _choices(name, scored, float(lam), test_order, chains, seed,
                                      kappa, explore, delta)
                quality[ri, li, si] = scored.quality[test_order, chosen].mean()
                cost[ri, li, si] = scored.cost[test_order, chosen].mean()
                gaps = np.cumsum(top - region_means[test_order, chosen])
                regret[ri, li, si] = gaps[-1]
                curve[ri, li] += gaps[steps - 1] / len(seeds)
    fixed = outcomes.cost.mean(0)
    return ReplayResult(outcomes.name, routers, outcomes.models, lambdas, seeds, quality, cost,
                        regret, steps, curve, (float(fixed.min()), float(fixed.max())))
