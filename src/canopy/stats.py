"""Pure statistical helpers: running moments and empirical-Bernstein bounds.

The empirical-Bernstein radius is the one Appendix A writes (Maurer and Pontil, 2009): for
``n`` i.i.d. draws in an interval of width ``R`` with sample variance ``V`` (denominator
``n - 1``), at level ``delta``,

    radius = sqrt(2 V log(1/delta) / n) + 7 R log(1/delta) / (3 (n - 1)).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = [
    "check_observation",
    "eb_radius",
    "merge_moments",
    "std_lower_bound",
]


def eb_radius(variance: np.ndarray | float, n: np.ndarray | float, delta: float,
              value_range: np.ndarray | float) -> np.ndarray:
    """Empirical-Bernstein confidence radius (one-sided, level ``delta``); ``inf`` for n < 2."""
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    n = np.asarray(n, dtype=float)
    log_term = math.log(1.0 / delta)
    with np.errstate(divide="ignore", invalid="ignore"):
        radius = (np.sqrt(2.0 * np.maximum(variance, 0.0) * log_term / n)
                  + 7.0 * np.asarray(value_range, dtype=float) * log_term / (3.0 * (n - 1.0)))
    return np.where(n >= 2, radius, np.inf)


def std_lower_bound(variance: np.ndarray | float, n: np.ndarray | float, delta: float,
                    value_range: float) -> np.ndarray:
    """One-sided lower confidence bound on a standard deviation (Maurer and Pontil 2009,
    Theorem 10, rescaled to an interval of width ``value_range``): with probability at least
    ``1 - delta`` the true standard deviation is at least
    ``sqrt(V) - value_range * sqrt(2 log(1/delta) / (n - 1))``. Clipped at zero; zero for n < 2.
    """
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    n = np.asarray(n, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        bound = (np.sqrt(np.maximum(variance, 0.0))
                 - value_range * np.sqrt(2.0 * math.log(1.0 / delta) / (n - 1.0)))
    return np.where(n >= 2, np.maximum(bound, 0.0), 0.0)


def merge_moments(count_a: float, mean_a: np.ndarray, m2_a: np.ndarray, count_b: float,
                  mean_b: np.ndarray, m2_b: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    """Chan et al.'s pairwise merge of two (count, mean, M2) summaries."""
    count = count_a + count_b
    if count == 0:
        return 0.0, mean_a, m2_a
    delta = mean_b - mean_a
    mean = mean_a + delta * (count_b / count)
    m2 = m2_a + m2_b + delta * delta * (count_a * count_b / count)
    return count, mean, m2


def check_observation(value: float, low: float = -math.inf, high: float = math.inf) -> float:
    """Reject NaN, infinite, or out-of-range observations with a ``ValueError`` naming them."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"observation must be a real number, got {value!r}") from None
    if not math.isfinite(number):
        raise ValueError(f"observation {value!r} is not finite")
    if not low <= number <= high:
        raise ValueError(f"observation {number} is outside the declared range [{low}, {high}]")
    return number
