"""Means over seeds with 95% Student-t confidence intervals (the paper's CI bands)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np
from scipy import stats

from canopy.experiments.study import Measurement, Row

__all__ = ["find_row", "summarize", "t_interval"]


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
    """Group measurements by (method, x_name, x, metric), in order of first appearance, and
    reduce each group over seeds to its mean and 95% t-interval."""
    groups: dict[tuple, list[float]] = {}
    for m in measurements:
        groups.setdefault((m.method, m.x_name, m.x, m.metric), []).append(m.value)
    rows = []
    for (method, x_name, x, metric), values in groups.items():
        mean, low, high = t_interval(values)
        rows.append(Row(method, x_name, x, metric, mean, low, high, len(values)))
    return rows


def find_row(rows: Sequence[Row], *, method: str, metric: str, x: float | None = None) -> Row:
    """The row of ``method`` and ``metric`` at ``x`` (the one row when ``x`` is ``None`` and
    the method has a single x for that metric)."""
    matches = [r for r in rows if r.method == method and r.metric == metric
               and (x is None or (r.x is not None and math.isclose(r.x, x)))]
    if len(matches) != 1:
        raise KeyError(f"{len(matches)} rows for method={method!r} metric={metric!r} x={x!r}")
    return matches[0]
