"""A toy study using only the core, for the experiment runner's tests: it estimates the root
value f(root) of a tree-Lipschitz instance from cheap probes of the root versus leaf
evaluations of random leaves at the same cost budget (probes are 20x cheaper, so their error
is smaller)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from canopy.experiments.runner import cell_key
from canopy.experiments.study import Headline, Measurement, PaperValue, Study, check_budget
from canopy.experiments.summary import lookup
from canopy.instances import tree_lipschitz
from canopy.validation import check_count

PROBE_COST = 0.05


@dataclass(frozen=True)
class ToyParams:
    budgets: tuple[float, ...] = (2.0, 8.0)
    depth: int = 6
    sleep: float = 0.0
    journal: str = ""

    def __post_init__(self) -> None:
        check_count(self.depth, "depth")
        for budget in self.budgets:
            check_budget("budgets", budget, PROBE_COST)


def toy_cells(params: ToyParams) -> list[dict]:
    return [{"method": method, "budget": budget, "depth": params.depth, "sleep": params.sleep,
             "journal": params.journal}
            for budget in params.budgets for method in ("probe-root", "random-leaf")]


def toy_cell(cell: dict, seed: int) -> list[Measurement]:
    if cell["journal"]:
        with open(cell["journal"], "a") as journal:
            journal.write(cell_key("toy", cell, seed) + "\n")
    time.sleep(cell["sleep"])
    problem = tree_lipschitz(2, cell["depth"], seed=seed)
    rng = np.random.default_rng([seed, 1])
    if cell["method"] == "probe-root":
        samples = problem.probe_many(0, int(cell["budget"] / PROBE_COST), rng)
    else:
        leaves = rng.integers(0, problem.tree.n_leaves, size=int(cell["budget"]))
        samples = np.array([problem.evaluate(int(leaf), rng) for leaf in leaves])
    error = abs(float(samples.mean()) - problem.value(0))
    return [Measurement(cell["method"], "budget", cell["budget"], "abs error", error)]


def toy_headlines(rows):
    probe = lookup(rows, "probe-root", "abs error", 8.0)
    leaf = lookup(rows, "random-leaf", "abs error", 8.0)
    return [Headline("probe error / leaf error at budget 8", probe.mean / leaf.mean, paper=0.25,
                     target="< 1", passed=probe.mean < leaf.mean)]


STUDY = Study(name="toy", title="root value from cheap probes vs leaf evaluations",
              module=__name__, params=ToyParams(), quick_params=ToyParams(budgets=(8.0,)),
              seeds=6, quick_seeds=2, cells=toy_cells, run_cell=toy_cell,
              paper=(PaperValue("probe-root", 8.0, "abs error", 0.01),),
              headlines=toy_headlines)
