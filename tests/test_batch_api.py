"""``ask_batch`` / ``tell_batch`` (issue 15 item 5): the batch surface gives the same run as
one query at a time, is all-or-nothing on bad input, and mixes with ``ask``/``tell``/``abandon``."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from canopy.instances import tree_lipschitz_values
from canopy.policies.baselines import (
    SequentialHalving,
    SuccessiveElimination,
    SuccessiveRejects,
    Uniform,
)
from canopy.policies.descent import MemoryBoundedDescent, OptimisticDescent
from canopy.policies.identify import EdgeTargeted, TopKBeam, TopKSound
from canopy.problem import FunctionOnInterval, LeafMeans, Query, QueryBatch
from canopy.tree import LazyTree, Tree

TREE = Tree.complete(2, 8)
MEANS = tree_lipschitz_values(TREE, 1.0, np.random.default_rng(0), branching=2)
PROBLEM = LeafMeans(TREE, MEANS, sigma=0.1, probe_cost=0.05)
POLICIES = {"beam": lambda: TopKBeam(k=3), "sound": lambda: TopKSound(k=3),
            "edge": lambda: EdgeTargeted(k=3), "se": lambda: SuccessiveElimination(k=3),
            "sr": lambda: SuccessiveRejects(k=3), "halving": lambda: SequentialHalving(k=3),
            "uniform": lambda: Uniform()}


def _value(kind: str, node: int) -> float:
    """A deterministic observation (so both surfaces see the same values)."""
    noise = 0.05 * math.sin(7.0 * node)
    base = PROBLEM.node_values[node] if kind == "probe" else MEANS[TREE.node_leaf[node]]
    return float(np.clip(base + noise, 0.0, 1.0))


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_a_batched_run_is_the_same_run(name):
    one = POLICIES[name]().start(PROBLEM.spec, budget=800.0, seed=3)
    while (query := one.ask()) is not None:
        one.tell(query, _value(query.kind, query.node))
    many = POLICIES[name]().start(PROBLEM.spec, budget=800.0, seed=3)
    sizes = []
    while len(batch := many.ask_batch(97)):
        sizes.append(len(batch))
        many.tell_batch(batch, [_value(batch.kind, node) for node in batch.nodes.tolist()])
    assert np.array_equal(one.recommend(3), many.recommend(3))
    assert (one.ledger_.n_probes, one.ledger_.n_leaves) == \
        (many.ledger_.n_probes, many.ledger_.n_leaves)
    assert math.isclose(one.spent, many.spent, rel_tol=1e-9) and max(sizes) <= 97


def test_a_batched_descent_plays_as_well_as_one_query_at_a_time():
    """A descent's batch repeats its current path (ask without tell), so it is another run
    than the one-by-one descent, not the same one: it spends the budget and recommends a leaf
    as good, within 0.02 of the best mean, on every seed."""
    best = float(MEANS.max())
    for seed in range(4):
        one = OptimisticDescent().start(PROBLEM.spec, budget=800.0, seed=seed)
        while (query := one.ask()) is not None:
            one.tell(query, _value(query.kind, query.node))
        many = OptimisticDescent().start(PROBLEM.spec, budget=800.0, seed=seed)
        while len(batch := many.ask_batch(97)):
            many.tell_batch(batch, [_value(batch.kind, node) for node in batch.nodes.tolist()])
        gaps = [best - MEANS[policy.recommend(1)[0]] for policy in (one, many)]
        assert many.spent > 800.0 - 97 * PROBLEM.spec.leaf_cost
        assert gaps[1] <= gaps[0] + 0.02, gaps


def test_tell_batch_is_all_or_nothing():
    spec = dataclasses.replace(PROBLEM.spec, value_range=(0.0, 1.0))
    policy = SuccessiveElimination(k=2).start(spec, budget=600.0, seed=0)
    batch = policy.ask_batch(50)
    good = [_value(batch.kind, node) for node in batch.nodes.tolist()]
    for bad, error in (([*good[:-1], math.nan], ValueError), (good[:-1], ValueError),
                       ([*good[:-1], 1.5], ValueError), ([*good[:-1], "x"], TypeError)):
        with pytest.raises(error):
            policy.tell_batch(batch, bad)
    policy.tell_batch(batch, good)  # every query still outstanding: nothing was taken
    with pytest.raises(ValueError, match="already told"):
        policy.tell_batch(batch, good)
    with pytest.raises(TypeError, match="QueryBatch"):
        policy.tell_batch(list(batch), good)
    with pytest.raises(ValueError, match="n must be >= 1"):
        policy.ask_batch(0)


def test_tell_batch_refuses_an_infinity_on_an_unbounded_range():
    assert PROBLEM.spec.value_range == (-math.inf, math.inf)
    for bad in (math.inf, -math.inf, math.nan):
        policy = SuccessiveElimination(k=2).start(PROBLEM.spec, budget=600.0, seed=0)
        batch = policy.ask_batch(20)
        with pytest.raises(ValueError):
            policy.tell_batch(batch, [0.5] * 19 + [bad])
    policy.tell_batch(batch, [1e308] * 20)  # large but finite: accepted


@pytest.mark.parametrize("name", ["beam", "se"])
def test_tell_batch_keeps_its_own_copy_of_the_values(name):
    """A caller that reuses one buffer for every batch gets the run of fresh arrays (the
    phased policies fold observations in at the next phase, after the buffer changed)."""
    runs = []
    for reuse in (False, True):
        policy = POLICIES[name]().start(PROBLEM.spec, budget=400.0, seed=0)
        buffer = np.empty(64)
        while len(batch := policy.ask_batch(64)):
            values = [_value(batch.kind, n) for n in batch.nodes.tolist()]
            out = buffer[:len(batch)] if reuse else np.empty(len(batch))
            out[:] = values
            policy.tell_batch(batch, out)
            if reuse:
                buffer[:] = -1.0  # scribbled over before the policy reads its statistics
        runs.append(policy.recommend(3).tolist())
    assert runs[0] == runs[1]


def test_batches_mix_with_single_queries_and_abandon():
    policy = TopKBeam(k=3).start(PROBLEM.spec, budget=400.0, seed=1)
    first = policy.ask()
    batch = policy.ask_batch(40)
    policy.tell(first, _value(first.kind, first.node))
    queries = list(batch)
    policy.abandon(queries[0], refund=True)
    for query in queries[1:]:
        policy.tell(query, _value(query.kind, query.node))  # batch queries told one by one
    with pytest.raises(ValueError, match="already told"):
        policy.tell(queries[1], 0.5)
    while len(batch := policy.ask_batch(64)):
        policy.tell_batch(batch, [_value(batch.kind, n) for n in batch.nodes.tolist()])
    assert policy.ask() is None and len(policy.recommend(3)) == 3
    assert policy.ledger_.n_leaves + policy.ledger_.n_probes > 1000


def test_a_batch_holds_one_kind_and_a_lazy_tree_gets_cell_pairs():
    f = lambda x: 0.5 + 0.4 * np.sin(6 * x)  # noqa: E731
    problem = FunctionOnInterval(LazyTree(2), f, sigma=0.05)
    policy = MemoryBoundedDescent().start(problem.spec, budget=200.0, seed=0)
    rng = np.random.default_rng(0)
    kinds = set()
    while len(batch := policy.ask_batch(16)):
        kinds.add(batch.kind)
        assert isinstance(batch, QueryBatch) and all(isinstance(q, Query) for q in batch)
        policy.tell_batch(batch, [float(np.clip(problem.probe(node, rng), 0, 1))
                                  for node in batch.nodes.tolist()])
    assert kinds == {"probe"} and policy.remaining < 1.0


def test_a_batch_told_query_by_query_releases_the_phase_barrier():
    policy = SuccessiveElimination(k=2).start(PROBLEM.spec, budget=600.0, seed=0)
    batch = policy.ask_batch(len(TREE.leaf_node))  # the whole first round
    for query in batch:  # told one at a time, the first one included
        policy.tell(query, _value(query.kind, query.node))
    assert len(policy.ask_batch(8)) == 8  # the next round is planned: nothing left waiting
