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


def distinct_series(names: Sequence[str], ys: Sequence[Sequence[float]]) -> list[SeriesStyle]:
    """One style per series, in order; identical y-sequences are marked and offset."""
    if len(names) != len(ys):
        raise ValueError(f"{len(names)} names for {len(ys)} series")
    styles: list[SeriesStyle] = []
    for index, (name, y) in enumerate(zip(names, ys, strict=True)):
        twins = [names[j] for j in range(index)
                 if len(ys[j]) == len(y) and np.allclose(ys[j], y, equal_nan=True)]
        kwargs = {"marker": _MARKERS[index % len(_MARKERS)],
                  "linestyle": _DASHES[index % len(_DASHES)],
                  "markersize": max(7 - 1.5 * len(twins), 3)}
        label = name + (f" (= {', '.join(twins)})" if twins else "")
        styles.append(SeriesStyle(label, kwargs, 1 + 0.015 * len(twins)))
    return styles


def announce_plot(path: str | os.PathLike[str]) -> None:
    """Tell a CLI user where a figure went (on stderr, so ``--json`` output stays clean)."""
    print(f"plot written to {Path(path).resolve()}", file=sys.stderr)
