"""recall@k on hand-made pools, with and without ties at the k-th place."""

from __future__ import annotations

import numpy as np
import pytest

from canopy.apps.topk.select import make_policy, tied_recall
from canopy.metrics import recall_at_k


def test_tied_recall_is_recall_at_k_without_ties():
    rng = np.random.default_rng(0)
    for _ in range(200):
        scores = rng.permutation(50) / 50.0
        k = int(rng.integers(1, 11))
        picked = rng.choice(50, size=k, replace=False)
        truth = np.argsort(-scores)[:k]
        assert tied_recall(picked, scores, k) == recall_at_k(picked, truth)


def test_tied_recall_by_hand():
    scores = np.array([0.9, 0.8, 0.8, 0.1, 0.5])
    assert tied_recall([0, 2], scores, 2) == 1.0  # either 0.8 completes the top 2
    assert tied_recall([0, 1], scores, 2) == 1.0
    assert tied_recall([1, 2], scores, 2) == 0.5  # the clear best is missed
    assert tied_recall([3, 4], scores, 2) == 0.0
    assert tied_recall([0], scores, 2) == 0.5
    assert tied_recall([1, 2, 4], scores, 3) == 2 / 3
    assert tied_recall([0, 1, 2], scores, 3) == 1.0
    assert tied_recall([0, 0], scores, 2) == 0.5  # duplicates count once
    with pytest.raises(ValueError, match="3 picks for a top-2"):
        tied_recall([0, 1, 2], scores, 2)


def test_unknown_method_is_refused():
    with pytest.raises(ValueError, match="unknown method 'greedy'"):
        make_policy("greedy", k=3)
