"""The compiled bookkeeping of the phased policies computes what the numpy expression in each
kernel's docstring computes (the kernels exist for speed only, issue 15)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from canopy.policies._bookkeeping import (
    add_moments,
    all_within,
    beam_level,
    children_of,
    concat_ranges,
    fill_leaves,
    keep_best,
    keep_best_means,
    means_at,
    round_robin,
)
from canopy.tree import Tree

SEEDS = st.integers(0, 2**32 - 1)


@settings(deadline=None)  # the first example compiles the kernel
@given(SEEDS, st.integers(0, 30))
def test_concat_ranges_is_the_concatenation_of_aranges(seed, n):
    rng = np.random.default_rng(seed)
    lo = rng.integers(0, 50, n)
    hi = lo + rng.integers(0, 6, n)
    pieces = [np.arange(a, b) for a, b in zip(lo, hi, strict=True)]
    expected = np.concatenate([*pieces, np.zeros(0, int)])
    assert concat_ranges(lo, hi).tolist() == expected.tolist()


@settings(deadline=None)
@given(SEEDS, st.integers(2, 40))
def test_children_of_lists_each_nodes_children_in_turn(seed, n_nodes):
    rng = np.random.default_rng(seed)
    tree = Tree.from_parents([-1, *(rng.integers(0, i) for i in range(1, n_nodes))])
    nodes = rng.integers(0, n_nodes, 6)
    expected = [kid for v in nodes.tolist() for kid in tree.children(v).tolist()]
    assert children_of(tree.child_ptr, tree.child_ids, nodes).tolist() == expected


@settings(deadline=None)
@given(SEEDS, st.integers(0, 30))
def test_round_robin_is_the_masked_broadcast(seed, n):
    rng = np.random.default_rng(seed)
    nodes = rng.integers(0, 1000, n)
    counts = rng.integers(0, 10, n).astype(float)  # more than the target already: none
    need = 6 - counts.astype(int)
    rounds = max(int(need.max(initial=0)), 0)
    mask = np.arange(rounds)[:, None] < need[None, :]
    expected = np.broadcast_to(nodes, mask.shape)[mask]
    assert round_robin(nodes, counts, 6).tolist() == expected.tolist()


@settings(deadline=None)
@given(SEEDS, st.integers(0, 20))
def test_all_within_is_the_finite_and_in_range_test(seed, n):
    rng = np.random.default_rng(seed)
    values = rng.choice([0.0, 0.5, 1.0, 1.5, -0.2, np.nan, np.inf, -np.inf], n)
    for low, high in ((0.0, 1.0), (-np.inf, np.inf), (-0.2, 0.5)):
        expected = bool(np.all(np.isfinite(values) & (values >= low) & (values <= high)))
        assert all_within(values, low, high) == expected


@settings(deadline=None)
@given(SEEDS, st.integers(0, 200))
def test_add_moments_and_means_at_are_add_at_and_a_guarded_division(seed, n):
    rng = np.random.default_rng(seed)
    index, values = rng.integers(0, 20, n), rng.normal(size=n)
    count, total, squares = np.zeros(20), np.zeros(20), np.zeros(20)
    add_moments(count, total, squares, index, values)
    add_moments(count, total, None, index, values)  # without squares: count and total only
    expected = [np.zeros(20) for _ in range(3)]
    for _ in range(2):
        np.add.at(expected[0], index, 1.0)
        np.add.at(expected[1], index, values)
    np.add.at(expected[2], index, values * values)
    for got, want in zip((count, total, squares), expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    at = rng.integers(0, 20, 15)
    with np.errstate(divide="ignore", invalid="ignore"):
        want = np.where(count[at] > 0, total[at] / count[at], -np.inf)
    assert means_at(total, count, at).tolist() == want.tolist()


@settings(deadline=None)
@given(SEEDS, st.integers(0, 12))
def test_fill_leaves_assigns_slices_in_order(seed, n):
    rng = np.random.default_rng(seed)
    leaf_lo = rng.integers(0, 40, 20)
    leaf_hi = leaf_lo + rng.integers(0, 10, 20)  # overlapping ranges: the later node wins
    nodes = rng.integers(0, 20, n)
    values = rng.normal(size=n)
    got, want = np.zeros(50), np.zeros(50)
    fill_leaves(got, nodes, leaf_lo, leaf_hi, values)
    for v, value in zip(nodes, values, strict=True):
        want[leaf_lo[v]:leaf_hi[v]] = value
    assert got.tolist() == want.tolist()


@settings(max_examples=200, deadline=None)
@given(SEEDS, st.integers(1, 60), st.data())
def test_keep_best_keeps_the_lexsort_prefix_and_marks_the_rest(seed, n, data):
    # disjoint cells: node i covers leaves [lo_i, hi_i); scores with ties, -inf and NaN
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 4, n)
    leaf_hi = np.cumsum(sizes)
    leaf_lo = leaf_hi - sizes
    nodes = rng.permutation(n)
    scores = rng.choice([0.0, 0.5, 1.0, -np.inf, np.nan, *rng.normal(size=3)], n)
    tiebreak = rng.permutation(int(leaf_hi[-1]))
    n_keep = data.draw(st.integers(0, n + 2))  # both branches, and more kept than there are
    stage = np.full(int(leaf_hi[-1]), -1)
    score = np.full(int(leaf_hi[-1]), np.nan)
    kept = keep_best(nodes, scores, n_keep, tiebreak, leaf_lo, leaf_hi, stage, score, 7)
    order = np.lexsort((tiebreak[leaf_lo[nodes]], -scores))
    assert kept.tolist() == nodes[np.sort(order[:n_keep])].tolist()
    for i in order[n_keep:]:
        cell = slice(leaf_lo[nodes[i]], leaf_hi[nodes[i]])
        assert (stage[cell] == 7).all()
        np.testing.assert_array_equal(score[cell], scores[i])  # NaN matches NaN here
    for i in order[:n_keep]:
        assert (stage[leaf_lo[nodes[i]]:leaf_hi[nodes[i]]] == -1).all()


@settings(max_examples=50, deadline=None)
@given(SEEDS, st.integers(1, 8))
def test_beam_level_and_keep_best_means_are_their_steps_in_turn(seed, width):
    rng = np.random.default_rng(seed)
    tree = Tree.complete(3, 4)
    cells = np.sort(rng.choice(tree.nodes_at_level(2), 6, replace=False))
    node_n = rng.integers(0, 3, tree.n_nodes).astype(float)
    node_sum = rng.normal(size=tree.n_nodes) * node_n
    spread = rng.random(cells.size)
    tiebreak = rng.permutation(tree.n_leaves)
    states = [(np.full(tree.n_leaves, -1), np.zeros(tree.n_leaves)) for _ in range(2)]
    got = beam_level(cells, spread, width, node_sum, node_n, tree.n_children, tree.child_ptr,
                     tree.child_ids, tiebreak, tree.leaf_lo, tree.leaf_hi, *states[0], 4)
    stage, score = states[1]
    scores = means_at(node_sum, node_n, cells) + spread
    fill_leaves(score, cells, tree.leaf_lo, tree.leaf_hi, scores)
    kept = cells
    if cells.size > width:
        kept = keep_best(cells, scores, width, tiebreak, tree.leaf_lo, tree.leaf_hi, stage,
                         score, 4)
    kids = children_of(tree.child_ptr, tree.child_ids, kept)
    internal = tree.n_children[kids] > 0
    assert got[0].tolist() == kids[internal].tolist()
    assert got[1].tolist() == kids[~internal].tolist()
    for mine, theirs in zip(states[0], states[1], strict=True):
        assert mine.tolist() == theirs.tolist()
    stage, score = np.full(tree.n_leaves, -1), np.zeros(tree.n_leaves)
    by_means = keep_best_means(cells, cells, node_sum, node_n, 3, tiebreak, tree.leaf_lo,
                               tree.leaf_hi, stage, score, 1)
    by_scores = keep_best(cells, means_at(node_sum, node_n, cells), 3, tiebreak, tree.leaf_lo,
                          tree.leaf_hi, np.full(tree.n_leaves, -1), np.zeros(tree.n_leaves), 1)
    assert by_means.tolist() == by_scores.tolist()


def test_keep_best_sorts_a_large_field_as_lexsort_does():
    """The merge-sort branch on a field of 5,000 with repeated scores and shared tie-break
    keys (a node and its first child start at the same leaf: the position decides)."""
    rng = np.random.default_rng(7)
    n = 5000
    scores = rng.choice([0.1, 0.2, 0.3, np.nan, -np.inf], n)
    tiebreak = rng.permutation(50)
    leaf_lo = rng.integers(0, 50, n)
    order = np.lexsort((tiebreak[leaf_lo], -scores))
    stage, score = np.full(50, -1), np.zeros(50)
    kept = keep_best(np.arange(n), scores, 1234, tiebreak, leaf_lo, leaf_lo, stage, score, 0)
    assert kept.tolist() == np.sort(order[:1234]).tolist()
