"""Compression study (paper Appendix D, "Finite-state compression"): the memory-bounded rule
on the infinite-depth tree of arity 3 up to a 15k horizon; nodes of the tree down to the depth
reached against the nodes kept in memory, and the regret, at several horizons.

Instance (the paper does not specify the function): ``canopy.instances.infinite_depth(3)``,
the garland function with noise sigma 0.1; the descent's assumed spread is ``L * 3**-level``,
run with two constants: ``L = 15.3``, the garland's Lipschitz constant on [0, 1] (max |f'| =
15.26 on a 2M-point grid), so the spread bounds every cell's bias, and ``L = 1``, the policy's
default; the memory cap is the policy's default, and the split rule the paper's
(``split="eq6"``: Eq. 6, uniform probes, any cell forgotten). Beside them, the memory-bounded
rule with the bias taken from data: ``spread="estimated"`` (the plug-in) and
``spread="certified"`` (the composed sharp certificate). Each horizon is a separate run
(budget = horizon, cost 1 per probe). The paper gives no seed count: we use 10.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from canopy.experiments.studies._common import (
    PAPER_C,
    headline,
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
from canopy.instances import infinite_depth
from canopy.validation import check_count

__all__ = ["PAPER", "STUDY", "CompressionParams"]

HORIZON = "horizon"

#: App. D "Finite-state compression": at 15k rounds the tree grows from 121 to nearly 800,000
#: nodes, the explored memory stays near 70, the regret between 663 and 1,702.
PAPER_VALUES = {"tree nodes": 800_000.0, "peak stored nodes": 70.0}


def method(lipschitz: float) -> str:
    return f"memory-bounded (L={lipschitz:g})"


def spread_method(spread: str) -> str:
    return f"memory-bounded ({spread})"


@dataclass(frozen=True)
class CompressionParams:
    """Horizons of the compression study."""

    arity: int = 3
    sigma: float = 0.1
    lipschitz: tuple[float, ...] = (15.3, 1.0)
    spreads: tuple[str, ...] = ("estimated", "certified")
    horizons: tuple[int, ...] = (500, 1000, 2000, 4000, 8000, 15000)

    def __post_init__(self) -> None:
        if check_count(self.arity, "arity") < 2:
            raise ValueError(f"arity must be >= 2, got {self.arity}")
        if not self.horizons:
            raise ValueError("horizons must not be empty")
        for horizon in self.horizons:
            check_count(horizon, "horizons")
        check_all_nonnegative(sigma=self.sigma)
        check_all_positive(lipschitz=self.lipschitz)
        if not self.lipschitz:
            raise ValueError("lipschitz must list at least one constant")
        for spread in self.spreads:
            if spread not in ("estimated", "certified"):
                raise ValueError(f"spreads must be 'estimated' or 'certified', got {spread!r}")


PAPER = tuple(PaperValue(method(L), 15000.0, metric, value)
              for L in CompressionParams().lipschitz for metric, value in PAPER_VALUES.items())


def cells(params: CompressionParams) -> list[dict[str, Any]]:
    policies = [policy_cell(method(L), "MemoryBoundedDescent", c=PAPER_C, lipschitz=L,
                            split="eq6")
                for L in params.lipschitz]
    policies += [policy_cell(spread_method(s), "MemoryBoundedDescent", c=PAPER_C, spread=s,
                            split="eq6")
                 for s in params.spreads]
    return [{**policy, "arity": params.arity, "sigma": params.sigma, "horizon": h}
            for policy in policies for h in params.horizons]


def run_cell(cell: dict[str, Any], seed: int) -> list[Measurement]:
    problem = infinite_depth(cell["arity"], sigma=cell["sigma"])
    policy = make_policy(cell)
    regret = regret_curve(policy, problem, horizon=cell["horizon"], seed=seed)
    x, name = float(cell["horizon"]), cell["method"]
    return [Measurement(name, HORIZON, x, "tree nodes", float(policy.tree_nodes_)),
            Measurement(name, HORIZON, x, "stored nodes", float(policy.n_stored_)),
            Measurement(name, HORIZON, x, "peak stored nodes", float(policy.max_stored_)),
            Measurement(name, HORIZON, x, "depth reached", float(policy.depth_reached_)),
            Measurement(name, HORIZON, x, "regret", float(regret[-1]))]


def headlines(rows: Sequence[Row]) -> list[Headline]:
    out = []
    for name in dict.fromkeys(r.method for r in rows):
        horizons = sorted(r.x for r in rows if r.method == name and r.metric == "regret")
        first, last = horizons[0], horizons[-1]
        regret = lookup(rows, name, "regret", last)
        out += [*headline(f"{name}: tree nodes at {first:g} rounds",
                          lookup(rows, name, "tree nodes", first), paper=121.0),
                *headline(f"{name}: tree nodes at {last:g} rounds",
                          lookup(rows, name, "tree nodes", last), paper=800_000.0),
                *headline(f"{name}: peak stored nodes at {last:g} rounds",
                          lookup(rows, name, "peak stored nodes", last), paper=70.0),
                *headline(f"{name}: regret at {last:g} rounds", regret,
                          target="paper: 663-1,702",
                          passed=None if regret is None else 663 <= regret.mean <= 1702)]
    return out


STUDY = Study(
    name="compression",
    title="infinite-depth tree: tree nodes vs stored nodes, regret (App. D)",
    module=__name__,
    params=CompressionParams(),
    quick_params=CompressionParams(horizons=(1000, 4000, 15000)),
    seeds=10,
    quick_seeds=4,
    cells=cells,
    run_cell=run_cell,
    paper=PAPER,
    headlines=headlines,
    panels=(Panel("tree nodes", HORIZON, log_x=True, log_y=True, title="tree nodes"),
            Panel("peak stored nodes", HORIZON, log_x=True, title="nodes kept in memory"),
            Panel("regret", HORIZON, log_x=True, title="cumulative regret")),
)
