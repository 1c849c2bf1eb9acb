"""Regional learners: the depth-one (or shallow) tree bandit over a tree of task regions,
sharing statistics between a region and its parent by a test (:mod:`canopy.sharing`). Model
routing and prompt trimming are built on it (paper Section 4), and the routing service
(:mod:`canopy.regional.service`): a router, its region sources, its feedback ledger and
circuit breaker over a store shared by every worker (memory, SQLite or Redis)."""

from canopy._lazy import lazy_exports

_EXPORTS = {
    "Breaker": "canopy.regional.breaker",
    "FeedbackError": "canopy.regional.ledger",
    "FeedbackLedger": "canopy.regional.ledger",
    "Outcomes": "canopy.regional.outcomes",
    "category_choices": "canopy.regional.outcomes",
    "query_choices": "canopy.regional.outcomes",
    "MAX_DEPTH": "canopy.regional.regions",
    "MAX_LENGTH": "canopy.regional.regions",
    "RegionTree": "canopy.regional.regions",
    "normalize_region": "canopy.regional.regions",
    "FlatRouter": "canopy.regional.router",
    "RegionalRouter": "canopy.regional.router",
    "Router": "canopy.regional.router",
    "ThompsonRouter": "canopy.regional.router",
    "Route": "canopy.regional.service",
    "RoutingService": "canopy.regional.service",
    "RegionConfig": "canopy.regional.sources",
    "RegionSource": "canopy.regional.sources",
    "Store": "canopy.regional.store",
    "StoreBusy": "canopy.regional.store",
    "StoreCircuit": "canopy.regional.circuit",
    "StoreDown": "canopy.regional.circuit",
    "StoreReset": "canopy.regional.store",
    "StoreUnreachable": "canopy.regional.store",
    "open_store": "canopy.regional.stores",
}

__all__ = sorted(_EXPORTS)

lazy_exports(__name__, _EXPORTS)
