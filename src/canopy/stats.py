"""Pure statistical helpers: running moments and empirical-Bernstein bounds.

The empirical-Bernstein radius is the one Appendix A writes (Maurer and Pontil, 2009): for
``n`` i.i.d. draws in an interval of width ``R`` with sample variance ``V`` (denominator
``n - 1``), at level ``delta``,

    radius = sqrt(2 V log(1/delta) / n) + 7 R log(1/delta) / (3 (n - 1)).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = [
    "check_observation",
    "eb_radius",
    "mean_ci",
    "merge_moments",
    "std_lower_bound",
    "t_interval",
    "wilson_interval",
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


# -- intervals over seeds and replicates (the one place the library computes them) --
def mean_ci(values: np.ndarray, axis: int = -1, level: float = 0.95
            ) -> tuple[np.ndarray, np.ndarray]:
    """Mean and half-width of the Student-t ``level`` interval over ``axis`` (0 for one
    value)."""
    values = np.asarray(values, dtype=float)
    n = values.shape[axis]
    mean = values.mean(axis=axis)
    if n < 2:
        return mean, np.zeros_like(mean)
    sem = values.std(axis=axis, ddof=1) / math.sqrt(n)
    from scipy import stats  # lazy: scipy.stats costs a CLI start-up its import time

    return mean, stats.t.ppf(0.5 + level / 2.0, n - 1) * sem


def wilson_interval(successes: float, n: int, level: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion (always inside [0, 1])."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    from scipy import stats

    z = float(stats.norm.ppf(0.5 + level / 2))
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(centre - half, 0.0), min(centre + half, 1.0)


def t_interval(values: Sequence[float] | np.ndarray, level: float = 0.95,
               bounds: tuple[float, float] | None = None
               ) -> tuple[float, float | None, float | None]:
    """Mean and two-sided Student-t interval of the mean at ``level``; no interval for one value.
    With ``bounds`` (the metric's range) the interval stays inside it: Wilson score when every
    value is at an end of the range (successes and failures), the t-interval clipped otherwise.
    """
    data = np.asarray(values, dtype=float)
    if data.size == 0:
        raise ValueError("no values to summarize")
    if not np.all(np.isfinite(data)):
        raise ValueError("values contain NaN or infinite entries")
    mean = float(data.mean())
    if data.size < 2:
        return mean, None, None
    if bounds is not None:
        low, high = bounds
        if np.any(data < low) or np.any(data > high):
            raise ValueError(f"values outside the metric's range [{low}, {high}]")
        if np.all((data == low) | (data == high)) and high > low:
            p_low, p_high = wilson_interval(float(np.sum(data == high)), data.size, level)
            return mean, low + (high - low) * p_low, low + (high - low) * p_high
    half = float(mean_ci(data, level=level)[1])
    if bounds is not None:
        return mean, max(mean - half, bounds[0]), min(mean + half, bounds[1])
    return mean, mean - half, mean + half
