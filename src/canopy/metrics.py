"""Scores of runs: recall@k for identification, cumulative regret for regret play."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

import numpy as np

from canopy.run import RunResult

__all__ = ["cumulative_regret", "recall_at_k"]


def recall_at_k(recommended: Sequence[int] | np.ndarray, true_top: Sequence[int] | np.ndarray
                ) -> float:
    """Fraction of the true top-``k`` found among the ``k`` recommended (``k = len(true_top)``).

    Duplicates in ``recommended`` count once; a recommendation longer than ``k`` is refused.
    """
    truth = {int(x) for x in true_top}
    picked = [int(x) for x in recommended]
    if not truth:
        raise ValueError("true_top is empty")
    if len(picked) > len(truth):
        raise ValueError(f"{len(picked)} recommendations for a top-{len(truth)} question")
    return len(truth.intersection(picked)) / len(truth)


def cumulative_regret(result: RunResult, value: Callable[[Hashable], float],
                      mu_star: float) -> np.ndarray:
    """``R_t = sum_{s <= t} (mu* - f(v_s))`` over the played nodes of a recorded run
    (Section 3.1); ``value`` is the problem's ``f`` (e.g. ``LeafMeans.value``)."""
    if result.history is None:
        raise ValueError("the run was not recorded: call run(..., record=True)")
    gaps = np.fromiter((mu_star - value(node) for node in result.history.nodes), dtype=float,
                       count=len(result.history))
    return np.cumsum(gaps)
