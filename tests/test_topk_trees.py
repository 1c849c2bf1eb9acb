"""Pool trees, the pool problem's outcomes, and the variance a tree explains."""

from __future__ import annotations

import numpy as np
import pytest

from canopy import Tree
from canopy.apps.topk import (
    Pool,
    PoolProblem,
    tree_from_families,
    tree_from_features,
    variance_explained,
)
from canopy.apps.topk.hardness import top_k_cells, top_k_complexity


def clustered_pool(n_per: int = 10, seed: int = 0) -> Pool:
    """Three tight clusters of candidates in feature space; the target follows the cluster."""
    rng = np.random.default_rng(seed)
    centres = np.array([[0.1, 0.1], [0.5, 0.9], [0.9, 0.4]])
    features = np.clip(np.repeat(centres, n_per, axis=0)
                       + 0.01 * rng.standard_normal((3 * n_per, 2)), 0, 1)
    target = np.repeat([0.2, 0.5, 0.8], n_per) + 0.01 * rng.random(3 * n_per)
    names = tuple(f"m{i}" for i in range(3 * n_per))
    return Pool("clusters", names, target, "t", features, ("f1", "f2"),
                groups={"family": tuple(f"fam{i // n_per}" for i in range(3 * n_per))})


def test_clustering_recovers_the_groups_and_maps_leaves_to_rows():
    pool = clustered_pool()
    pool_tree = tree_from_features(pool, branching=3, depth=2, seed=1)
    tree = pool_tree.tree
    assert tree.n_leaves == pool.size
    assert sorted(pool_tree.row_of_leaf.tolist()) == list(range(pool.size))
    assert list(tree.names) == [pool.names[r] for r in pool_tree.row_of_leaf]
    for child in tree.children(0):  # each level-1 cell is one planted cluster
        rows = pool_tree.row_of_leaf[list(tree.leaves_under(int(child)))]
        assert len({r // 10 for r in rows}) == 1
    shares = variance_explained(tree, pool_tree.by_leaf(pool.target))
    assert shares.at(1) > 0.99


def test_a_pool_larger_than_the_tree_is_not_truncated():
    pool = clustered_pool(n_per=10)  # 30 candidates, capacity 2**2 = 4
    pool_tree = tree_from_features(pool, branching=2, depth=2, seed=0)
    assert pool_tree.tree.n_leaves == 30
    assert pool_tree.n_deeper > 0
    assert pool_tree.tree.depth == 3


def test_features_must_exist_and_not_be_the_target():
    pool = clustered_pool()
    with pytest.raises(ValueError, match="it is the target"):
        tree_from_features(pool, columns=["t"])
    bare = Pool("bare", ("a", "b"), np.array([0.1, 0.2]), "t", np.empty((2, 0)), ())
    with pytest.raises(ValueError, match="no feature columns"):
        tree_from_features(bare)
    with pytest.raises(ValueError, match="no group column 'family'"):
        tree_from_families(bare, ["family"])


def test_families_tree():
    pool = clustered_pool(n_per=4)
    pool_tree = tree_from_families(pool, ["family"])
    tree = pool_tree.tree
    assert tree.n_leaves == 12 and len(tree.children(0)) == 3 and pool_tree.n_deeper == 0
    for child in tree.children(0):
        rows = pool_tree.row_of_leaf[list(tree.leaves_under(int(child)))]
        assert len({pool.groups["family"][r] for r in rows}) == 1
    assert list(tree.names) == [pool.names[r] for r in pool_tree.row_of_leaf]


def test_variance_explained_on_hand_made_trees():
    tree = Tree.complete(2, 2)
    assert variance_explained(tree, np.array([0.0, 0.0, 1.0, 1.0])).share == (1.0, 1.0)
    assert variance_explained(tree, np.array([0.0, 1.0, 0.0, 1.0])).share == (0.0, 1.0)
    # leaves 0,1 | 2,3 with values 0, 2 | 4, 10: total SS = 56; within = 2 + 18 = 20
    result = variance_explained(tree, np.array([0.0, 2.0, 4.0, 10.0]))
    assert result.at(1) == pytest.approx(1 - 20 / 56)
    assert result.n_groups == (2, 4)
    # an irregular tree: a leaf at level 1 is its own group at level 2
    irregular = Tree.from_parents([-1, 0, 0, 2, 2])
    assert variance_explained(irregular, np.array([1.0, 0.0, 0.0])).share == (1.0, 1.0)
    with pytest.raises(ValueError, match="shape"):
        variance_explained(tree, np.zeros(3))


def test_probes_average_the_candidates_below_and_bernoulli_outcomes_are_binary():
    pool = clustered_pool()
    pool_tree = tree_from_features(pool, branching=3, depth=2, seed=1)
    problem = PoolProblem(pool, pool_tree, probe_cost=0.05)
    assert problem.outcomes == "bernoulli" and problem.spec.value_range == (0.0, 1.0)
    rng = np.random.default_rng(3)
    node = int(problem.tree.children(0)[0])
    draws = np.array([problem.probe(node, rng) for _ in range(4000)])
    assert set(np.unique(draws)) <= {0.0, 1.0}
    expected = problem.tree.subtree_means(problem.means)[node]
    assert abs(draws.mean() - expected) < 4 * 0.5 / np.sqrt(draws.size)
    best = int(problem.top_k(1)[0])
    evals = np.array([problem.evaluate(best, rng) for _ in range(4000)])
    assert abs(evals.mean() - problem.means[best]) < 4 * 0.5 / np.sqrt(evals.size)
    assert problem.names_of(problem.top_k(1)) == [pool.names[int(pool.top_rows(1)[0])]]


def test_item_outcomes_skip_missing_items_and_repeat_under_a_seed():
    items = np.array([[1.0, 0.0, np.nan, np.nan], [0.25, 0.25, 0.25, 0.25], [np.nan, 1, 1, 1]])
    pool = Pool("items", ("a", "b", "c"), np.nanmean(items, axis=1), "t", np.empty((3, 0)), (),
                items=items, groups={"family": ("x", "x", "y")})
    problem = PoolProblem(pool, tree_from_families(pool, ["family"]))
    assert problem.outcomes == "items"
    leaf_a = int(problem.pool_tree.leaf_of_row[0])
    rng = np.random.default_rng(0)
    draws = np.array([problem.evaluate(leaf_a, rng) for _ in range(2000)])
    assert set(np.unique(draws)) == {0.0, 1.0}  # never the missing items' placeholder
    assert abs(draws.mean() - 0.5) < 0.06
    first = [problem.probe(0, np.random.default_rng(7)) for _ in range(3)]
    again = [problem.probe(0, np.random.default_rng(7)) for _ in range(3)]
    assert first == again
    with pytest.raises(ValueError, match="no per-item outcomes"):
        PoolProblem(clustered_pool(), tree_from_features(clustered_pool(), branching=3,
                                                         depth=1), outcomes="items")
    with pytest.raises(IndexError):
        problem.evaluate(3, rng)


def test_top_k_cells_and_complexity_by_hand():
    tree = Tree.complete(2, 2)  # leaves 0,1 | 2,3
    values = np.array([0.9, 0.8, 0.1, 0.2])
    assert top_k_cells(tree, values, 2) == (1, 2)
    assert top_k_cells(tree, np.array([0.9, 0.1, 0.8, 0.2]), 2) == (2, 2)
    # midpoint between 0.8 and 0.2 is 0.5: gaps 0.4, 0.3, 0.4, 0.3
    expected = 0.25 * (2 / 0.4**2 + 2 / 0.3**2)
    assert top_k_complexity(values, 2) == pytest.approx(expected)
    # a tie with the k-th score is left out; all tied below: infinite
    assert top_k_complexity(np.array([0.9, 0.8, 0.8, 0.2]), 2) == pytest.approx(
        0.25 * (1 / 0.4**2 + 1 / 0.3**2))
    assert top_k_complexity(np.array([0.9, 0.5, 0.5]), 2) == float("inf")
    with pytest.raises(ValueError, match="k must be in"):
        top_k_complexity(values, 4)


def test_the_feature_tree_never_looks_at_the_target():
    pool = clustered_pool()
    shuffled = Pool(pool.name, pool.names, np.random.default_rng(5).permutation(pool.target),
                    pool.target_name, pool.features, pool.feature_names)
    one = tree_from_features(pool, branching=3, depth=2, seed=2)
    two = tree_from_features(shuffled, branching=3, depth=2, seed=2)
    np.testing.assert_array_equal(one.row_of_leaf, two.row_of_leaf)
    np.testing.assert_array_equal(one.tree.parent, two.tree.parent)
