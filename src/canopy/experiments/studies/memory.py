"""Memory study (paper Appendix D, "Regret versus memory", Figure 4): online regret play on a
256-leaf tree of depth 4 over a 12k-round horizon (16 seeds); final regret against the nodes
stored, for fixed-resolution play at depths 1-4 (depth 4 = full resolution), the
expand-versus-refine rule of Eq. (6) with the assumed spread, and the variance-aware variant
that takes the bias from data, in three forms: ``spread="estimated"`` (Section 3.3's plug-in
``sigma_w sqrt(2 log m)``), ``spread="certified"`` with ``certificate="paper"`` (Algorithm 1's
bound with ``L_hat`` inheritance, the former variant) and ``spread="certified"`` with the
composed sharp certificate, all with the refine rule.

Instance family (the paper does not specify it): ``canopy.instances.tree_lipschitz`` with
branching 4, depth 4, Lipschitz constant 1 and noise sigma 0.1, a new instance per seed shared
by every method; the assumed spread uses the true constant. Regret play: one probe per round,
every cost 1, budget = horizon; regret ``R_n = sum_t (mu* - f(v_t))``. Stored nodes: the
policy's peak ``max_stored_``. "Near full-resolution regret" is read as at most 1.2 times the
regret of fixed depth 4 (our choice; the paper gives no number).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from canopy.experiments.studies._common import (
    PAPER_C,
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
from canopy.validation import check_count

__all__ = ["PAPER", "STUDY", "MemoryParams"]

FIXED, REFINE = "fixed depth", "expand-vs-refine"
ESTIMATED, CERTIFIED = "variance-aware (estimated)", "variance-aware (certified)"
COMPOSED = "certified (composed, valid)"
VARIANTS = ((ESTIMATED, {"spread": "estimated"}),
            (CERTIFIED, {"spread": "certified", "certificate": "paper"}),
            (COMPOSED, {"spread": "certified", "certificate": "sharp"}))
NEAR = 1.2

#: App. D "Regret versus memory", Figure 4: the refine rule reaches near full-resolution
#: regret at about 1/3 of the memory, the variance-aware variant at about 6x less (memory
#: saving = stored nodes of full resolution / stored nodes of the method).
PAPER = (
    PaperValue(REFINE, None, "memory saving", 3.0),
    PaperValue(ESTIMATED, None, "memory saving", 6.0),
    PaperValue(CERTIFIED, None, "memory saving", 6.0),
)


@dataclass(frozen=True)
class MemoryParams:
    """Grid of the memory study."""

    branching: int = 4
    depth: int = 4
    lipschitz: float = 1.0
    sigma: float = 0.1
    horizon: int = 12_000
    depths: tuple[int, ...] = (1, 2, 3, 4)

    def __post_init__(self) -> None:
        for name in ("branching", "depth", "horizon"):
            check_count(getattr(self, name), name)
        if not self.depths or any(not 1 <= d <= self.depth for d in self.depths):
            raise ValueError(f"depths must lie in 1..{self.depth}, got {self.depths}")
        check_all_nonnegative(sigma=self.sigma)
        check_all_positive(lipschitz=self.lipschitz)


def cells(params: MemoryParams) -> list[dict[str, Any]]:
    common = {"branching": params.branching, "depth": params.depth, "sigma": params.sigma,
              "lipschitz": params.lipschitz, "horizon": params.horizon}
    out = [{**policy_cell(FIXED, "OptimisticDescent", c=PAPER_C, spread="assumed",
                          lipschitz=params.lipschitz, expand="fixed", max_depth=d),
            "x": float(d), **common} for d in params.depths]
    out.append({**policy_cell(REFINE, "OptimisticDescent", c=PAPER_C, spread="assumed",
                              lipschitz=params.lipschitz, expand="refine"), "x": None, **common})
    for method, kwargs in VARIANTS:
        out.append({**policy_cell(method, "OptimisticDescent", c=PAPER_C, expand="refine",
                                **kwargs),
                    "x": None, **common})
    return out


def run_cell(cell: dict[str, Any], seed: int) -> list[Measurement]:
    problem = lipschitz_instance(cell, seed)
    policy = make_policy(cell)
    regret = regret_curve(policy, problem, horizon=cell["horizon"], seed=seed)
    method, x = cell["method"], cell["x"]
    return [Measurement(method, "depth", x, "regret", float(regret[-1])),
            Measurement(method, "depth", x, "stored nodes", float(policy.max_stored_))]


def headlines(rows: Sequence[Row]) -> list[Headline]:
    full_depth = max((r.x for r in rows if r.method == FIXED and r.x is not None), default=None)
    full_regret = lookup(rows, FIXED, "regret", full_depth)
    full_memory = lookup(rows, FIXED, "stored nodes", full_depth)
    if full_regret is None or full_memory is None:
        return []
    out = [Headline(f"full resolution (depth {full_depth:g}) regret", full_regret.mean,
                    full_regret.ci_low, full_regret.ci_high),
           Headline("full resolution stored nodes", full_memory.mean)]
    for method, paper in ((REFINE, 3.0), (ESTIMATED, 6.0), (CERTIFIED, 6.0), (COMPOSED, 6.0)):
        regret, memory = lookup(rows, method, "regret"), lookup(rows, method, "stored nodes")
        if regret is None or memory is None:
            continue
        ratio = regret.mean / full_regret.mean
        out += [Headline(f"{method}: memory saving vs full resolution",
                         full_memory.mean / memory.mean, paper=paper,
                         target=f">= {paper:g} at regret <= {NEAR} x full",
                         passed=full_memory.mean / memory.mean >= paper and ratio <= NEAR),
                Headline(f"{method}: regret / full-resolution regret", ratio, paper=1.0,
                         target=f"<= {NEAR}", passed=ratio <= NEAR)]
    return out


STUDY = Study(
    name="memory",
    title="regret vs stored nodes: fixed depths, refine rule, certified (App. D, Figure 4)",
    module=__name__,
    params=MemoryParams(),
    quick_params=MemoryParams(horizon=4_000, depths=(2, 3, 4)),
    seeds=16,
    quick_seeds=8,
    cells=cells,
    run_cell=run_cell,
    paper=PAPER,
    headlines=headlines,
    panels=(Panel("regret", kind="pair", x_metric="stored nodes", log_x=True,
                  title="final regret vs stored nodes (95% CI)"),),
)
