"""Fidelity study (paper Appendix D, "The tree prior pays off only when probes are cheap",
Figure 3): top-5 identification on a 1,024-leaf tree, recall@5 against the probe/leaf cost
ratio at a fixed budget, and against the budget with cheap probes; the beam (width 20) and
sound top-k variants against structure-blind successive elimination (60 seeds).

Instance family (the paper does not specify it; the identification helper's choice, see
``docs/identification.md``): ``canopy.instances.tree_lipschitz`` with branching 4, depth 5
(1,024 leaves), L = 1 and noise sigma = 0.001 (about ``L rho^D = 1/1024``: one evaluation just
separates sibling leaves; at sigma = 0.1 the top-5 leaves differ by ~1e-4 and every method has
recall 0), a new instance per seed, shared by every method of that seed. Methods, all with
``k = 5`` and L estimated by the pre-pass charged to their budget: "beam" =
``TopKBeam(width=20)`` (assumed spread); "sound" = ``TopKSound(spread="assumed")``, the
worst-case-valid pruning of Theorem 2 with the schedule ``L rho^l``; "sound (certified)" =
``TopKSound(spread="certified")``, the same pruning with Algorithm 1's bound, reported beside
it (its bound is too loose at ~2 probes per cell to prune), in two forms: Algorithm 1 on each
cell's own probes (``certificate="paper"``, the former variant) and the composed sharp
certificate (``"sound (certified, composed)"``), with the fraction of examined cells
each prunes. Budgets
are in leaf-cost units (``leaf_cost = 1``). Successive elimination evaluates leaves only, so its
recall does not depend on the probe cost: it runs once per budget (with probe cost = leaf
cost, which it never pays) and is drawn as a band in the cost-ratio panel.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from canopy.experiments.studies._common import (
    headline,
    lipschitz_instance,
    make_policy,
    policy_cell,
    recall,
)
from canopy.experiments.study import (
    PROPORTION,
    Headline,
    Measurement,
    Panel,
    PaperValue,
    Row,
    Study,
    check_all_nonnegative,
    check_all_positive,
    check_budget,
)
from canopy.experiments.summary import lookup
from canopy.run import run
from canopy.validation import check_count

__all__ = ["PAPER", "STUDY", "FidelityParams"]

BEAM, SOUND, CERT, SE = ("beam (width 20)", "sound", "sound (certified)",
                         "successive elimination")
COMPOSED = "sound (certified, composed)"
RATIO, BUDGET = "probe/leaf cost ratio", "budget"

#: App. D "The tree prior pays off only when probes are cheap", Figure 3 (budget 1,500,
#: cheap probes): beam 0.84, sound 0.62, successive elimination 0.57 recall@5.
PAPER = (
    PaperValue(BEAM, 1500.0, "recall@5", 0.84),
    PaperValue(SOUND, 1500.0, "recall@5", 0.62),
    PaperValue(SE, 1500.0, "recall@5", 0.57),
)


@dataclass(frozen=True)
class FidelityParams:
    """Grid of the fidelity study (budgets in leaf-cost units)."""

    branching: int = 4
    depth: int = 5
    lipschitz: float = 1.0
    sigma: float = 0.001
    k: int = 5
    budget: float = 1500.0
    ratios: tuple[float, ...] = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
    cheap_ratio: float = 0.05
    budgets: tuple[float, ...] = (250.0, 500.0, 750.0, 1000.0, 1500.0, 2000.0, 3000.0)

    def __post_init__(self) -> None:
        check_count(self.branching, "branching")
        check_count(self.depth, "depth")
        check_count(self.k, "k")
        if self.k > self.branching ** self.depth:
            raise ValueError(f"k={self.k} exceeds the {self.branching ** self.depth} leaves")
        check_all_nonnegative(sigma=self.sigma)
        check_all_positive(lipschitz=self.lipschitz)
        for ratio in (*self.ratios, self.cheap_ratio):
            if not 0 < ratio <= 1:
                raise ValueError(f"probe/leaf cost ratios must be in (0, 1], got {ratio}")
        for budget in (self.budget, *self.budgets):
            check_budget("budget", budget, 1.0)  # successive elimination needs one leaf


def cells(params: FidelityParams) -> list[dict[str, Any]]:
    """One cell per distinct (method, probe cost, budget); ``points`` lists the (axis, x) at
    which its recall is reported: the cost-ratio panel at ``budget``, the budget panel at
    ``cheap_ratio`` (a configuration on both panels runs once)."""
    tree = [(BEAM, "TopKBeam"), (SOUND, "TopKSound"), (CERT, "TopKSound"),
            (COMPOSED, "TopKSound")]
    configs: dict[tuple, list] = {}
    for ratio in params.ratios:
        for method, policy in tree:
            configs.setdefault((method, policy, ratio, params.budget), []).append([RATIO, ratio])
    configs.setdefault((SE, "SuccessiveElimination", 1.0, params.budget), []).append(
        [RATIO, None])
    for budget in params.budgets:
        for method, policy in [*tree, (SE, "SuccessiveElimination")]:
            ratio = 1.0 if policy == "SuccessiveElimination" else params.cheap_ratio
            configs.setdefault((method, policy, ratio, budget), []).append([BUDGET, budget])
    extra = {BEAM: {"width": 20}, SOUND: {"spread": "assumed"},
             CERT: {"spread": "certified", "certificate": "paper"},
             COMPOSED: {"spread": "certified", "certificate": "sharp"}}
    return [{**policy_cell(method, policy, k=params.k, **extra.get(method, {})),
             "points": points, "budget": budget, "probe_cost": ratio,
             "branching": params.branching, "depth": params.depth,
             "lipschitz": params.lipschitz, "sigma": params.sigma}
            for (method, policy, ratio, budget), points in configs.items()]


def run_cell(cell: dict[str, Any], seed: int) -> list[Measurement]:
    problem = lipschitz_instance(cell, seed, probe_cost=cell["probe_cost"])
    k = cell["kwargs"]["k"]
    policy = make_policy(cell)
    result = run(policy, problem, budget=cell["budget"], seed=seed, k=k)
    value = recall(result, problem, k)
    out = [Measurement(cell["method"], x_name, x, f"recall@{k}", value, PROPORTION)
           for x_name, x in cell["points"]]
    if cell["policy"] == "TopKSound":
        pruned = policy.n_pruned_ / max(policy.n_judged_, 1)
        out += [Measurement(cell["method"], x_name, x, "pruned fraction", pruned,
                            PROPORTION)
                for x_name, x in cell["points"]]
    return out


def headlines(rows: Sequence[Row]) -> list[Headline]:
    metric = f"recall@{STUDY.params.k}"
    beam, sound, se = (lookup(rows, m, metric, 1500.0, x_name=BUDGET) for m in (BEAM, SOUND, SE))
    out = headline(f"beam {metric} at budget 1,500, cheap probes", beam, paper=0.84,
                   target=">= 0.84", passed=None if beam is None else beam.mean >= 0.84)
    if beam is not None and se is not None and se.mean > 0:
        out.append(Headline("beam / successive elimination", beam.mean / se.mean,
                            paper=0.84 / 0.57, target=">= 1.4",
                            passed=beam.mean / se.mean >= 1.4))
    out += headline(f"sound {metric} at budget 1,500", sound, paper=0.62,
                    target=">= successive elimination",
                    passed=None if sound is None or se is None else sound.mean >= se.mean)
    out += headline(f"successive elimination {metric} at budget 1,500", se, paper=0.57)
    for method in (CERT, COMPOSED):
        out += headline(f"{method} {metric} at budget 1,500",
                        lookup(rows, method, metric, 1500.0, x_name=BUDGET))
        out += headline(f"{method}: fraction of examined cells pruned at budget 1,500",
                        lookup(rows, method, "pruned fraction", 1500.0, x_name=BUDGET))
    equal = lookup(rows, BEAM, metric, 1.0, x_name=RATIO)
    band = lookup(rows, SE, metric, None, x_name=RATIO)
    out += headline(f"beam {metric} when a probe costs a leaf", equal,
                    target="< successive elimination (tree is overhead)",
                    passed=None if equal is None or band is None else equal.mean < band.mean)
    return out


STUDY = Study(
    name="fidelity",
    title="top-5 recall vs probe/leaf cost ratio and vs budget (App. D, Figure 3)",
    module=__name__,
    params=FidelityParams(),
    quick_params=FidelityParams(ratios=(0.05, 0.2, 1.0), budgets=(500.0, 1500.0)),
    seeds=60,
    quick_seeds=20,
    cells=cells,
    run_cell=run_cell,
    paper=PAPER,
    headlines=headlines,
    panels=(Panel("recall@5", RATIO, log_x=True, title="recall@5 vs probe/leaf cost (budget)"),
            Panel("recall@5", BUDGET, title="recall@5 vs budget (cheap probes)"),
            Panel("pruned fraction", BUDGET, title="sound pruning: fraction of cells pruned",
                  methods=(SOUND, CERT, COMPOSED))),
)
