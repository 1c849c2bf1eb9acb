"""Theory-link study (paper Appendix D, "From the rate to the data", Figure 7, left
panel): on a tree-Lipschitz value function, the cumulative regret R(n) of the optimistic
descent at several horizons, the exponent alpha of the least-squares fit of log R(n) on log n
(sublinear rate: alpha < 1), and the near-optimality dimension estimated from the value
function (8 seeds).

Instance (the paper does not specify it): ``canopy.instances.tree_lipschitz`` with branching 2,
depth 10 (1,024 leaves), L = 1, sigma 0.1, a new instance per seed; the descent uses the
assumed spread with the true L and the refine rule. R(n) is read at the checkpoints of one
run of the largest horizon (the descent is anytime: its index uses ln t).

Near-optimality dimension: with ``eps_h = L rho**h`` (``rho = 1/branching``), ``N_h`` = number
of level-``h`` cells holding a leaf within ``eps_h`` of the best; ``d_hat`` is the slope of the
least-squares fit of ``log N_h`` on ``log(1/eps_h)`` over ``h = 1..depth`` (Bubeck et al. 2011's
definition read on the tree, with constant c = 1). The right panel of the figure (RouterBench
variance decomposition) needs real routing data and is not part of this synthetic study.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from canopy.experiments.studies._common import (
    PAPER_C,
    headline,
    lipschitz_instance,
    make_policy,
    policy_cell,
    regret_curve,
)
from canopy.experiments.study import (
    Headline,
    Measurement,
    Panel,
    PaperValue,
    Row,
    Study,
    check_all_nonnegative,
    check_all_positive,
)
from canopy.experiments.summary import lookup
from canopy.problem import LeafMeans
from canopy.validation import check_count

__all__ = ["PAPER", "STUDY", "TheoryLinkParams", "near_optimality_dimension"]

METHOD, N_AXIS, FIT = "descent (assumed L)", "n", "fit"

#: App. D "From the rate to the data", Figure 7 (8 seeds): alpha ~ 0.77, d_hat ~ 0.
PAPER = (
    PaperValue(METHOD, None, "alpha", 0.77),
    PaperValue(METHOD, None, "near-optimality dimension", 0.0),
)


@dataclass(frozen=True)
class TheoryLinkParams:
    """Instance and horizons of the theory-link study."""

    branching: int = 2
    depth: int = 10
    lipschitz: float = 1.0
    sigma: float = 0.1
    checkpoints: tuple[int, ...] = (250, 500, 1000, 2000, 4000, 8000, 16000)

    def __post_init__(self) -> None:
        check_count(self.depth, "depth")
        if check_count(self.branching, "branching") < 2:
            raise ValueError(f"branching must be >= 2, got {self.branching}")
        if len(self.checkpoints) < 2 or list(self.checkpoints) != sorted(set(self.checkpoints)):
            raise ValueError("checkpoints must be at least two increasing horizons")
        for n in self.checkpoints:
            check_count(n, "checkpoints")
        check_all_nonnegative(sigma=self.sigma)
        check_all_positive(lipschitz=self.lipschitz)


def near_optimality_dimension(problem: LeafMeans, *, branching: int, lipschitz: float
                              ) -> float:
    """Slope of ``log N_h`` on ``log(1/eps_h)`` (see the module docstring)."""
    tree = problem.tree
    rho = 1.0 / branching
    levels = range(1, int(tree.level.max()) + 1)
    counts, scales = [], []
    for h in levels:
        starts = np.sort(tree.leaf_lo[tree.nodes_at_level(h)])  # the level's cells tile the leaves
        best = np.maximum.reduceat(problem.means, starts)
        eps = lipschitz * rho**h
        counts.append(np.count_nonzero(best >= problem.mu_star - eps))
        scales.append(np.log(1.0 / eps))
    return float(np.polyfit(scales, np.log(counts), 1)[0])


def cells(params: TheoryLinkParams) -> list[dict[str, Any]]:
    return [{**policy_cell(METHOD, "OptimisticDescent", c=PAPER_C, spread="assumed",
                           lipschitz=params.lipschitz, expand="refine"),
             "branching": params.branching, "depth": params.depth,
             "lipschitz": params.lipschitz, "sigma": params.sigma,
             "checkpoints": list(params.checkpoints)}]


def run_cell(cell: dict[str, Any], seed: int) -> list[Measurement]:
    problem = lipschitz_instance(cell, seed)
    checkpoints = np.asarray(cell["checkpoints"])
    regret = regret_curve(make_policy(cell), problem, horizon=int(checkpoints[-1]), seed=seed)
    at = regret[checkpoints - 1]
    alpha = float(np.polyfit(np.log(checkpoints), np.log(np.maximum(at, 1e-12)), 1)[0])
    d_hat = near_optimality_dimension(problem, branching=cell["branching"],
                                      lipschitz=cell["lipschitz"])
    out = [Measurement(METHOD, N_AXIS, float(n), "R(n)", float(r))
           for n, r in zip(checkpoints, at, strict=True)]
    out += [Measurement(METHOD, N_AXIS, float(n), "R(n)/n", float(r / n))
            for n, r in zip(checkpoints, at, strict=True)]
    return [*out, Measurement(METHOD, FIT, None, "alpha", alpha),
            Measurement(METHOD, FIT, None, "near-optimality dimension", d_hat)]


def headlines(rows: Sequence[Row]) -> list[Headline]:
    alpha = lookup(rows, METHOD, "alpha")
    return [*headline("regret exponent alpha", alpha, paper=0.77, target="< 1",
                      passed=None if alpha is None else alpha.mean < 1),
            *headline("estimated near-optimality dimension",
                      lookup(rows, METHOD, "near-optimality dimension"), paper=0.0)]


STUDY = Study(
    name="theorylink",
    title="regret exponent alpha and near-optimality dimension (App. D, Figure 7)",
    module=__name__,
    params=TheoryLinkParams(),
    quick_params=TheoryLinkParams(checkpoints=(250, 500, 1000, 2000, 4000, 8000)),
    seeds=8,
    quick_seeds=5,
    cells=cells,
    run_cell=run_cell,
    paper=PAPER,
    headlines=headlines,
    panels=(Panel("R(n)", N_AXIS, log_x=True, log_y=True, title="cumulative regret R(n)"),
            Panel("R(n)/n", N_AXIS, log_x=True, title="average regret R(n)/n")),
)
