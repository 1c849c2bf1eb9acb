"""Model routing (paper Section 5, "Routing"): regional tree-bandit routers, offline bandit
replay on logged outcomes, data loaders, a price table, and an OpenAI-compatible proxy
(:mod:`canopy.apps.routing.proxy`, behind the ``serve`` extra)."""

from canopy.apps.routing.datasets import DATASETS, load
from canopy.apps.routing.frontier import aiq, nondecreasing_hull
from canopy.apps.routing.logs import read_long, read_routerbench
from canopy.apps.routing.outcomes import Outcomes
from canopy.apps.routing.prices import PriceTable, estimate_tokens
from canopy.apps.routing.regions import RegionTree
from canopy.apps.routing.replay import ReplayResult, default_lambdas, replay
from canopy.apps.routing.routers import (
    CategoryOracle,
    FixedRouter,
    FlatRouter,
    QueryOracle,
    RandomRouter,
    RegionalRouter,
    Router,
    ThompsonRouter,
)

__all__ = [
    "DATASETS",
    "CategoryOracle",
    "FixedRouter",
    "FlatRouter",
    "Outcomes",
    "PriceTable",
    "QueryOracle",
    "RandomRouter",
    "RegionTree",
    "RegionalRouter",
    "ReplayResult",
    "Router",
    "ThompsonRouter",
    "aiq",
    "default_lambdas",
    "estimate_tokens",
    "load",
    "nondecreasing_hull",
    "read_long",
    "read_routerbench",
    "replay",
]
