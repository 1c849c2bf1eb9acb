"""Certificate study (``docs/certificate.md``): coverage and width of every certificate
method on single cells, by Monte Carlo.

A cell has ``m`` leaves with means of one of five shapes (below), noise sigma 0.1, and ``n``
random-path probes; each (method, shape, m, n) runs ``trials`` independent cells (a new cell
per trial for the random shapes) and reports the coverage ``P(bound >= true bias)`` and the
median of ``bound - true bias`` (the width). Shapes, all in [0, 1]:

- ``flat``: every leaf 0.5 (bias 0);
- ``lipschitz``: a tree-Lipschitz cell (``canopy.instances.tree_lipschitz_values`` on a
  complete 4-ary tree of ``m`` leaves, L = 0.5, so the oscillation is at most 0.5);
- ``one-spike``: every leaf 0.3 but one at 0.95 (the needle: probe mass ``1/m``);
- ``two-point``: half the leaves at 0.2, half at 0.8;
- ``uniform``: leaf means drawn uniformly from [0, 1].

``seeds`` plays no role beyond seeding (one seed is the whole table); the trials are the
Monte Carlo. ``canopy run certificate`` runs it; ``python -m
canopy.experiments.studies.certwidth DIR/certificate/results.json`` prints the width table
(one block per shape: rows m, columns n, cells ``paper / betting / order / sharp``) and the
lowest coverage of each method.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from canopy.certificate import METHODS, certify, sharp_batch, sharp_setup, sharp_width
from canopy.experiments.study import (
    PROPORTION,
    Headline,
    Measurement,
    Panel,
    Row,
    Study,
)
from canopy.validation import check_count

__all__ = ["STUDY", "CertParams", "cell_means", "method_bounds"]

SHAPES = ("flat", "lipschitz", "one-spike", "two-point", "uniform")
CELL_LIPSCHITZ = 0.5


@dataclass(frozen=True)
class CertParams:
    """Grid of the certificate study."""

    methods: tuple[str, ...] = METHODS
    shapes: tuple[str, ...] = SHAPES
    leaves: tuple[int, ...] = (4, 16, 64, 256, 1024)
    probes: tuple[int, ...] = (16, 64, 256, 1024, 4096)
    sigma: float = 0.1
    delta: float = 0.05
    trials: int = 400

    def __post_init__(self) -> None:
        for method in self.methods:
            if method not in METHODS:
                raise ValueError(f"unknown method {method!r}; known: {METHODS}")
        for shape in self.shapes:
            if shape not in SHAPES:
                raise ValueError(f"unknown shape {shape!r}; known: {SHAPES}")
        for m in self.leaves:
            check_count(m, "leaves")
        for n in self.probes:
            check_count(n, "probes")
        check_count(self.trials, "trials")
        if not (math.isfinite(self.sigma) and self.sigma >= 0):
            raise ValueError(f"sigma must be finite and >= 0, got {self.sigma}")
        if not 0 < self.delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {self.delta}")


def cell_means(shape: str, m: int, trials: int, rng: np.random.Generator) -> np.ndarray:
    """Leaf means of ``trials`` cells of ``m`` leaves, one row a cell."""
    if shape == "flat":
        return np.full((trials, m), 0.5)
    if shape == "one-spike":
        means = np.full((trials, m), 0.3)
        means[np.arange(trials), rng.integers(m, size=trials)] = 0.95
        return means
    if shape == "two-point":
        return np.broadcast_to(np.where(np.arange(m) < m // 2, 0.2, 0.8), (trials, m)).copy()
    if shape == "uniform":
        return rng.uniform(0.0, 1.0, (trials, m))
    if shape == "lipschitz":
        return _lipschitz_cells(m, trials, rng)
    raise ValueError(f"unknown shape {shape!r}; known: {SHAPES}")


def _lipschitz_cells(m: int, trials: int, rng: np.random.Generator, b: int = 4) -> np.ndarray:
    """Vectorised :func:`canopy.instances.tree_lipschitz_values` on a complete ``b``-ary tree
    of ``m`` leaves (``m`` rounded up to a power of ``b``, then cut to ``m`` leaves)."""
    depth = max(math.ceil(math.log(m, b) - 1e-9), 0)
    rho = 1.0 / b
    scale = min((1.0 - rho) / (2.0 * rho), 0.5) * CELL_LIPSCHITZ
    value = np.full((trials, b ** depth), 0.5)
    for level in range(1, depth + 1):
        offsets = rng.uniform(-1.0, 1.0, (trials, b ** level)) * scale * rho ** level
        value += np.repeat(offsets, b ** (depth - level), axis=1)
    return np.clip(value[:, :m], 0.0, 1.0)


def method_bounds(method: str, probes: np.ndarray, m: int, sigma: float,
                  delta: float) -> np.ndarray:
    """The bias bound of every row of ``probes`` (one cell per row) under ``method``."""
    if method == "paper":
        return np.array([certify(row, m, sigma, delta=delta, method="paper").bound
                         for row in probes])
    setup = sharp_setup(sigma, delta, 3.0, method)
    return sharp_batch(np.ascontiguousarray(probes, dtype=float), setup, math.log(m),
                       sharp_width(setup))


def cells(params: CertParams) -> list[dict[str, Any]]:
    return [{"method": method, "shape": shape, "m": m, "n": n, "sigma": params.sigma,
             "delta": params.delta, "trials": params.trials}
            for method in params.methods for shape in params.shapes
            for m in params.leaves for n in params.probes]


def run_cell(cell: dict[str, Any], seed: int) -> list[Measurement]:
    shape, m, n, trials = cell["shape"], cell["m"], cell["n"], cell["trials"]
    rng = np.random.default_rng([seed, SHAPES.index(shape), m, n])
    means = cell_means(shape, m, trials, rng)
    picks = rng.integers(m, size=(trials, n))
    probes = np.take_along_axis(means, picks, axis=1) + cell["sigma"] * rng.standard_normal(
        (trials, n))
    bias = means.max(axis=1) - means.mean(axis=1)
    bounds = method_bounds(cell["method"], probes, m, cell["sigma"], cell["delta"])
    label = f"{cell['method']} / {shape} / m={m}"
    excess = bounds - bias
    width = float(np.median(excess)) if np.isfinite(np.median(excess)) else math.inf
    return [Measurement(label, "n", float(n), "coverage", float(np.mean(bounds >= bias)),
                        PROPORTION),
            Measurement(label, "n", float(n), "median width", width)]


def headlines(rows: Sequence[Row]) -> list[Headline]:
    coverage = [r for r in rows if r.metric == "coverage"]
    if not coverage:
        return []
    worst = min(coverage, key=lambda r: r.mean)
    return [Headline(f"lowest coverage: {worst.method}, n={worst.x:g}", worst.mean,
                     target=">= 0.95", passed=worst.mean >= 0.95)]


STUDY = Study(
    name="certificate",
    title="certificate coverage and width: methods x m x n x cell shapes",
    module=__name__,
    params=CertParams(),
    quick_params=CertParams(leaves=(4, 64, 1024), probes=(16, 256, 4096), trials=400),
    seeds=1,
    quick_seeds=1,
    cells=cells,
    run_cell=run_cell,
    headlines=headlines,
    panels=(Panel("median width", "n", log_x=True, title="median bound - true bias, m = 16",
                  methods=tuple(f"{m} / {s} / m=16" for m in METHODS
                                for s in ("flat", "one-spike"))),),
)


def width_table(rows: Sequence[Row] | Sequence[dict[str, Any]]) -> str:
    """Markdown width tables (median bound minus true bias) and each method's lowest
    coverage, from the study's rows (:class:`Row` s or their ``results.json`` dicts)."""
    table: dict[tuple[str, str, int, float], float] = {}
    lowest: dict[str, float] = {}
    for row in rows:
        item = row if isinstance(row, dict) else row.__dict__
        method, shape, m = item["method"].split(" / ")
        key = (method, shape, int(m[2:]), float(item["x"]))
        if item["metric"] == "median width":
            table[key] = item["mean"]
        elif item["metric"] == "coverage":
            lowest[method] = min(lowest.get(method, 1.0), item["mean"])
    methods = [m for m in METHODS if m in lowest]
    ns = sorted({k[3] for k in table})
    out = []
    for shape in [s for s in SHAPES if any(k[1] == s for k in table)]:
        out += [f"**{shape}** (cells: {' / '.join(methods)})", "",
                "| m | " + " | ".join(f"n={n:g}" for n in ns) + " |",
                "|---|" + "---|" * len(ns)]
        for m in sorted({k[2] for k in table if k[1] == shape}):
            cells = [" / ".join(f"{table.get((meth, shape, m, n), math.nan):.2f}"
                                for meth in methods) for n in ns]
            out.append(f"| {m} | " + " | ".join(cells) + " |")
        out.append("")
    out.append("lowest coverage: " + ", ".join(f"{m} {lowest[m]:.4f}" for m in methods))
    return "\n".join(out)


if __name__ == "__main__":  # pragma: no cover - a reporting entry point
    print(width_table(json.loads(open(sys.argv[1]).read())["rows"]))
