"""The problem, the ledger and the run loop, driven by a minimal test policy."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from canopy import BudgetExceeded, LeafMeans, Ledger, ProblemSpec, Query, Tree, run
from canopy.instances import (
    heterogeneous_smoothness,
    infinite_depth,
    piecewise_lipschitz,
    tree_lipschitz,
)
from canopy.metrics import cumulative_regret, recall_at_k
from canopy.policies.base import Policy


class RandomProbes(Policy):
    """Test double: probes random internal nodes, then evaluates random leaves."""

    name = "random-probes"

    def _start(self) -> None:
        self.seen: list[float] = []

    def _next_query(self):
        tree = self.spec_.tree
        if self._affordable("leaf") and self.rng_.random() < 0.3:
            return Query("leaf", int(tree.leaf_node[self.rng_.integers(tree.n_leaves)]))
        return Query("probe", int(self.rng_.integers(tree.n_nodes - tree.n_leaves)))

    def _observe(self, query, value):
        self.seen.append(value)

    def recommend(self, k=1):
        return np.arange(k)


class Overspender(RandomProbes):
    """Asks for leaf evaluations past its budget by bypassing the base-class check."""

    def ask(self):
        query = Query("leaf", int(self.spec_.tree.leaf_node[0]))
        self._outstanding[query] = self._outstanding.get(query, 0) + 1
        return query


def test_leaf_means_probe_expectation_is_subtree_average():
    tree = Tree.from_parents([-1, 0, 0, 1, 1, 1, 2])  # irregular: leaves at depth 2 and... 2
    problem = LeafMeans(tree, np.array([0.1, 0.2, 0.9, 0.6]), sigma=0.0)
    rng = np.random.default_rng(0)
    draws = problem.probe_many(0, 40_000, rng)
    assert draws.mean() == pytest.approx(problem.node_values[0], abs=0.01)
    assert problem.node_values[0] == pytest.approx(0.45)
    assert problem.aggregation_bias(1) == pytest.approx(0.9 - 0.4)
    every = problem.aggregation_biases()
    assert every == pytest.approx([problem.aggregation_bias(v) for v in range(tree.n_nodes)])
    assert every[tree.leaf_node].tolist() == [0.0] * 4


def test_run_respects_budget_and_is_deterministic():
    problem = tree_lipschitz(2, 6, probe_cost=0.25, leaf_cost=1.0, seed=1)
    first = run(RandomProbes(), problem, budget=50.0, seed=7, record=True)
    second = run(RandomProbes(), problem, budget=50.0, seed=7, record=True)
    assert first.spent <= 50.0
    assert first.spent == pytest.approx(0.25 * first.n_probes + first.n_leaf_evals)
    assert first.history.values == second.history.values
    assert first.history.nodes == second.history.nodes


def test_ledger_refuses_overspending():
    ledger = Ledger(1.0)
    ledger.charge("probe", 0.6)
    with pytest.raises(BudgetExceeded, match="remains"):
        ledger.charge("leaf", 0.6)
    assert ledger.spent == pytest.approx(0.6)
    problem = tree_lipschitz(2, 3, seed=0)
    policy = Overspender()
    with pytest.raises(BudgetExceeded):
        run(policy, problem, budget=3.0, seed=0)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), "x"])
def test_bad_observations_are_rejected_and_state_kept(value):
    problem = tree_lipschitz(2, 3, seed=0)
    policy = RandomProbes().start(problem.spec, budget=10.0, seed=0)
    query = policy.ask()
    with pytest.raises((ValueError, TypeError)):
        policy.tell(query, value)
    assert policy.seen == []
    policy.tell(query, 0.5)  # the query is still outstanding: nothing was lost
    assert policy.seen == [0.5]
    with pytest.raises(ValueError, match="not asked"):
        policy.tell(query, 0.5)


def test_out_of_range_observation_is_rejected():
    tree = Tree.complete(2, 2)
    spec = ProblemSpec(tree, 0.0, 1.0, 1.0, value_range=(0.0, 1.0))
    policy = RandomProbes().start(spec, budget=5.0, seed=0)
    query = policy.ask()
    with pytest.raises(ValueError, match="outside the declared range"):
        policy.tell(query, 1.5)


@pytest.mark.parametrize("kwargs, message", [
    ({"probe_cost": 0.0}, "probe_cost"),
    ({"leaf_cost": -1.0}, "leaf_cost"),
    ({"probe_cost": 2.0}, "must not exceed"),
    ({"sigma": float("nan")}, "sigma"),
])
def test_bad_costs_are_refused(kwargs, message):
    args = {"sigma": 0.1, "probe_cost": 0.5, "leaf_cost": 1.0, **kwargs}
    with pytest.raises(ValueError, match=message):
        ProblemSpec(Tree.complete(2, 2), **args)


def test_budget_below_one_query_is_refused():
    problem = tree_lipschitz(2, 3, probe_cost=0.5, seed=0)
    with pytest.raises(ValueError, match="smaller than one query"):
        run(RandomProbes(), problem, budget=0.25, seed=0)
    with pytest.raises(ValueError, match="budget"):
        Ledger(0.0)


def test_leaf_query_of_internal_node_and_bad_indices():
    problem = tree_lipschitz(2, 3, seed=0)
    with pytest.raises(ValueError, match="internal"):
        problem.spec.check_query(Query("leaf", 0))
    with pytest.raises(IndexError):
        problem.evaluate(8, np.random.default_rng(0))
    with pytest.raises(ValueError, match="means"):
        LeafMeans(Tree.complete(2, 1), np.array([0.5, 1.5]))


def test_instance_families():
    smooth = tree_lipschitz(4, 4, lipschitz=1.0, seed=3)
    tree = smooth.tree
    for node in range(tree.n_nodes):
        block = smooth.means[list(tree.leaves_under(node))]
        assert np.ptp(block) <= 1.0 * 0.25 ** tree.level[node] + 1e-12
    for seed in range(10):
        planted = piecewise_lipschitz(4, 5, 3, seed=seed)
        assert planted.problem.best_leaf == planted.spike_leaves[0]
        spike_values = planted.problem.means[planted.spike_leaves]
        assert np.all(np.diff(spike_values) < 0)  # distinct, decreasing heights
        others = np.delete(planted.problem.means, planted.spike_leaves)
        assert spike_values.min() > others.max()
        assert planted.violation_cells.size == 3
    hetero = heterogeneous_smoothness(4, 4, seed=0)
    half = hetero.means.size // 2
    assert np.ptp(hetero.means[:half]) < np.ptp(hetero.means[half:])
    garland = infinite_depth(3)
    assert 0.9 < garland.mu_star <= 1.0
    assert garland.value((1, 1)) > garland.value((1, 0))


def test_metrics():
    assert recall_at_k([3, 1, 7], [1, 2, 3]) == pytest.approx(2 / 3)
    with pytest.raises(ValueError):
        recall_at_k([1, 2, 3, 4], [1, 2, 3])
    problem = tree_lipschitz(2, 4, seed=0)
    result = run(RandomProbes(), problem, budget=20.0, seed=0, record=True)
    regret = cumulative_regret(result, problem.value, problem.mu_star)
    assert regret.shape == (len(result.history),)
    assert np.all(np.diff(regret) >= -1e-12)


def test_a_leaf_cannot_be_probed_at_probe_cost():
    problem = tree_lipschitz(2, 3, probe_cost=0.1, seed=0)
    leaf_node = int(problem.tree.leaf_node[0])
    with pytest.raises(ValueError, match="is a leaf"):
        problem.spec.check_query(Query("probe", leaf_node))
    problem.spec.check_query(Query("leaf", leaf_node))


@pytest.mark.parametrize("costs", [[1.0, 3.0, 2.0], [0.05, 1.0, 0.05], [0.1, 0.3, 7.0]])
def test_charging_many_at_once_is_bit_for_bit_that_many_single_charges(costs):
    one_by_one, at_once = Ledger(1e6), Ledger(1e6)
    for cost, count in zip(costs, (4096, 333, 1000), strict=True):
        for _ in range(count):
            assert one_by_one.try_charge("leaf", cost)
        at_once.charge_many("leaf", cost, count)
        assert at_once.spent == one_by_one.spent
    assert at_once.n_leaves == one_by_one.n_leaves
    with pytest.raises(BudgetExceeded):
        at_once.charge_many("leaf", 1.0, 10**6)
    assert at_once.spent == one_by_one.spent  # nothing charged by the refused batch


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.just(0.0), st.floats(1e-12, 1e9)),
       st.one_of(st.sampled_from([0.05, 0.1, 1 / 3, 0.5, 2.0**-53, 1.5 * 2.0**-53,
                                  2.5 * 2.0**-52, 1e-17]),
                 st.floats(1e-9, 1e3)),
       st.integers(0, 20_000))
def test_repeated_sum_is_the_left_to_right_sum(start, term, count):
    """The ledger's batch charge jumps through a binade at once; it must land where adding one
    term at a time lands, ties and absorbed terms included."""
    from canopy._repeated_sum import repeated_sum

    total = start
    for _ in range(count):
        total += term
    assert repeated_sum(start, term, count) == total
