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


def test_recall_of_a_selection_on_a_hand_made_pool():
    from canopy.apps.topk import Pool, PoolProblem, tree_from_families
    from canopy.apps.topk.select import select_top_k

    # deterministic outcomes: accuracy 1 always answers 1, accuracy 0 always 0
    target = np.array([0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.5])
    names = tuple(f"m{i}" for i in range(target.size))
    pool = Pool("hand", names, target, "t", np.empty((target.size, 0)), (),
                groups={"family": tuple("abc"[i % 3] for i in range(target.size))})
    problem = PoolProblem(pool, tree_from_families(pool, ["family"]))
    choice = select_top_k(problem, k=2, budget=240, method="uniform", seed=3)
    assert set(choice.names) == {"m1", "m4"} and choice.recall == 1.0
    three = select_top_k(problem, k=3, budget=240, method="uniform", seed=3)
    assert three.names[:2] in (("m1", "m4"), ("m4", "m1")) and three.names[2] == "m11"
    assert three.recall == 1.0
    few = select_top_k(problem, k=2, budget=3, method="uniform", seed=3)  # 3 of 12 seen
    hits = len({"m1", "m4"} & set(few.names))
    assert few.recall == hits / 2
