"""Routers on one interface: ``route(region) -> model`` and
``update(region, model, quality, cost)`` (paper Section 4, "Routing": regions are task
categories, arms are models, reward is ``quality - lam * cost``).

* :class:`RegionalRouter`, :class:`FlatRouter`, :class:`ThompsonRouter` - the regional
  learners of the core (:mod:`canopy.regional`), re-exported here.
* :class:`FixedRouter`, :class:`RandomRouter` - non-learning baselines.
* :class:`CategoryOracle`, :class:`QueryOracle` - offline references that see the truth:
  the best model per region, and per query, at the given ``lam``.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np

from canopy.regional.outcomes import Outcomes, category_choices, query_choices
from canopy.regional.regions import normalize_region
from canopy.regional.router import (
    FlatRouter,
    RegionalRouter,
    Router,
    ThompsonRouter,
    check_feedback,
    check_models,
)
from canopy.validation import check_nonnegative

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


class FixedRouter:
    """Always the same model."""

    def __init__(self, models: Sequence[str], model: str) -> None:
        self.models = check_models(models)
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
        self.models = check_models(models)
        self.rng = np.random.default_rng(seed)

    def route(self, region: str, *, query: Hashable | None = None) -> str:
        return self.models[int(self.rng.integers(len(self.models)))]

    def update(self, region: str, model: str, quality: float, cost: float) -> None:
        check_feedback(self.models, model, quality, cost)


class _Oracle:
    def __init__(self, outcomes: Outcomes, *, lam: float = 0.0) -> None:
        self.models = outcomes.models
        self.lam = check_nonnegative(lam, "lam")
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
