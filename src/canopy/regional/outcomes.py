"""Logged per-query outcomes: every model's quality and cost on every query, with the
query's region. The common form all routing and trimming data take, and the hindsight
choices (per region, per query) their oracles and regret are measured against."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from canopy.regional.regions import RegionTree, normalize_region
from canopy.validation import check_nonnegative

__all__ = ["Outcomes", "category_choices", "query_choices"]


@dataclass(frozen=True)
class Outcomes:
    """``quality[i, m]`` in [0, 1] and ``cost[i, m]`` (dollars) of model ``m`` on query ``i``.

    ``regions[i]`` is the query's region path (``"stem/physics"``). Optional token counts
    ``input_tokens``/``output_tokens`` have the same shape as ``cost``. Validated on
    construction: no NaN, quality in [0, 1], cost finite and >= 0.
    """

    name: str
    query_ids: tuple[str, ...]
    regions: tuple[str, ...]
    models: tuple[str, ...]
    quality: np.ndarray
    cost: np.ndarray
    input_tokens: np.ndarray | None = None
    output_tokens: np.ndarray | None = None
    notes: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        n, k = len(self.query_ids), len(self.models)
        if n == 0 or k == 0:
            raise ValueError(f"{self.name}: outcomes need at least one query and one model")
        if len(set(self.models)) != k:
            raise ValueError(f"{self.name}: repeated model names")
        if len(set(self.query_ids)) != n:
            raise ValueError(f"{self.name}: repeated query ids")
        if len(self.regions) != n:
            raise ValueError(f"{self.name}: {len(self.regions)} regions for {n} queries")
        object.__setattr__(self, "regions", tuple(normalize_region(r) for r in self.regions))
        for attr in ("quality", "cost", "input_tokens", "output_tokens"):
            value = getattr(self, attr)
            if value is None:
                continue
            array = np.ascontiguousarray(value, dtype=float)
            if array.shape != (n, k):
                raise ValueError(f"{self.name}: {attr} has shape {array.shape}, want {(n, k)}")
            if not np.all(np.isfinite(array)):
                raise ValueError(f"{self.name}: {attr} holds NaN or infinite values")
            array.setflags(write=False)
            object.__setattr__(self, attr, array)
        if self.quality.min() < 0 or self.quality.max() > 1:
            raise ValueError(f"{self.name}: quality must lie in [0, 1]")
        if self.cost.min() < 0:
            raise ValueError(f"{self.name}: cost must be >= 0")

    @property
    def n_queries(self) -> int:
        return len(self.query_ids)

    @property
    def n_models(self) -> int:
        return len(self.models)

    def region_tree(self) -> tuple[RegionTree, np.ndarray]:
        """The tree of this data's regions and each query's node in it."""
        tree = RegionTree()
        nodes = np.fromiter((tree.add(r) for r in self.regions), dtype=np.int64,
                            count=self.n_queries)
        return tree, nodes

    def reward(self, lam: float) -> np.ndarray:
        """``quality - lam * cost`` per query and model (the routing reward, Section 4)."""
        return self.quality - lam * self.cost

    def summary(self) -> dict[str, object]:
        """Sizes and per-model mean quality and cost."""
        return {"name": self.name, "queries": self.n_queries, "models": list(self.models),
                "regions": len(set(self.regions)),
                "mean_quality": dict(zip(self.models, self.quality.mean(0).tolist(), strict=True)),
                "mean_cost": dict(zip(self.models, self.cost.mean(0).tolist(), strict=True))}


def category_choices(outcomes: Outcomes, lam: float) -> tuple[np.ndarray, np.ndarray]:
    """Per-category oracle: ``(best model per query, region means of the reward)``.

    The best model of a region maximises the mean of ``quality - lam * cost`` over the
    region's queries (ties to the cheaper, then the lower index)."""
    _, nodes = outcomes.region_tree()
    reward = outcomes.reward(check_nonnegative(lam, "lam"))
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
    reward = outcomes.reward(check_nonnegative(lam, "lam"))
    return np.lexsort((outcomes.cost.T, -reward.T), axis=0)[0]
