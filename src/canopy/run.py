"""The one loop that joins a policy to a problem."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from canopy.policies.base import Policy
from canopy.problem import Ledger, Problem, Query

__all__ = ["MAX_QUERIES", "History", "RunResult", "run"]

MAX_QUERIES = 10**9  # policies keep per-query bookkeeping: a budget past this cannot be run


@dataclass
class History:
    """Every query of a run in order: its kind (``True`` for a probe), node, and observation."""

    is_probe: list[bool] = field(default_factory=list)
    nodes: list[object] = field(default_factory=list)
    values: list[float] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.values)


@dataclass
class RunResult:
    """Outcome of :func:`run`.

    Attributes:
        recommendation: the policy's top-``k`` leaf indices, best first.
        spent: total cost charged; never above ``budget``.
        n_probes, n_leaf_evals: queries of each kind.
        history: every query when ``record=True``, else ``None``.
    """

    policy: str
    budget: float
    seed: int | None
    recommendation: np.ndarray
    spent: float
    n_probes: int
    n_leaf_evals: int
    history: History | None = None


def run(policy: Policy, problem: Problem, *, budget: float, seed: int | None = None, k: int = 1,
        record: bool = False,
        callback: Callable[[Query, float, Ledger], None] | None = None) -> RunResult:
    """Drive ``policy`` on ``problem`` until it stops asking or the budget is spent.

    The seed is split into independent streams for the policy and for the problem's noise, so
    the same seed gives the same result bit for bit. An independent :class:`Ledger` checks
    every charge: a policy that tried to overspend raises :class:`~canopy.problem.BudgetExceeded`.
    ``callback(query, value, ledger)`` is called after each observation (progress bars).
    """
    spec = problem.spec
    cheapest = spec.probe_cost if spec.probe_cost > 0 else spec.leaf_cost
    if cheapest > 0 and budget / cheapest > MAX_QUERIES:
        raise ValueError(f"budget {budget:g} allows {budget / cheapest:.3g} queries at cost "
                         f"{cheapest:g} each; at most {MAX_QUERIES:.0e} can be run")
    policy_seed, problem_seed = np.random.SeedSequence(seed).spawn(2)
    problem_rng = np.random.default_rng(problem_seed)
    ledger = Ledger(budget)
    policy.start(spec, budget=budget, seed=np.random.default_rng(policy_seed))
    history = History() if record else None
    while (query := policy.ask()) is not None:
        spec.check_query(query)
        ledger.charge(query.kind, spec.cost(query))
        if query.kind == "probe":
            value = problem.probe(query.node, problem_rng)
        else:
            value = problem.evaluate(spec.leaf_of(query.node), problem_rng)
        policy.tell(query, value)
        if history is not None:
            history.is_probe.append(query.kind == "probe")
            history.nodes.append(query.node)
            history.values.append(value)
        if callback is not None:
            callback(query, value, ledger)
    return RunResult(policy=getattr(policy, "name", type(policy).__name__), budget=float(budget),
                     seed=seed, recommendation=np.asarray(policy.recommend(k)),
                     spent=ledger.spent, n_probes=ledger.n_probes,
                     n_leaf_evals=ledger.n_leaves, history=history)
