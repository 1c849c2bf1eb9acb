"""Top-k identification over real model pools (paper Section 5, Appendix E): pools from score
tables, pool trees, the multi-fidelity problem over a pool, and the variance the tree explains."""

from canopy.apps.topk.hardness import top_k_cells, top_k_complexity
from canopy.apps.topk.pools import (
    Pool,
    alpaca_eval,
    can_ai_code,
    load_pool,
    open_llm_leaderboard,
    read_pool_csv,
)
from canopy.apps.topk.problem import PoolProblem
from canopy.apps.topk.trees import PoolTree, tree_from_families, tree_from_features
from canopy.apps.topk.variance import VarianceExplained, variance_explained

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
