"""Percentile bootstrap intervals over items (problems, questions), plain and paired.

Paired intervals resample the same items for both methods, so the per-item gap carries the
shared difficulty out (the paper's "paired per-item bootstrap intervals", Section 4).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Interval", "bootstrap_mean", "paired_bootstrap"]


@dataclass(frozen=True)
class Interval:
    """A point estimate with a two-sided percentile interval at ``level``."""

    estimate: float
    low: float
    high: float
    level: float


def _resample_means(values: np.ndarray, n_resamples: int,
                    rng: np.random.Generator) -> np.ndarray:
    picks = rng.integers(0, values.size, size=(n_resamples, values.size))
    return values[picks].mean(axis=1)


def _check(values: np.ndarray, name: str) -> np.ndarray:
    array = np.asarray(values, dtype=float)
    if array.ndim != 1 or array.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D array, got shape {array.shape}")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name} contains NaN or infinite values")
    return array


def bootstrap_mean(values: np.ndarray, *, n_resamples: int = 2000, level: float = 0.95,
                   seed: int | np.random.Generator | None = 0) -> Interval:
    """Mean of per-item ``values`` with a percentile bootstrap interval over items."""
    array = _check(values, "values")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    means = _resample_means(array, n_resamples, np.random.default_rng(seed))
    tail = (1 - level) / 2
    low, high = np.quantile(means, [tail, 1 - tail])
    return Interval(float(array.mean()), float(low), float(high), level)


def paired_bootstrap(a: np.ndarray, b: np.ndarray, *, n_resamples: int = 2000,
                     level: float = 0.95,
                     seed: int | np.random.Generator | None = 0) -> Interval:
    """Mean of the per-item gap ``a - b`` with a paired percentile bootstrap interval."""
    first, second = _check(a, "a"), _check(b, "b")
    if first.shape != second.shape:
        raise ValueError(f"a and b must pair item by item, got {first.size} and {second.size}")
    return bootstrap_mean(first - second, n_resamples=n_resamples, level=level, seed=seed)
