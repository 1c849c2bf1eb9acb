"""Ray Tune: any Canopy policy as a Tune :class:`~ray.tune.search.Searcher`.

The candidate configurations are the leaves of a :class:`~canopy.tree.Tree` (grouped as the
user knows them to be alike: one subtree per optimiser, per model family, ...). A trial is
one query of the policy: a *leaf* query runs the leaf's configuration at full fidelity, a
*probe* of an internal node runs a configuration drawn uniformly from the leaves below it at
the cheap fidelity (the probe of Section 2: one random leaf of the cell, observed with
noise). Each suggested configuration carries ``canopy_fidelity`` (``"probe"`` or ``"leaf"``:
the trainable may run a probe shorter) and ``canopy_query`` (the query's sequence number, a
seed for the trainable's own randomness). The policy maximises, so ``mode="min"`` tells it
``-metric``; a failed trial's query is abandoned (its cost stays spent).

``save``/``restore`` pickle the policy mid-run (every policy is data) with the trials in
flight, so a restored searcher continues the same run: the same queries, and the same
recommendation, :attr:`CanopySearcher.best_config`. Requires the ``ray`` extra.
"""

from __future__ import annotations

import math
import pickle
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from canopy.errors import MissingExtra
from canopy.policies.base import Policy
from canopy.problem import ProblemSpec, Query
from canopy.tree import Tree

try:
    from ray.tune.search import Searcher
except ImportError as error:  # pragma: no cover - depends on the installed extras
    raise MissingExtra("canopy.integrations.ray_tune needs Ray Tune: "
                       "pip install 'canopy-bandits[ray]'") from error

__all__ = ["CanopySearcher"]

FIDELITY = "canopy_fidelity"
QUERY = "canopy_query"


class CanopySearcher(Searcher):
    """Suggest Tune trials from a Canopy policy over a tree of configurations.

    Args:
        policy: any :class:`~canopy.policies.base.Policy`, not started (the searcher starts it).
        tree: the configurations' tree; leaf ``i`` runs ``configs[i]``.
        configs: one configuration (a dict) per leaf, in leaf order.
        budget: the policy's cost budget (in the units of the two costs).
        metric, mode: the reported metric and ``"max"`` or ``"min"``.
        probe_cost, leaf_cost: the cost of a probe trial and of a full-fidelity trial.
        sigma: the noise scale of a reported metric, as the policy assumes it.
        value_range: the declared range of the metric (after the sign for ``mode="min"``).
        seed: seeds the policy and the draw of a probe's configuration.
    """

    def __init__(self, policy: Policy, tree: Tree, configs: Sequence[Mapping[str, Any]], *,
                 budget: float, metric: str | None = None, mode: str | None = None,
                 probe_cost: float = 1.0, leaf_cost: float = 1.0, sigma: float = 0.1,
                 value_range: tuple[float, float] = (-math.inf, math.inf), seed: int = 0
                 ) -> None:
        if not isinstance(policy, Policy):
            raise TypeError(f"policy must be a canopy Policy, got {type(policy).__name__}")
        if not isinstance(tree, Tree):
            raise TypeError(f"tree must be a canopy Tree, got {type(tree).__name__}")
        if len(configs) != tree.n_leaves:
            raise ValueError(f"configs has {len(configs)} entries, the tree {tree.n_leaves} "
                             "leaves")
        if mode not in (None, "max", "min"):
            raise ValueError(f"mode must be 'max' or 'min', got {mode!r}")
        super().__init__(metric=metric, mode=mode)
        self.configs = [dict(config) for config in configs]
        spec = ProblemSpec(tree, float(sigma), float(probe_cost), float(leaf_cost),
                           value_range)
        self.policy = policy.start(spec, budget=budget, seed=seed)
        self.rng = np.random.default_rng([seed, 1])
        self.pending: dict[str, Query] = {}
        self.n_queries = 0

    def set_search_properties(self, metric: str | None, mode: str | None,
                              config: dict, **spec: Any) -> bool:
        """Take Tune's metric and mode where the constructor left them unset."""
        if mode not in (None, "max", "min"):
            return False
        self._metric = self._metric or metric
        self._mode = self._mode or mode
        return True

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        """The next trial's configuration; ``None`` while the policy waits for trials in
        flight, :attr:`ray.tune.search.Searcher.FINISHED` once its budget is spent."""
        query = self.policy.ask()
        if query is None:
            return None if self.pending else Searcher.FINISHED
        tree = self.policy.spec_.tree
        if query.kind == "leaf":
            leaf = int(tree.node_leaf[query.node])
        else:
            leaf = int(self.rng.integers(tree.leaf_lo[query.node], tree.leaf_hi[query.node]))
        self.pending[trial_id] = query
        self.n_queries += 1
        return {**self.configs[leaf], FIDELITY: query.kind, QUERY: self.n_queries - 1}

    def on_trial_complete(self, trial_id: str, result: dict | None = None,
                          error: bool = False) -> None:
        """Tell the policy the trial's metric (abandon its query on an error or no metric)."""
        query = self.pending.pop(trial_id, None)
        if query is None:
            return
        value = None if error or result is None else result.get(self.metric)
        if value is None:
            self.policy.abandon(query)
            return
        self.policy.tell(query, -float(value) if self.mode == "min" else float(value))

    @property
    def best_config(self) -> dict[str, Any]:
        """The configuration of the leaf the policy recommends."""
        return dict(self.configs[int(self.policy.recommend(1)[0])])

    def save(self, checkpoint_path: str) -> None:
        """Pickle the whole searcher state (policy mid-run included) to ``checkpoint_path``."""
        state = {key: getattr(self, key) for key in ("configs", "policy", "rng", "pending",
                                                     "n_queries", "_metric", "_mode")}
        with open(checkpoint_path, "wb") as handle:
            pickle.dump(state, handle)

    def restore(self, checkpoint_path: str) -> None:
        """Continue from a :meth:`save` (a file this process trusts: it is unpickled)."""
        with open(checkpoint_path, "rb") as handle:
            state = pickle.load(handle)
        for key, value in state.items():
            setattr(self, key, value)
