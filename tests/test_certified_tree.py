"""Certified bounds composed up a tree: simultaneous coverage on whole trees by Monte Carlo,
composition tightening wide cells, incremental equals batch, and validation."""

from __future__ import annotations

import numpy as np
import pytest

from canopy.certified_tree import CertifiedTree
from canopy.instances import tree_lipschitz_values
from canopy.tree import Tree

SIGMA = 0.1
DELTA = 0.05
TREE = Tree.complete(4, 3)  # 64 leaves, 21 internal nodes
INTERNAL = np.flatnonzero(np.diff(TREE.child_ptr) > 0)


def _tree_means(shape: str, rng: np.random.Generator) -> np.ndarray:
    values = tree_lipschitz_values(TREE, 1.0, rng, branching=4)
    if shape == "one-spike":
        values = np.full(TREE.n_leaves, 0.3)
        values[rng.integers(TREE.n_leaves)] = 0.95
    return values


def _observe(ct: CertifiedTree, means: np.ndarray, per_node: int, rng: np.random.Generator,
             leaf_evals: int = 0) -> tuple[np.ndarray, np.ndarray]:
    nodes = np.repeat(INTERNAL, per_node)
    rng.shuffle(nodes)
    leaves = rng.integers(TREE.leaf_lo[nodes], TREE.leaf_hi[nodes])
    values = means[leaves] + SIGMA * rng.standard_normal(nodes.size)
    if leaf_evals:
        evaluated = np.repeat(np.arange(TREE.n_leaves), leaf_evals)
        nodes = np.concatenate([nodes, TREE.leaf_node[evaluated]])
        values = np.concatenate([values, means[evaluated]
                                 + SIGMA * rng.standard_normal(evaluated.size)])
    ct.update_many(nodes, values)
    return nodes, values


@pytest.mark.parametrize("shape", ["lipschitz", "one-spike"])
@pytest.mark.parametrize("per_node", [32, 256])
def test_composed_bounds_cover_every_node_simultaneously(shape, per_node):
    rng = np.random.default_rng([per_node, len(shape)])
    trials, all_covered = 400, 0
    for _ in range(trials):
        means = _tree_means(shape, rng)
        bias = TREE.subtree_max(means) - TREE.subtree_means(means)
        ct = CertifiedTree(TREE, SIGMA, delta=DELTA)
        _observe(ct, means, per_node, rng, leaf_evals=2)
        all_covered += bool(np.all(ct.bound(np.arange(TREE.n_nodes)) >= bias - 1e-12))
    assert all_covered / trials >= 1 - DELTA


def test_narrow_cells_certify_wide_ones():
    """On Lipschitz trees the root's composed bound is well below its own certificate's: the
    bound of a tree that saw only the root's observations (its unseen children add nothing)."""
    rng = np.random.default_rng(3)
    own, composed = [], []
    for _ in range(20):
        ct, alone = CertifiedTree(TREE, SIGMA), CertifiedTree(TREE, SIGMA)
        nodes, values = _observe(ct, _tree_means("lipschitz", rng), 256, rng)
        alone.update_many(nodes[nodes == 0], values[nodes == 0])
        own.append(alone.bound(0))
        composed.append(ct.bound(0))
    assert np.all(np.array(composed) <= np.array(own) + 1e-12)
    assert np.median(composed) < 0.85 * np.median(own)


def test_unobserved_nodes_have_the_value_range_and_bounds_never_loosen_with_delta():
    ct = CertifiedTree(TREE, SIGMA, value_range=(-1.0, 3.0))
    assert ct.bound(0) == pytest.approx(4.0)
    assert ct.upper(5) == pytest.approx(3.0) and ct.lower(5) == pytest.approx(-1.0)
    rng = np.random.default_rng(0)
    _observe(ct, -1.0 + 4.0 * _tree_means("lipschitz", rng), 128, rng)
    tight = ct.bound(np.arange(TREE.n_nodes)).copy()
    ct.set_node_delta(0.2)
    loose_level = ct.bound(np.arange(TREE.n_nodes))
    assert np.all(loose_level <= tight + 1e-12) and np.any(loose_level < tight)


def test_incremental_equals_batch():
    rng = np.random.default_rng(7)
    nodes = rng.choice(INTERNAL, size=600)
    values = rng.uniform(0, 1, 600) + SIGMA * rng.standard_normal(600)
    batch = CertifiedTree(TREE, SIGMA)
    batch.update_many(nodes, values)
    single = CertifiedTree(TREE, SIGMA)
    for node, value in zip(nodes.tolist(), values.tolist(), strict=True):
        single.update(node, value)
    every = np.arange(TREE.n_nodes)
    np.testing.assert_allclose(single.bound(every), batch.bound(every), rtol=1e-12, atol=1e-12)
    assert single.n_observations(int(nodes[0])) == int(np.sum(nodes == nodes[0]))


@pytest.mark.parametrize("kwargs, error, message", [
    ({"method": "paper"}, ValueError, "compose"),
    ({"delta": 0.0}, ValueError, "delta"),
    ({"value_range": (1.0, 1.0)}, ValueError, "value_range"),
    ({"node_delta": 2.0}, ValueError, "node_delta"),
])
def test_bad_setup_is_refused(kwargs, error, message):
    with pytest.raises(error, match=message):
        CertifiedTree(TREE, SIGMA, **kwargs)


def test_bad_observations_are_refused():
    ct = CertifiedTree(TREE, SIGMA)
    with pytest.raises(TypeError, match="complex"):
        ct.update(1, 0.5j)
    with pytest.raises(IndexError):
        ct.update(TREE.n_nodes, 0.5)
    with pytest.raises(ValueError, match="values"):
        ct.update_many([1, 2], [0.5])
    with pytest.raises(TypeError, match="Tree"):
        CertifiedTree("tree", SIGMA)  # type: ignore[arg-type]


@pytest.mark.parametrize("policy_name", ["TopKSound", "TopKBeam"])
def test_identification_policies_use_the_composed_certificate(policy_name):
    from canopy import policies
    from canopy.instances import tree_lipschitz
    from canopy.run import run

    covered = 0
    for seed in range(4):
        problem = tree_lipschitz(4, 3, sigma=SIGMA, probe_cost=0.05, seed=seed)
        policy = getattr(policies, policy_name)(spread="certified", lipschitz=1.0, k=2)
        run(policy, problem, budget=300.0, seed=seed, k=2)
        tree = problem.spec.tree
        bias = tree.subtree_max(problem.means) - tree.subtree_means(problem.means)
        probed = np.flatnonzero(policy._node_n > 1)
        assert probed.size > 5
        bounds = policy._certified(probed)
        assert np.all(bounds <= 1.0 + 1e-12)  # the value range caps every composed bound
        covered += bool(np.all(bounds >= bias[probed] - 1e-12))
    assert covered == 4
    paper = getattr(policies, policy_name)(spread="certified", lipschitz=1.0,
                                           certificate="paper")
    run(paper, tree_lipschitz(4, 3, sigma=SIGMA, probe_cost=0.05, seed=0), budget=100.0, seed=0)
    assert paper._ctree is None
