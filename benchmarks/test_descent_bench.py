"""Per-round overhead of regret play (ask + tell through the Policy surface), at 10k and 100k
rounds, on a binary tree of depth 10 and on a 1,048,576-leaf tree (target: at most 5 us and
flat in the horizon). Run with ``pytest benchmarks/test_descent_bench.py --benchmark-enable``;
``extra_info["us_per_round"]`` holds the CPU-time figure of :func:`policy_overhead_us`.
``descent-certified`` composes the sharp certificate up the explored tree;
``descent-certified-paper`` is Algorithm 1 per node (the former variant).
``test_memory_bounded_per_round_overhead``: ``MemoryBoundedDescent`` (the default: assumed
spread, variance-scaled split, centre probes, balanced memory bound; the paper's
``split="eq6"``; the ``certified`` and ``estimated`` spreads) on ``LazyTree(2)`` (the
``canopy run pyxab`` setting) from 1k rounds, where PyXAB's HCT costs about 50 us a round (50x
that speed: 1 us)."""

from __future__ import annotations

import pytest

from canopy.bench import policy_overhead_us
from canopy.policies.descent import MemoryBoundedDescent, OptimisticDescent
from canopy.policies.hoo import HOO
from canopy.tree import LazyTree, Tree

TREES = {"binary-depth10": (2, 10), "binary-depth20": (2, 20)}
POLICIES = {
    "descent-assumed": lambda: OptimisticDescent(),
    "descent-certified": lambda: OptimisticDescent(spread="certified"),
    "descent-certified-paper": lambda: OptimisticDescent(spread="certified",
                                                         certificate="paper"),
    "descent-hybrid": lambda: OptimisticDescent(spread="hybrid"),
    "descent-estimated": lambda: OptimisticDescent(spread="estimated"),
    "hoo": lambda: HOO(),
}
_TREE_CACHE: dict[str, Tree] = {}


def _tree(name: str) -> Tree:
    if name not in _TREE_CACHE:
        _TREE_CACHE[name] = Tree.complete(*TREES[name])
    return _TREE_CACHE[name]


@pytest.mark.parametrize("rounds", [10_000, 100_000])
@pytest.mark.parametrize("tree_name", sorted(TREES))
@pytest.mark.parametrize("policy_name", sorted(POLICIES))
def test_per_round_overhead(benchmark, policy_name, tree_name, rounds):
    tree = _tree(tree_name)
    factory = POLICIES[policy_name]
    per_round = benchmark.pedantic(policy_overhead_us, args=(factory, tree, rounds),
                                   rounds=1, iterations=1)
    benchmark.extra_info["us_per_round"] = per_round
    assert per_round > 0


MEMORY_BOUNDED = {
    "default": {},
    "paper": {"split": "eq6"},
    "certified": {"spread": "certified"},
    "estimated": {"spread": "estimated"},
}


@pytest.mark.parametrize("rounds", [1_000, 10_000, 100_000])
@pytest.mark.parametrize("variant", sorted(MEMORY_BOUNDED))
def test_memory_bounded_per_round_overhead(benchmark, variant, rounds):
    kwargs = MEMORY_BOUNDED[variant]
    per_round = benchmark.pedantic(policy_overhead_us,
                                   args=(lambda: MemoryBoundedDescent(**kwargs),
                                         LazyTree(2), rounds),
                                   rounds=1, iterations=1)
    benchmark.extra_info["us_per_round"] = per_round
    assert per_round > 0
