"""Means over seeds with 95% confidence intervals (the paper's CI bands): Student-t, kept in
the range of a metric whose measurements declare one (a proportion's [0, 1] or a bounded
range: clipped, and Wilson score when every value is at an end of the range, i.e. a
proportion of successes such as top-1 accuracy). The declared kind decides, never the name."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from canopy.experiments.study import Measurement, Row, kind_bounds
from canopy.stats import t_interval

__all__ = ["lookup", "summarize"]


def summarize(measurements: Iterable[Measurement]) -> list[Row]:
    """Group measurements by (method, x_name, x, metric) and reduce each group over seeds to
    its mean and 95% t-interval. Rows are ordered by x axis, metric and method (each in order
    of first appearance), then by x (``None`` first)."""
    groups: dict[tuple, list[float]] = {}
    kinds: dict[str, str] = {}
    for m in measurements:
        groups.setdefault((m.method, m.x_name, m.x, m.metric), []).append(m.value)
        if kinds.setdefault(m.metric, m.kind) != m.kind:
            raise ValueError(f"metric {m.metric!r} is declared both {kinds[m.metric]!r} and "
                             f"{m.kind!r}")
    rank = [{key[i]: None for key in groups} for i in range(4)]
    order = [{value: n for n, value in enumerate(r)} for r in rank]

    def position(key: tuple) -> tuple:
        method, x_name, x, metric = key
        return (order[1][x_name], order[3][metric], order[0][method], x is not None, x or 0.0)

    rows = []
    for key in sorted(groups, key=position):
        mean, low, high = t_interval(groups[key], bounds=kind_bounds(kinds[key[3]]))
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
