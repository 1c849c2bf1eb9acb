"""Line styles that keep every series of a figure visible: its own marker and dash pattern,
and, for a series identical to an earlier one, a small offset and "(= other)" in its label."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["SeriesStyle", "distinct_series"]

_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "h")
_DASHES = ("-", "--", "-.", ":")


@dataclass(frozen=True)
class SeriesStyle:
    """How to draw one series: ``label``, matplotlib keyword arguments, and ``shift``, a
    multiplicative x offset (1 for a series that is not a copy of another)."""

    label: str
    kwargs: dict[str, Any]
    shift: float

    def along(self, xs: Sequence[float], span: float) -> list[float]:
        """``xs`` offset for a linear axis: by ``shift - 1`` times the axis' ``span``."""
        return [float(x) + (self.shift - 1) * span for x in xs]

    def along_log(self, xs: Sequence[float], ratio: float) -> list[float]:
        """``xs`` offset for a log axis spanning a factor ``ratio``: by ``ratio**(shift - 1)``."""
        return [float(x) * max(ratio, 10.0) ** (self.shift - 1) for x in xs]


def distinct_series(names: Sequence[str], ys: Sequence[Sequence[float]],
                    xs: Sequence[Sequence[float]] | None = None) -> list[SeriesStyle]:
    """One style per series, in order. A series identical to earlier ones is marked
    "(= them)" in its label; one that shares any point with earlier ones (given ``xs``; else
    only identical series count) is offset by 1.5% of x per such series, so no marker hides
    another's (points within 2% of the y range at the same x count as shared)."""
    if len(names) != len(ys) or (xs is not None and len(xs) != len(ys)):
        raise ValueError(f"{len(names)} names for {len(ys)} series")
    finite = [float(v) for y in ys for v in y if np.isfinite(v)]
    near = 0.02 * ((max(finite) - min(finite)) if finite else 0.0)

    def touch(i: int, j: int) -> bool:  # a point of each within 2% of the y range, same x
        return xs is not None and any(
            float(xa) == float(xb) and abs(float(ya) - float(yb)) <= near
            for xa, ya in zip(xs[i], ys[i], strict=True)
            for xb, yb in zip(xs[j], ys[j], strict=True))

    styles: list[SeriesStyle] = []
    for index, (name, y) in enumerate(zip(names, ys, strict=True)):
        twins = [names[j] for j in range(index)
                 if len(ys[j]) == len(y) and np.allclose(ys[j], y, equal_nan=True)]
        touching = sum(1 for j in range(index) if names[j] in twins or touch(index, j))
        kwargs = {"marker": _MARKERS[index % len(_MARKERS)],
                  "linestyle": _DASHES[index % len(_DASHES)],
                  "markersize": max(7 - 1.5 * len(twins), 3)}
        label = name + (f" (= {', '.join(twins)})" if twins else "")
        styles.append(SeriesStyle(label, kwargs, 1 + 0.015 * touching))
    return styles


def announce_plot(path: str | os.PathLike[str]) -> None:
    """Tell a CLI user where a figure went (on stderr, so ``--json`` output stays clean)."""
    print(f"plot written to {Path(path).resolve()}", file=sys.stderr)
