"""Theorem 3 (regret with K discontinuities): the cumulative regret of the optimistic descent
at horizon n against the number K of discontinuities.

Theorem 3: ``R_n <= C1 n^((d+1)/(d+2)) + C2 K D log n / Delta_min`` on the detection event,
``Delta_min`` the smallest positive gap among jump cells. The paper reports no experiment for
it. The prediction tested: with the jump cells' gap fixed, the excess regret over K = 0,
``R_n(K) - R_n(0)``, grows at most linearly in K (slope <= 1 of log excess on log K; the
theorem is an upper bound), and its size per unit of ``K D ln n / Delta_min`` (the fitted
``C2``) stays bounded.

Instance (ours, :func:`planted_below`): a tree-Lipschitz backbone (branching 2, L = 0.5,
sigma 0.1, ``canopy.instances.tree_lipschitz_values``) whose best leaf is the optimum; K
distinct penultimate-level cells away from it each get one leaf lifted to ``mu* - gap``
(``gap = 0.1``): a discontinuity whose cell looks rough but holds no optimum, so a policy that
relaxes its bonus on flagged cells pays to rule each out, as the theorem's jump term charges.
The seed draws the backbone and then the cells, so every K of a seed shares the backbone.
Methods: the descent with ``spread="hybrid"`` (Section 3.3: the floor ``L rho^l`` on smooth
cells, the certified bias on flagged ones; Theorem 3's algorithm) and with
``spread="assumed"`` (the floor everywhere; blind to the jumps, so it pays nothing for them
here, where no jump hides the optimum), both with the backbone's L and the default c.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from canopy.experiments.studies._common import (
    headline,
    instance_seed,
    make_policy,
    policy_cell,
    regret_curve,
)
from canopy.experiments.study import (
    Headline,
    Measurement,
    Panel,
    Row,
    Study,
    check_all_nonnegative,
)
from canopy.experiments.summary import lookup
from canopy.instances import tree_lipschitz_values
from canopy.problem import LeafMeans
from canopy.tree import Tree
from canopy.validation import check_count

__all__ = ["STUDY", "DiscontinuityParams", "excess_slope", "jump_term", "planted_below"]

K_AXIS = "K"
HYBRID, ASSUMED = "descent (hybrid)", "descent (assumed)"
LIPSCHITZ, GAP = 0.5, 0.1
TERM = "jump term K D ln n / Delta_min"


@dataclass(frozen=True)
class DiscontinuityParams:
    """Grid of the Theorem 3 study."""

    depth: int = 8
    ks: tuple[int, ...] = (0, 1, 2, 4, 8, 16)
    horizon: int = 20000
    sigma: float = 0.1

    def __post_init__(self) -> None:
        check_count(self.depth, "depth")
        check_count(self.horizon, "horizon")
        check_all_nonnegative(sigma=self.sigma)
        if 0 not in self.ks or len(self.ks) < 3:
            raise ValueError("ks must hold 0 (the baseline) and at least two K > 0")
        for k in self.ks:
            if not 0 <= k < 2 ** (self.depth - 1):
                raise ValueError(f"ks: K={k} must be in 0..{2 ** (self.depth - 1)} (one spike "
                                 "per penultimate-level cell)")


def planted_below(depth: int, k: int, *, sigma: float, seed: np.random.SeedSequence
                  ) -> LeafMeans:
    """The study's instance (module docstring): backbone, then ``k`` spikes at ``mu* - GAP``
    in distinct penultimate-level cells other than the optimum's."""
    rng = np.random.default_rng(seed)
    tree = Tree.complete(2, depth)
    means = tree_lipschitz_values(tree, LIPSCHITZ, rng, branching=2)
    best = int(np.argmax(means))
    cells = [c for c in tree.nodes_at_level(depth - 1)
             if not tree.leaf_lo[c] <= best < tree.leaf_hi[c]]
    for cell in rng.permutation(cells)[:k]:
        means[int(rng.integers(tree.leaf_lo[cell], tree.leaf_hi[cell]))] = means[best] - GAP
    return LeafMeans(tree, means, sigma=sigma)


def jump_term(k: int, depth: int, horizon: int) -> float:
    """Theorem 3's ``K D ln n / Delta_min`` with ``Delta_min = GAP``."""
    return k * depth * math.log(horizon) / GAP


def cells(params: DiscontinuityParams) -> list[dict[str, Any]]:
    methods = [policy_cell(HYBRID, "OptimisticDescent", spread="hybrid", lipschitz=LIPSCHITZ),
               policy_cell(ASSUMED, "OptimisticDescent", spread="assumed", lipschitz=LIPSCHITZ)]
    return [{**method, "K": k, "depth": params.depth, "horizon": params.horizon,
             "sigma": params.sigma} for method in methods for k in params.ks]


def run_cell(cell: dict[str, Any], seed: int) -> list[Measurement]:
    problem = planted_below(cell["depth"], cell["K"], sigma=cell["sigma"],
                            seed=instance_seed(seed))
    regret = regret_curve(make_policy(cell), problem, horizon=cell["horizon"], seed=seed)
    k, name = float(cell["K"]), cell["method"]
    return [Measurement(name, K_AXIS, k, "regret", float(regret[-1])),
            Measurement(name, K_AXIS, k, TERM, jump_term(cell["K"], cell["depth"],
                                                          cell["horizon"]))]


def excess_slope(rows: Sequence[Row], method: str) -> tuple[float, float] | None:
    """Least-squares slope of ``log(R(K) - R(0))`` on ``log K`` over the K > 0 with a positive
    excess (means over seeds), and the fitted ``C2``: the largest
    ``(R(K) - R(0)) / (K D ln n / Delta_min)``; ``None`` with fewer than two such K."""
    base = lookup(rows, method, "regret", 0.0)
    points = []
    for row in rows:
        if row.method == method and row.metric == "regret" and row.x and base is not None:
            term = lookup(rows, method, TERM, row.x)
            if row.mean > base.mean and term is not None:
                points.append((row.x, row.mean - base.mean, term.mean))
    if len(points) < 2:
        return None
    ks, excess, terms = (np.array(v) for v in zip(*points, strict=True))
    return float(np.polyfit(np.log(ks), np.log(excess), 1)[0]), float(np.max(excess / terms))


def headlines(rows: Sequence[Row]) -> list[Headline]:
    out: list[Headline] = []
    for method in (HYBRID, ASSUMED):
        fit = excess_slope(rows, method)
        if fit is not None:
            out += [Headline(f"{method}: slope of log(R(K) - R(0)) on log K", fit[0],
                             target="<= 1 (Theorem 3, fixed gap)", passed=fit[0] <= 1.0),
                    Headline(f"{method}: C2 = max (R(K) - R(0)) / (K D ln n / Delta_min)",
                             fit[1])]
        ks = sorted(r.x for r in rows if r.method == method and r.metric == "regret")
        out += headline(f"{method}: regret at K={ks[-1]:g}", lookup(rows, method, "regret",
                                                                      ks[-1]))
    return out


STUDY = Study(
    name="discontinuities",
    title="Theorem 3: regret against the number K of discontinuities (fixed gap)",
    module=__name__,
    params=DiscontinuityParams(),
    quick_params=DiscontinuityParams(depth=6, ks=(0, 1, 2, 4, 8), horizon=5000),
    seeds=10,
    quick_seeds=4,
    cells=cells,
    run_cell=run_cell,
    headlines=headlines,
    panels=(Panel("regret", K_AXIS, title="cumulative regret at n"),
            Panel(TERM, K_AXIS, log_y=True,
                  title="Theorem 3's jump term")),
)
