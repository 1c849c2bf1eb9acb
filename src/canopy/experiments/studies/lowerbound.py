"""Proposition 2 (the lower bound), illustrated: inside a violation cell whose leaf means are
permuted, cheap probes carry no information on which leaf is best, and leaf-only
identification over its ``m`` leaves fails with constant probability until the leaf budget
reaches the order of ``h / log m``, ``h = sum_x sigma^2 / max(Delta_x, Delta)^2``.

Instance (ours; the paper gives the family, not numbers): a complete tree of branching ``m``
and depth 2; the violation cell is the root's first child (``m`` leaves at the penultimate
level), every leaf outside it has mean 0.2, and inside it the gap profile ``Delta_1 = 0``
(the optimum, 0.7), ``Delta_i = 0.1 + 0.3 (i - 2) / (m - 2)`` for ``i = 2..m``, permuted by
the seed; leaf noise sigma 0.5. ``Delta = 0.1`` (the top gap), so ``h`` is fixed by the profile.

Two measurements per seed:

- ``probe mean of the cell``: the mean of 256 probes of the violation cell. Every permutation
  gives the same probe law (Step 1 of the proof), so across seeds it is spread only by the
  noise, around the cell's average: the permutation is not visible to probes.
- ``top-1 error`` of :class:`~canopy.policies.SuccessiveRejects` on the cell's ``m`` leaves at
  leaf budgets ``n = x h / log m`` (the reduction of Step 2): the proposition says the error is
  a constant for ``x <= c``; Carpentier and Locatelli's bound behind it decays as
  ``exp(-c'' x)``. We report the error at each ``x`` and the slope of ``log error`` on ``x``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from canopy.experiments.studies._common import headline, instance_seed, log_slope
from canopy.experiments.study import PROPORTION, Headline, Measurement, Panel, Row, Study
from canopy.experiments.summary import lookup
from canopy.policies import SuccessiveRejects
from canopy.problem import LeafMeans
from canopy.run import run
from canopy.tree import Tree
from canopy.validation import check_count

__all__ = ["STUDY", "LowerBoundParams", "gap_profile", "hardness"]

X_AXIS = "n log m / h"
METHOD = "successive rejects (leaf-only)"
PROBES = "probes of the cell"
PROBE_MEAN = "probe mean of the cell"
SIGMA, BEST, OUTSIDE, TOP_GAP = 0.5, 0.7, 0.2, 0.1


@dataclass(frozen=True)
class LowerBoundParams:
    """Cell size and leaf budgets (in units of ``h / log m``) of the lower-bound study."""

    m: int = 16
    budgets: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0)

    def __post_init__(self) -> None:
        if check_count(self.m, "m") < 3:
            raise ValueError(f"m must be >= 3, got {self.m}")
        if not self.budgets or min(self.budgets) <= 0:
            raise ValueError("budgets must be positive multiples of h / log m")


def gap_profile(m: int) -> np.ndarray:
    """``Delta_i``: 0 for the optimum, then evenly from 0.1 to 0.4."""
    return np.concatenate([[0.0], 0.1 + 0.3 * np.arange(m - 1) / max(m - 2, 1)])


def cell_average(m: int) -> float:
    """The violation cell's average, the same under every permutation."""
    return BEST - float(np.mean(gap_profile(m)))


def hardness(m: int) -> float:
    """``h = sum_x sigma^2 / max(Delta_x, Delta)^2`` of the cell."""
    return float(np.sum(SIGMA**2 / np.maximum(gap_profile(m), TOP_GAP) ** 2))


def _instance(m: int, seed: int) -> LeafMeans:
    rng = np.random.default_rng(instance_seed(seed))
    means = np.full(m * m, OUTSIDE)
    means[:m] = BEST - rng.permutation(gap_profile(m))
    return LeafMeans(Tree.complete(m, 2), means, sigma=SIGMA)


def cells(params: LowerBoundParams) -> list[dict[str, Any]]:
    return ([{"method": PROBES, "m": params.m}]
            + [{"method": METHOD, "m": params.m, "x": x} for x in params.budgets])


def run_cell(cell: dict[str, Any], seed: int) -> list[Measurement]:
    m = cell["m"]
    problem = _instance(m, seed)
    rng = np.random.default_rng([seed, 0xB0])
    if cell["method"] == PROBES:
        cell_node = int(problem.tree.children(0)[0])
        probes = [problem.probe(cell_node, rng) for _ in range(256)]
        return [Measurement(PROBES, X_AXIS, None, PROBE_MEAN, float(np.mean(probes))),
                Measurement(PROBES, X_AXIS, None, "m", float(m))]
    leaves = LeafMeans(Tree.complete(m, 1), problem.means[:m], sigma=SIGMA)
    n = max(m, round(cell["x"] * hardness(m) / math.log(m)))
    result = run(SuccessiveRejects(k=1), leaves, budget=float(n), seed=seed)
    error = float(int(result.recommendation[0]) != int(np.argmax(leaves.means)))
    return [Measurement(METHOD, X_AXIS, float(cell["x"]), "top-1 error", error, PROPORTION)]


def headlines(rows: Sequence[Row]) -> list[Headline]:
    xs = sorted(r.x for r in rows if r.method == METHOD and r.metric == "top-1 error")
    out: list[Headline] = []
    probes = lookup(rows, PROBES, PROBE_MEAN)
    m = next((round(r.mean) for r in rows if r.metric == "m"), None)
    if probes is not None and probes.ci_low is not None and m is not None:
        average = cell_average(m)
        out += headline(f"probe mean of the permuted cell (its average: {average:.4f})", probes,
                        target="interval holds the average (probes blind to the permutation)",
                        passed=probes.ci_low <= average <= probes.ci_high)
    if xs:
        out += headline(f"top-1 error at n = {xs[0]:g} h / log m",
                        lookup(rows, METHOD, "top-1 error", xs[0]),
                        target="a constant (Proposition 2)")
        out += headline(f"top-1 error at n = {xs[-1]:g} h / log m",
                        lookup(rows, METHOD, "top-1 error", xs[-1]))
    slope = log_slope(rows, METHOD, "top-1 error")
    if slope is not None:
        out.append(Headline("slope of log(error) on n log m / h", slope,
                            target="< 0 (exp(-c'' n log m / h))", passed=slope < 0))
    return out


STUDY = Study(
    name="lowerbound",
    title="Proposition 2: leaf-only error vs budget in units of h / log m; probes blind to it",
    module=__name__,
    params=LowerBoundParams(),
    quick_params=LowerBoundParams(m=8, budgets=(0.25, 1.0, 4.0)),
    seeds=200,
    quick_seeds=60,
    cells=cells,
    run_cell=run_cell,
    headlines=headlines,
    panels=(Panel("top-1 error", X_AXIS, log_x=True, title="top-1 error of leaf-only search"),
            Panel(PROBE_MEAN, X_AXIS, title="probe mean of the permuted cell")),
)
