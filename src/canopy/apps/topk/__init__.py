"""Top-k identification over real model pools (paper Section 4, Appendix E): pools from score
tables, pool trees, the multi-fidelity problem over a pool, and the variance the tree explains."""

from canopy._lazy import lazy_exports

_EXPORTS = {
    "top_k_cells": "canopy.apps.topk.hardness",
    "top_k_complexity": "canopy.apps.topk.hardness",
    "Pool": "canopy.apps.topk.pools",
    "alpaca_eval": "canopy.apps.topk.pools",
    "can_ai_code": "canopy.apps.topk.pools",
    "load_pool": "canopy.apps.topk.pools",
    "open_llm_leaderboard": "canopy.apps.topk.pools",
    "read_pool_csv": "canopy.apps.topk.pools",
    "PoolProblem": "canopy.apps.topk.problem",
    "PoolTree": "canopy.apps.topk.trees",
    "tree_from_families": "canopy.apps.topk.trees",
    "tree_from_features": "canopy.apps.topk.trees",
    "VarianceExplained": "canopy.apps.topk.variance",
    "variance_explained": "canopy.apps.topk.variance",
}

__all__ = [
    "Pool",
    "PoolProblem",
    "PoolTree",
    "VarianceExplained",
    "alpaca_eval",
    "can_ai_code",
    "load_pool",
    "open_llm_leaderboard",
    "read_pool_csv",
    "top_k_cells",
    "top_k_complexity",
    "tree_from_families",
    "tree_from_features",
    "variance_explained",
]


lazy_exports(__name__, _EXPORTS)
