"""Compiled bookkeeping of the phased policies (:mod:`canopy.policies._identify_core`).

Each phase of a phased policy touches a few dozen cells or arms; written as numpy calls, the
fixed cost of each call (about 1-3 us here) dominates the work, so the steps a phase repeats
are single compiled calls instead (per-query overhead against a vectorised numpy
successive-elimination loop). Each kernel states the numpy expression it computes; the tests
check them against it.
"""

from __future__ import annotations

import math

import numba
import numpy as np

__all__ = ["add_moments", "all_within", "beam_level", "children_of", "concat_ranges",
           "fill_leaves", "keep_best", "keep_best_means", "means_at", "round_robin"]


@numba.njit(cache=True)
def all_within(values: np.ndarray, low: float, high: float) -> bool:
    """``np.all(np.isfinite(values) & (values >= low) & (values <= high))`` in one pass."""
    for x in values:
        if not (low <= x <= high and math.isfinite(x)):
            return False
    return True


@numba.njit(cache=True)
def concat_ranges(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """``np.concatenate([np.arange(a, b) for a, b in zip(lo, hi)])`` (every ``hi >= lo``)."""
    out = np.empty(max(int(np.sum(hi - lo)), 0), dtype=np.int64)
    at = 0
    for i in range(lo.size):
        for value in range(lo[i], hi[i]):
            out[at] = value
            at += 1
    return out


@numba.njit(cache=True)
def children_of(child_ptr: np.ndarray, child_ids: np.ndarray, nodes: np.ndarray) -> np.ndarray:
    """The children of ``nodes``, node by node: ``child_ids[concat_ranges(child_ptr[nodes],
    child_ptr[nodes + 1])]``."""
    total = 0
    for v in nodes:
        total += child_ptr[v + 1] - child_ptr[v]
    out = np.empty(total, dtype=child_ids.dtype)
    at = 0
    for v in nodes:
        for j in range(child_ptr[v], child_ptr[v + 1]):
            out[at] = child_ids[j]
            at += 1
    return out


@numba.njit(cache=True)
def round_robin(nodes: np.ndarray, counts: np.ndarray, target: int) -> np.ndarray:
    """``nodes`` repeated round by round until each has ``target`` observations (``counts``
    has): ``np.broadcast_to(nodes, (R, n))[np.arange(R)[:, None] < need]`` with ``need =
    target - counts`` and ``R = max(need)``."""
    need = np.empty(nodes.size, dtype=np.int64)
    rounds = 0
    total = 0
    for i in range(nodes.size):
        need[i] = int(target - counts[i])
        rounds = max(rounds, need[i])
        total += max(need[i], 0)
    out = np.empty(total, dtype=np.int64)
    at = 0
    for r in range(rounds):
        for i in range(nodes.size):
            if need[i] > r:
                out[at] = nodes[i]
                at += 1
    return out


@numba.njit(cache=True)
def add_moments(count: np.ndarray, total: np.ndarray, squares: np.ndarray | None,
                index: np.ndarray, values: np.ndarray) -> None:
    """``np.add.at`` of 1, the values and (unless ``squares`` is None) their squares at
    ``index``, in one pass."""
    for i in range(index.size):
        j, x = index[i], values[i]
        count[j] += 1.0
        total[j] += x
        if squares is not None:
            squares[j] += x * x


@numba.njit(cache=True)
def means_at(total: np.ndarray, count: np.ndarray, index: np.ndarray) -> np.ndarray:
    """``total[index] / count[index]``, ``-inf`` where the count is 0."""
    out = np.empty(index.size)
    for i in range(index.size):
        n = count[index[i]]
        out[i] = total[index[i]] / n if n > 0 else -np.inf
    return out


@numba.njit(cache=True)
def fill_leaves(target: np.ndarray, nodes: np.ndarray, leaf_lo: np.ndarray,
                leaf_hi: np.ndarray, values: np.ndarray) -> None:
    """``target[leaf_lo[v]:leaf_hi[v]] = values[i]`` for each ``v = nodes[i]`` in order (the
    leaves below each node; later nodes win)."""
    for i in range(nodes.size):
        target[leaf_lo[nodes[i]]:leaf_hi[nodes[i]]] = values[i]


@numba.njit(inline="always")
def _ahead(a: int, b: int, scores: np.ndarray, keys: np.ndarray) -> bool:
    """Whether entry ``a`` ranks ahead of ``b`` in ``np.lexsort((keys, -scores))``: the higher
    score (a NaN last), then the smaller key, then the earlier position."""
    score_a, score_b = scores[a], scores[b]
    if score_a != score_b:  # unequal, or both NaN
        a_nan, b_nan = score_a != score_a, score_b != score_b
        if not (a_nan and b_nan):
            return b_nan if a_nan or b_nan else score_a > score_b
    if keys[a] != keys[b]:
        return keys[a] < keys[b]
    return a < b


@numba.njit(cache=True)
def _ranked(scores: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """``np.lexsort((keys, -scores))`` by a bottom-up merge sort on :func:`_ahead` (a strict
    total order, so any correct sort gives lexsort's order; numba's own argsort takes seconds
    to compile)."""
    n = scores.size
    order = np.arange(n)
    spare = np.empty(n, dtype=np.int64)
    width = 1
    while width < n:
        for lo in range(0, n, 2 * width):
            mid, hi = min(lo + width, n), min(lo + 2 * width, n)
            i, j = lo, mid
            for k in range(lo, hi):
                if j < hi and (i == mid or _ahead(order[j], order[i], scores, keys)):
                    spare[k] = order[j]
                    j += 1
                else:
                    spare[k] = order[i]
                    i += 1
        order, spare = spare, order
        width *= 2
    return order


@numba.njit(cache=True)
def keep_best(nodes: np.ndarray, scores: np.ndarray, n_keep: int, tiebreak: np.ndarray,
              leaf_lo: np.ndarray, leaf_hi: np.ndarray, stage: np.ndarray,
              score: np.ndarray, event: int) -> np.ndarray:
    """Order ``nodes`` as ``np.lexsort((tiebreak[leaf_lo[nodes]], -scores))`` does, give the
    leaves of the nodes ranked after ``n_keep`` the stage ``event`` and their node's score,
    and return the first ``n_keep`` in their given order. Dropping a few (the one-per-phase
    rejections of successive rejects), the last are picked one at a time; else sorted."""
    n = nodes.size
    keys = tiebreak[leaf_lo[nodes]]
    kept = np.ones(n, dtype=np.bool_)
    n_drop = max(n - max(n_keep, 0), 0)
    if 8 * n_drop <= n:
        for _ in range(n_drop):
            last = -1
            for i in range(n):
                if kept[i] and (last < 0 or _ahead(last, i, scores, keys)):
                    last = i
            kept[last] = False
    elif n_drop > 0:
        kept[_ranked(scores, keys)[max(n_keep, 0):]] = False
    dropped = ~kept
    fill_leaves(stage, nodes[dropped], leaf_lo, leaf_hi, np.full(n_drop, event))
    fill_leaves(score, nodes[dropped], leaf_lo, leaf_hi, scores[dropped])
    return nodes[kept]


@numba.njit(cache=True)
def keep_best_means(nodes: np.ndarray, index: np.ndarray, total: np.ndarray, count: np.ndarray,
                    n_keep: int, tiebreak: np.ndarray, leaf_lo: np.ndarray,
                    leaf_hi: np.ndarray, stage: np.ndarray, score: np.ndarray,
                    event: int) -> np.ndarray:
    """:func:`keep_best` scored by the empirical means ``means_at(total, count, index)`` (a
    phase of successive rejects in one call)."""
    return keep_best(nodes, means_at(total, count, index), n_keep, tiebreak, leaf_lo, leaf_hi,
                     stage, score, event)


@numba.njit(cache=True)
def beam_level(cells: np.ndarray, spread: np.ndarray, width: int, node_sum: np.ndarray,
               node_n: np.ndarray, n_children: np.ndarray, child_ptr: np.ndarray,
               child_ids: np.ndarray, tiebreak: np.ndarray, leaf_lo: np.ndarray,
               leaf_hi: np.ndarray, stage: np.ndarray, score: np.ndarray,
               event: int) -> tuple[np.ndarray, np.ndarray]:
    """One level of :class:`~canopy.policies.identify.TopKBeam` after its probes: the beam
    score ``means_at(node_sum, node_n, cells) + spread`` written to the leaves below each
    cell (:func:`fill_leaves`), the ``width`` best cells kept (:func:`keep_best`, stage
    ``event`` for the rest) when there are more, and their children split into internal
    nodes (the next level) and leaves."""
    scores = means_at(node_sum, node_n, cells) + spread
    fill_leaves(score, cells, leaf_lo, leaf_hi, scores)
    if cells.size > width:
        cells = keep_best(cells, scores, width, tiebreak, leaf_lo, leaf_hi, stage, score, event)
    kids = children_of(child_ptr, child_ids, cells)
    inner = n_children[kids] > 0
    return kids[inner], kids[~inner]
