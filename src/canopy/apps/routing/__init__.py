"""Model routing (paper Section 4, "Routing"): regional tree-bandit routers, offline bandit
replay on logged outcomes, data loaders, a price table, and an OpenAI-compatible proxy
(:mod:`canopy.apps.routing.proxy`, behind the ``serve`` extra)."""

from canopy._lazy import lazy_exports

_EXPORTS = {
    "DATASETS": "canopy.apps.routing.datasets",
    "load": "canopy.apps.routing.datasets",
    "aiq": "canopy.apps.routing.frontier",
    "nondecreasing_hull": "canopy.apps.routing.frontier",
    "read_long": "canopy.apps.routing.logs",
    "read_routerbench": "canopy.apps.routing.logs",
    "Outcomes": "canopy.regional.outcomes",
    "PriceTable": "canopy.apps.routing.prices",
    "estimate_tokens": "canopy.apps.routing.prices",
    "RegionTree": "canopy.regional.regions",
    "ReplayResult": "canopy.apps.routing.replay",
    "default_lambdas": "canopy.apps.routing.replay",
    "replay": "canopy.apps.routing.replay",
    "CategoryOracle": "canopy.apps.routing.routers",
    "FixedRouter": "canopy.apps.routing.routers",
    "FlatRouter": "canopy.apps.routing.routers",
    "QueryOracle": "canopy.apps.routing.routers",
    "RandomRouter": "canopy.apps.routing.routers",
    "RegionalRouter": "canopy.apps.routing.routers",
    "Router": "canopy.apps.routing.routers",
    "ThompsonRouter": "canopy.apps.routing.routers",
}

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


lazy_exports(__name__, _EXPORTS)
