import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from canopy import LazyTree, Tree


def test_complete_tree_layout():
    tree = Tree.complete(3, 4)
    assert tree.n_leaves == 81 and tree.n_nodes == 121 and tree.depth == 4
    for node in range(tree.n_nodes):
        kids = tree.children(node)
        if kids.size:
            assert np.all(tree.parent[kids] == node)
            assert tree.leaf_lo[kids[0]] == tree.leaf_lo[node]
            assert tree.leaf_hi[kids[-1]] == tree.leaf_hi[node]
            assert tree.n_leaves_under(node) == 3 ** (4 - tree.level[node])
    assert np.array_equal(tree.node_leaf[tree.leaf_node], np.arange(81))


@st.composite
def parent_arrays(draw):
    n = draw(st.integers(1, 60))
    return [-1] + [draw(st.integers(0, v - 1)) for v in range(1, n)]


@settings(max_examples=60, deadline=None)
@given(parent_arrays())
def test_from_parents_leaf_ranges_are_contiguous_and_exact(parents):
    tree = Tree.from_parents(parents)
    # every node's leaf range holds exactly the leaves reached by walking down from it
    for node in range(tree.n_nodes):
        below = {int(leaf) for leaf in range(tree.n_leaves)
                 if node in tree.path_to_root(int(tree.leaf_node[leaf]))}
        assert below == set(tree.leaves_under(node))
    assert tree.n_leaves == sum(1 for v in range(len(parents)) if v not in parents[1:])


def test_subtree_means_match_eq1_on_irregular_tree():
    tree = Tree.from_parents([-1, 0, 0, 1, 1, 1, 2, 6, 6])
    values = np.arange(tree.n_leaves, dtype=float)
    means = tree.subtree_means(values)
    for node in range(tree.n_nodes):
        assert means[node] == pytest.approx(values[list(tree.leaves_under(node))].mean())


def test_from_paths_is_a_prefix_trie():
    tree = Tree.from_paths([("stem", "physics", "q1"), ("stem", "physics", "q2"),
                            ("stem", "math", "q3"), ("humanities", "q4")])
    assert tree.n_leaves == 4
    assert tree.names == ("stem/physics/q1", "stem/physics/q2", "stem/math/q3", "humanities/q4")
    assert tree.n_leaves_under(tree.children(0)[0]) == 3
    with pytest.raises(ValueError, match="prefix"):
        Tree.from_paths([(1, 2), (1, 2, 3)])
    with pytest.raises(ValueError, match="repeated"):
        Tree.from_paths([(1, 2), (1, 2)])


def test_from_features_keeps_every_row():
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(4, 3)) * 10
    features = np.repeat(centres, 30, axis=0) + rng.normal(size=(120, 3)) * 0.1
    tree = Tree.from_features(features, branching=4, depth=2, seed=1)
    assert tree.n_leaves == 120
    assert sorted(tree.row_of_leaf.tolist()) == list(range(120))
    # the four well-separated clusters become the root's four subtrees
    for child in tree.children(0):
        rows = tree.row_of_leaf[list(tree.leaves_under(child))]
        assert len(set(rows // 30)) == 1


@pytest.mark.parametrize("parents, message", [
    ([], "empty"),
    ([0, 0], "root"),
    ([-1, -1], "exactly one root"),
    ([-1, 5], "outside"),
    ([-1, 2, 1], "cycle"),
])
def test_malformed_trees_are_refused(parents, message):
    with pytest.raises(ValueError, match=message):
        Tree.from_parents(parents)


def test_index_errors_name_the_problem():
    tree = Tree.complete(2, 3)
    with pytest.raises(IndexError, match="node 99"):
        tree.children(99)
    with pytest.raises(IndexError, match="leaf 8"):
        tree.check_leaf(8)
    with pytest.raises(TypeError, match="branching"):
        Tree.complete(2.5, 3)


def test_lazy_tree_cells_tile_the_interval():
    tree = LazyTree(3)
    kids = tree.children((2, 4))
    assert kids == [(3, 12), (3, 13), (3, 14)]
    low, high = tree.interval((2, 4))
    assert (low, high) == pytest.approx((4 / 9, 5 / 9))
    assert tree.n_nodes_to_level(4) == 121
    with pytest.raises(IndexError):
        tree.check_node((1, 3))


def _box_centre_cell(arity: int, dims: int, node: tuple[int, int], level: int) -> int:
    """The cell at ``level`` holding ``node``'s box centre, found by descending the boxes
    (Morton order: level ``s`` splits dimension ``s % dims``; a centre on a boundary goes up)."""
    def box(lvl: int, index: int) -> tuple[list[float], list[float]]:
        low, width = [0.0] * dims, [1.0] * dims
        for step in range(lvl):
            digit = index // arity ** (lvl - 1 - step) % arity
            width[step % dims] /= arity
            low[step % dims] += digit * width[step % dims]
        return low, width

    low, width = box(*node)
    centre = [lo + w / 2 for lo, w in zip(low, width, strict=True)]
    index = node[1]
    for step in range(node[0], level):
        lo, w = box(step, index)
        k = step % dims
        index = index * arity + min(int((centre[k] - lo[k]) * arity / w[k] + 1e-9), arity - 1)
    return index


@pytest.mark.parametrize("arity", [2, 3, 4])
@pytest.mark.parametrize("dims", [1, 2, 3])
def test_lazy_tree_centre_is_the_box_centre(arity, dims):
    tree = LazyTree(arity, dims=dims)
    for node in [(0, 0), (1, arity - 1), (2, 1), (3, arity**3 - 2)]:
        for level in range(node[0], node[0] + 7):
            assert tree.centre(node, level) == (level, _box_centre_cell(arity, dims, node, level))
    # one dimension: the middle of the interval
    assert LazyTree(2).centre((1, 1), 4) == (4, 0b1100)
    assert LazyTree(2, dims=2).centre((1, 1), 4) == (4, 0b1110)
    with pytest.raises(ValueError, match="above"):
        tree.centre((2, 0), 1)
    with pytest.raises(ValueError, match="dims"):
        LazyTree(2, dims=0)
