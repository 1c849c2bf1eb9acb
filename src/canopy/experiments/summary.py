"""Means over seeds with 95% Student-t confidence intervals (the paper's CI bands)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np
from scipy import stats

from canopy.experiments.study import Measurement, Row

__all__ = ["lookup", "summarize", "t_interval"]


def t_interval(values: Sequence[float] | np.ndarray, level: float = 0.95
               ) -> tuple[float, float | None, float | None]:
    """Mean and two-sided Student-t interval of the mean at ``level``; no interval for one value.
    """
    data = np.asarray(values, dtype=float)
    if data.size == 0:
        raise ValueError("no values to summarize")
    if not np.all(np.isfinite(data)):
        raise ValueError("values contain NaN or infinite entries")
    mean = float(data.mean())
    if data.size < 2:
        return mean, None, None
    half = float(stats.t.ppf(0.5 + level / 2, data.size - 1) * data.std(ddof=1)
                 / math.sqrt(data.size))
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
        mean, low, high = t_interval(groups[key])
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
