"""Per-round overhead of TopKBeam and EdgeTargeted (the lead's ``canopy bench`` can call
:func:`_bench`). Runs on complete(2, 10) and a 1,048,576-leaf tree at 10k and 100k budget units,
probe cost 0.05. Not asserted: benchmarks measure, tests never time."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from canopy.bench import policy_overhead_us
from canopy.instances import tree_lipschitz_values
from canopy.policies.baselines import SuccessiveElimination
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


def _numpy_successive_elimination(means: np.ndarray, sigma: float, pulls: int, keep: int,
                                  delta: float, rng: np.random.Generator
                                  ) -> tuple[int, float, float]:
    """The reference: successive elimination written as a vectorised numpy loop (one array
    operation per round). Returns the pulls made, the nanoseconds spent outside drawing the
    observations (the algorithm's own bookkeeping), and the nanoseconds in all."""
    n = means.size
    alive = np.arange(n)
    sums = np.zeros(n)
    rounds, made, drawing = 0, 0, 0
    start = time.thread_time_ns()
    while alive.size > keep and made + alive.size <= pulls:
        t0 = time.thread_time_ns()
        observed = means[alive] + sigma * rng.standard_normal(alive.size)
        drawing += time.thread_time_ns() - t0
        sums[alive] += observed
        made += alive.size
        rounds += 1
        radius = sigma * math.sqrt(2.0 * math.log(4.0 * n * rounds**2 / delta) / rounds)
        mean = sums[alive] / rounds
        kth_lower = np.partition(mean - radius, alive.size - keep)[alive.size - keep]
        alive = alive[mean + radius >= kth_lower]
    total = time.thread_time_ns() - start
    return made, total - drawing, total


def _batched_run(policy, problem: LeafMeans, budget: float, rng: np.random.Generator,
                 size: int = 4096) -> tuple[int, float, float]:
    """Drive ``policy`` through ``ask_batch``/``tell_batch`` with vectorised observations;
    the queries made, the nanoseconds spent in the policy (drawing excluded), and in all."""
    tree, spec = problem.tree, problem.spec
    start = time.thread_time_ns()
    policy.start(spec, budget=budget, seed=0)
    made, drawing = 0, 0
    while len(batch := policy.ask_batch(size)):
        t0 = time.thread_time_ns()
        nodes = batch.nodes
        if batch.kind == "leaf":
            values = problem.means[tree.node_leaf[nodes]]
        else:
            values = problem.means[rng.integers(tree.leaf_lo[nodes], tree.leaf_hi[nodes])]
        values = values + spec.sigma * rng.standard_normal(nodes.size)
        drawing += time.thread_time_ns() - t0
        policy.tell_batch(batch, values)
        made += nodes.size
    policy.recommend(5)
    total = time.thread_time_ns() - start
    return made, total - drawing, total


#: budget units at which each policy issues about 100k queries on complete(2, 14) with probes
#: at 0.05: successive elimination evaluates leaves (cost 1); the beam mixes probes and leaf
#: evaluations and issues 106,791 queries for 15,000 units (35,685 for 5,000).
_BUDGET_FOR_100K_QUERIES = {"se-batch": 100_000.0, "beam-batch": 15_000.0}


def test_batch_overhead_against_numpy_successive_elimination(benchmark):
    """Per-query time of ``SuccessiveElimination`` and ``TopKBeam`` through the batch API at
    about 100k queries each, against a vectorised numpy successive-elimination loop on the
    same 16,384 leaves (issue 15: within 5x): the algorithm's own time (drawing the
    observations excluded) and the whole loop. Recorded in ``extra_info``, not asserted."""
    problem = _problem(14)
    rng = np.random.default_rng(0)
    timings = {}
    for name, work in (
            ("numpy-se", lambda: _numpy_successive_elimination(
                problem.means, 0.1, 100_000, 5, 0.05, rng)),
            ("se-batch", lambda: _batched_run(SuccessiveElimination(k=5), problem,
                                              _BUDGET_FOR_100K_QUERIES["se-batch"], rng)),
            ("beam-batch", lambda: _batched_run(TopKBeam(k=5), problem,
                                                _BUDGET_FOR_100K_QUERIES["beam-batch"], rng))):
        work()  # warm-up (compilation, caches)
        made, own, total = min((work() for _ in range(5)), key=lambda r: r[1])
        timings[name] = own / 1e3 / made
        benchmark.extra_info[f"{name}_queries"] = made
        benchmark.extra_info[f"{name}_us_per_query_with_drawing"] = total / 1e3 / made
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)
    benchmark.extra_info.update({f"{k}_us_per_query": v for k, v in timings.items()})
    benchmark.extra_info["se_ratio"] = timings["se-batch"] / timings["numpy-se"]
    benchmark.extra_info["beam_ratio"] = timings["beam-batch"] / timings["numpy-se"]
    print(benchmark.extra_info)
