"""Per-round overhead of TopKBeam and EdgeTargeted (the lead's ``canopy bench`` can call
:func:`_bench`). Runs on complete(2, 10) and a 1,048,576-leaf tree at 10k and 100k budget units,
probe cost 0.05. Not asserted: benchmarks measure, tests never time."""

from __future__ import annotations

import time

import numpy as np
import pytest

from canopy.bench import policy_overhead_us
from canopy.instances import tree_lipschitz_values
from canopy.policies.identify import EdgeTargeted, TopKBeam
from canopy.problem import LeafMeans
from canopy.run import run
from canopy.tree import Tree

_PROBLEMS: dict[int, LeafMeans] = {}


def _problem(depth: int) -> LeafMeans:
    """A tree-Lipschitz instance on complete(2, depth), built once per depth."""
    if depth not in _PROBLEMS:
        tree = Tree.complete(2, depth)
        means = tree_lipschitz_values(tree, 1.0, np.random.default_rng(0), branching=2)
        _PROBLEMS[depth] = LeafMeans(tree, means, sigma=0.1, probe_cost=0.05)
    return _PROBLEMS[depth]


def _bench(policy_name: str, depth: int, budget: float, seed: int = 0) -> dict[str, float]:
    """Drive one policy through :func:`canopy.run.run`; returns the queries issued, the wall
    time, and the mean overhead per query (policy plus run loop plus oracle) in microseconds."""
    policy = {"canopy-beam": lambda: TopKBeam(k=5),
              "canopy-edge": lambda: EdgeTargeted(k=5)}[policy_name]()
    problem = _problem(depth)
    start = time.perf_counter()
    result = run(policy, problem, budget=budget, seed=seed, k=5)
    seconds = time.perf_counter() - start
    queries = result.n_probes + result.n_leaf_evals
    return {"leaves": float(problem.tree.n_leaves), "budget": budget, "queries": float(queries),
            "seconds": seconds, "us_per_query": 1e6 * seconds / max(queries, 1)}


@pytest.mark.parametrize("policy_name", ["canopy-beam", "canopy-edge"])
@pytest.mark.parametrize("depth", [10, 20])
@pytest.mark.parametrize("budget", [10_000.0, 100_000.0])
def test_per_round_overhead(benchmark, policy_name, depth, budget):
    stats = benchmark.pedantic(_bench, args=(policy_name, depth, budget), rounds=1,
                               iterations=1)
    benchmark.extra_info.update(stats)
    assert stats["queries"] > 0


@pytest.mark.parametrize("policy_name", ["canopy-beam", "canopy-edge"])
def test_ask_tell_overhead(benchmark, policy_name):
    """The policy's own ask+tell time per query (:func:`canopy.bench.policy_overhead_us`) on
    complete(2, 10) over 10,000 rounds."""
    make = {"canopy-beam": TopKBeam, "canopy-edge": EdgeTargeted}[policy_name]
    us = benchmark.pedantic(policy_overhead_us, args=(make, Tree.complete(2, 10), 10_000),
                            rounds=1, iterations=1)
    benchmark.extra_info["us_per_query"] = us
    assert us > 0
