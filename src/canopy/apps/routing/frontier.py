"""Cost-quality frontiers and their area: AIQ as RouterBench defines it (Hu et al. 2024,
Section 3.2): the area under the non-decreasing convex hull of a router's (cost, quality)
points, over a common cost interval ``[c_lo, c_hi]``, divided by its width.

Conventions (stated, since RouterBench leaves the ends implicit): the hull is the upper
concave envelope of the points, cut at its highest point and extended flat to ``c_hi`` (a
router can always spend more without losing quality by mixing in its best point); left of
the router's cheapest point the curve is 0 (it cannot operate there), so a router that never
reaches the cheap end pays for it.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["aiq", "nondecreasing_hull"]


def nondecreasing_hull(costs: np.ndarray, qualities: np.ndarray
                       ) -> tuple[np.ndarray, np.ndarray]:
    """Vertices ``(cost, quality)`` of the non-decreasing upper convex hull, by cost."""
    costs = np.asarray(costs, dtype=float)
    qualities = np.asarray(qualities, dtype=float)
    if costs.shape != qualities.shape or costs.ndim != 1 or costs.size == 0:
        raise ValueError("costs and qualities must be equal-length, non-empty 1-d arrays")
    if not (np.all(np.isfinite(costs)) and np.all(np.isfinite(qualities))):
        raise ValueError("costs and qualities must be finite")
    order = np.lexsort((-qualities, costs))
    hull: list[tuple[float, float]] = []
    for c, q in zip(costs[order], qualities[order], strict=True):
        if hull and c == hull[-1][0]:
            continue  # same cost, lower quality (sorted by -quality within a cost)
        while len(hull) >= 2:
            (c1, q1), (c2, q2) = hull[-2], hull[-1]
            if (q2 - q1) * (c - c1) <= (q - q1) * (c2 - c1):
                hull.pop()  # the middle vertex lies on or below the chord
            else:
                break
        hull.append((c, q))
    top = int(np.argmax([q for _, q in hull]))
    vertices = np.array(hull[:top + 1])
    return vertices[:, 0], vertices[:, 1]


def aiq(costs: np.ndarray, qualities: np.ndarray, c_lo: float, c_hi: float) -> float:
    """Area under the non-decreasing convex hull over ``[c_lo, c_hi]``, divided by the width
    (a mean quality); conventions in the module docstring."""
    if not (math.isfinite(c_lo) and math.isfinite(c_hi)) or c_hi <= c_lo:
        raise ValueError(f"need c_lo < c_hi, got [{c_lo}, {c_hi}]")
    hull_c, hull_q = nondecreasing_hull(costs, qualities)
    start = max(c_lo, float(hull_c[0]))  # the curve is 0 left of the cheapest point
    if start >= c_hi:
        return 0.0
    inside = hull_c[(hull_c > start) & (hull_c < c_hi)]
    grid = np.concatenate([[start], inside, [c_hi]])
    curve = np.interp(grid, hull_c, hull_q, right=hull_q[-1])
    area = float(np.sum(np.diff(grid) * (curve[1:] + curve[:-1]) / 2.0))
    return area / (c_hi - c_lo)
