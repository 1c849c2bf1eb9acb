"""Policies are data: every policy pickles at any point of a run (between an ask and its tell,
mid-batch, done) and the restored copy continues bit for bit; scikit-learn's ``get_params`` /
``set_params`` / ``clone`` conventions hold for every policy."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from canopy.instances import tree_lipschitz_values
from canopy.policies import _EXPORTS
from canopy.policies.baselines import (
    FlatUCB,
    SequentialHalving,
    SuccessiveElimination,
    SuccessiveRejects,
    Uniform,
)
from canopy.policies.descent import KnownBiasDescent, MemoryBoundedDescent, OptimisticDescent
from canopy.policies.hoo import HOO, POO
from canopy.policies.identify import EdgeTargeted, TopKBeam, TopKSound
from canopy.problem import FunctionOnInterval, LeafMeans
from canopy.tree import LazyTree, Tree

TREE = Tree.complete(2, 6)
MEANS = tree_lipschitz_values(TREE, 1.0, np.random.default_rng(0), branching=2)
FINITE = LeafMeans(TREE, MEANS, sigma=0.1, probe_cost=0.05)
LAZY = FunctionOnInterval(LazyTree(2), lambda x: 0.5 + 0.4 * np.sin(9.0 * x) * x, sigma=0.05)

POLICIES = {
    "beam-assumed": lambda: TopKBeam(k=2),
    "beam-certified": lambda: TopKBeam(k=2, spread="certified"),
    "beam-hybrid": lambda: TopKBeam(k=2, spread="hybrid"),
    "beam-paper": lambda: TopKBeam(spread="certified", certificate="paper"),
    "sound": lambda: TopKSound(k=2),
    "sound-hybrid": lambda: TopKSound(spread="hybrid"),
    "edge": lambda: EdgeTargeted(k=2),
    "uniform": Uniform,
    "se": lambda: SuccessiveElimination(k=2),
    "sr": lambda: SuccessiveRejects(k=2),
    "halving": lambda: SequentialHalving(k=2),
    "flat-ucb": FlatUCB,
    "hoo": HOO,
    "poo": POO,
    "known-bias": lambda: KnownBiasDescent(FINITE.aggregation_biases()),
    **{f"descent-{spread}-{expand}": (
        lambda spread=spread, expand=expand: OptimisticDescent(
            spread=spread, expand=expand, max_depth=4 if expand == "fixed" else None))
       for spread in ("assumed", "certified", "hybrid", "estimated")
       for expand in ("refine", "always", "fixed")},
    "descent-certified-paper": lambda: OptimisticDescent(spread="certified",
                                                         certificate="paper"),
    **{f"memory-{spread}": (lambda spread=spread: MemoryBoundedDescent(spread=spread))
       for spread in ("assumed", "estimated", "certified")},
}
BUDGET = 40.0


def _problem(name: str):
    return LAZY if name.startswith("memory") else FINITE


def _observe(problem, query, rng: np.random.Generator) -> float:
    if query.kind == "probe":
        return problem.probe(query.node, rng)
    return problem.evaluate(problem.spec.leaf_of(query.node), rng)


def _one_by_one(name: str, saves: frozenset[int] = frozenset()):
    """Run ``name`` query by query, pickling the policy between the ``t``-th ask and its tell
    for every ``t`` in ``saves`` (the noise stream stays with the driver)."""
    problem = _problem(name)
    policy = POLICIES[name]().start(problem.spec, budget=BUDGET, seed=7)
    rng = np.random.default_rng(11)
    asked = []
    while (query := policy.ask()) is not None:
        value = _observe(problem, query, rng)
        if len(asked) in saves:
            policy = pickle.loads(pickle.dumps(policy))
        asked.append(query)
        policy.tell(query, value)
    return asked, policy.spent, policy.recommend(1).tolist()


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_a_policy_saved_mid_run_continues_bit_for_bit(name):
    asked, spent, best = _one_by_one(name)
    assert len(asked) > 20
    n = len(asked)
    saves = frozenset({0, 1, n // 3, (2 * n) // 3, n - 1})
    again = _one_by_one(name, saves)
    assert again[0] == asked  # the same query sequence
    assert again[1] == spent and again[2] == best


def _batched(name: str, saves: frozenset[int] = frozenset()):
    """The batch surface, pickling between the ``i``-th ``ask_batch`` and its ``tell_batch``
    (the restored policy is told through the original batch object)."""
    problem = _problem(name)
    policy = POLICIES[name]().start(problem.spec, budget=BUDGET, seed=7)
    rng = np.random.default_rng(11)
    batches = []
    while len(batch := policy.ask_batch(13)):
        values = [_observe(problem, query, rng) for query in batch]
        if len(batches) in saves:
            policy = pickle.loads(pickle.dumps(policy))
        batches.append((batch.kind, batch.nodes.tolist()))
        policy.tell_batch(batch, values)
    return batches, policy.spent, policy.recommend(1).tolist()


@pytest.mark.parametrize("name", ["beam-hybrid", "sound", "edge", "se", "halving", "uniform",
                                  "descent-assumed-refine", "poo"])
def test_a_policy_saved_mid_batch_continues_bit_for_bit(name):
    batches, spent, best = _batched(name)
    n = len(batches)
    assert n > 3
    assert _batched(name, frozenset({0, n // 2, n - 1})) == (batches, spent, best)


def test_a_finished_policy_and_an_unstarted_one_pickle():
    policy = TopKBeam(k=2)
    fresh = pickle.loads(pickle.dumps(policy))
    assert fresh.get_params() == policy.get_params() and not hasattr(fresh, "ledger_")
    policy.start(FINITE.spec, budget=BUDGET, seed=1)
    rng = np.random.default_rng(2)
    while (query := policy.ask()) is not None:
        policy.tell(query, _observe(FINITE, query, rng))
    assert policy._plan_done and not policy._log  # the replay log is dropped when done
    done = pickle.loads(pickle.dumps(policy))
    assert done.ask() is None
    assert np.array_equal(done.recommend(5), policy.recommend(5))


def _instance(name: str):
    return KnownBiasDescent(FINITE.aggregation_biases()) if name == "KnownBiasDescent" else (
        getattr(__import__("canopy.policies", fromlist=[name]), name)())


@pytest.mark.parametrize("name", sorted(_EXPORTS))
def test_every_policy_follows_scikit_learns_parameter_conventions(name):
    clone = pytest.importorskip("sklearn.base").clone
    policy = _instance(name)
    params = policy.get_params()
    assert params or name == "Uniform"  # each stored under its own name
    copy = clone(policy)
    assert type(copy) is type(policy) and copy is not policy
    for key, value in params.items():
        assert np.array_equal(copy.get_params()[key], value) if isinstance(
            value, np.ndarray) else copy.get_params()[key] == value
    with pytest.raises(ValueError, match="no parameter 'nonsense'"):
        policy.set_params(nonsense=1)


def test_set_params_validates_and_reconfigures():
    policy = OptimisticDescent()
    assert policy.set_params(c=2, spread="estimated") is policy
    assert policy.get_params()["c"] == 2 and policy.name == "descent-estimated"
    with pytest.raises(ValueError, match="spread"):
        policy.set_params(spread="bogus")
    beam = TopKBeam(k=np.int64(3), lipschitz=2)  # stored as given, not converted
    assert type(beam.get_params()["k"]) is np.int64 and beam.get_params()["lipschitz"] == 2
    assert type(beam.get_params()["lipschitz"]) is int
