"""Means over seeds with 95% confidence intervals (the paper's CI bands): Student-t, kept on a
bounded metric's range (clipped; Wilson score when every value is at an end of the range, i.e.
a proportion of successes such as top-1 accuracy)."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence

import numpy as np
from scipy import stats

from canopy.experiments.study import Measurement, Row

__all__ = ["lookup", "metric_bounds", "summarize", "t_interval", "wilson_interval"]

_PROPORTION = re.compile(r"^(recall|accuracy|precision|top-\d+ accuracy)\b")


def metric_bounds(metric: str) -> tuple[float, float] | None:
    """The range of a metric whose values are proportions (recall@k, accuracy), else ``None``."""
    return (0.0, 1.0) if _PROPORTION.match(metric) else None


def wilson_interval(successes: float, n: int, level: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion (always inside [0, 1])."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
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
    half = float(stats.t.ppf(0.5 + level / 2, data.size - 1) * data.std(ddof=1)
                 / math.sqrt(data.size))
    if bounds is not None:
        return mean, max(mean - half, bounds[0]), min(mean + half, bounds[1])
    return mean, mean - half, mean + half


def summarize(measurements: Iterable[Measurement]) -> list[Row]:
    """Group measurements by (method, x_name, x, metric) and reduce each group over seeds to
    its mean and 95% t-interval. Rows are ordered by x axis, metric and method (each in order
    of first appearance), then by x (``None`` first)."""
    groups: dict[tuple, list[float]] = {}
    for m in measurements:
        groups.setdefault((m.method, m.x_name, m.x, m.metric), []).append(m.value)
    rank = [{key[i]: None for key in groups} for i in range(4)]
    order = [{value: n for n, value in enumerate(r)} for r in rank]

    def position(key: tuple) -> tuple:
        method, x_name, x, metric = key
        return (order[1][x_name], order[3][metric], order[0][method], x is not None, x or 0.0)

    rows = []
    for key in sorted(groups, key=position):
        mean, low, high = t_interval(groups[key], bounds=metric_bounds(key[3]))
        rows.append(Row(*key, mean, low, high, len(groups[key])))
    return rows


def lookup(rows: Sequence[Row], method: str, metric: str, x: float | None = None, *,
           x_name: str | None = None) -> Row | None:
    """The row of (method, metric, x) (on axis ``x_name`` if given), or ``None`` when the
    run's grid did not include it."""
    for row in rows:
        if row.method == method and row.metric == metric and x_name in (None, row.x_name) and (
                row.x == x or (row.x is not None and x is not None and math.isclose(row.x, x))):
            return row
    return None
