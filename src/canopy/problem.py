"""The multi-fidelity problem (Section 3.1): queries, the problem protocol, the synthetic
oracle over leaf means, and the cost ledger.

A *probe* of node ``v`` returns ``mu(L) + eta`` for a uniform leaf ``L`` below ``v`` at cost
``c_p``; an *evaluation* of leaf ``x`` returns ``mu(x) + eta`` at cost ``c_l >= c_p``, with
``eta ~ N(0, sigma^2)``. Budgets are costs, not pull counts.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field
from typing import Literal, NamedTuple, Protocol, runtime_checkable

import numpy as np

from canopy.tree import LazyTree, Tree
from canopy.validation import check_count, check_number

__all__ = [
    "BudgetExceeded",
    "FunctionOnInterval",
    "LeafMeans",
    "Ledger",
    "Problem",
    "ProblemSpec",
    "Query",
    "QueryBatch",
]

QueryKind = Literal["probe", "leaf"]


class Query(NamedTuple):
    """One request of a policy: ``kind="probe"`` of an internal node, or ``kind="leaf"``, an
    evaluation of a leaf. ``node`` is always a node id of the tree (a ``(level, index)`` pair on
    a :class:`~canopy.tree.LazyTree`); :attr:`ProblemSpec.leaf_of` turns a leaf node into the
    leaf index that :meth:`Problem.evaluate` takes. A named tuple: cheap to build, hashable,
    equal by value."""

    kind: QueryKind
    node: Hashable


@dataclass(frozen=True)
class QueryBatch:
    """Queries of one kind issued together by :meth:`~canopy.policies.base.Policy.ask_batch`:
    ``nodes[i]`` is the node of the ``i``-th (an ``int64`` array on a finite tree), each
    already paid for. Iterating gives the :class:`Query` objects."""

    kind: QueryKind
    nodes: np.ndarray
    token: int = field(default=-1, compare=False, repr=False)  # the issuing policy's record

    def __len__(self) -> int:
        return len(self.nodes)

    def __iter__(self) -> Iterator[Query]:
        kind = self.kind
        return (Query(kind, node) for node in self.nodes.tolist())


@dataclass(frozen=True)
class ProblemSpec:
    """What a policy may know of a problem: the tree, the noise scale, the two costs, and the
    declared range of observations (outside it, an observation is rejected)."""

    tree: Tree | LazyTree
    sigma: float
    probe_cost: float
    leaf_cost: float
    value_range: tuple[float, float] = (-math.inf, math.inf)

    def __post_init__(self) -> None:
        if not isinstance(self.tree, (Tree, LazyTree)):
            raise TypeError(f"tree must be a Tree or LazyTree, got {type(self.tree).__name__}")
        if not (math.isfinite(self.sigma) and self.sigma >= 0):
            raise ValueError(f"sigma must be finite and >= 0, got {self.sigma}")
        for name in ("probe_cost", "leaf_cost"):
            cost = getattr(self, name)
            if not (math.isfinite(cost) and cost > 0):
                raise ValueError(f"{name} must be finite and > 0, got {cost}")
        if self.probe_cost > self.leaf_cost:
            raise ValueError(
                f"probe_cost ({self.probe_cost}) must not exceed leaf_cost ({self.leaf_cost})"
            )
        low, high = self.value_range
        if not low < high:
            raise ValueError(f"value_range must be (low, high) with low < high, got {low, high}")

    def cost(self, query: Query) -> float:
        return self.probe_cost if query.kind == "probe" else self.leaf_cost

    def leaf_of(self, node: int) -> int:
        """Leaf index of a leaf node of a finite tree."""
        if not isinstance(self.tree, Tree):
            raise TypeError("leaf_of needs a finite Tree")
        index = int(self.tree.node_leaf[self.tree.check_node(node)])
        if index < 0:
            raise ValueError(f"node {node} is internal: a leaf query needs a leaf node")
        return index

    def check_query(self, query: Query) -> None:
        """Raise if ``query`` does not fit the tree: an unknown kind, a node outside it, a leaf
        query of an internal node, or a probe of a leaf (Section 3.1: internal nodes are
        probed, leaves evaluated; a probe of a leaf would be an evaluation at probe cost)."""
        if query.kind not in ("probe", "leaf"):
            raise ValueError(f"query kind must be 'probe' or 'leaf', got {query.kind!r}")
        tree = self.tree
        if isinstance(tree, Tree):
            if query.kind == "leaf":
                self.leaf_of(query.node)  # raises for internal nodes
            elif tree.node_leaf[tree.check_node(query.node)] >= 0:
                raise ValueError(f"node {query.node} is a leaf: evaluate it with a leaf query")
        elif query.kind == "probe" and tree.is_leaf(query.node):
            raise ValueError(f"node {query.node} is a leaf: evaluate it with a leaf query")
        else:
            tree.check_node(query.node)


@runtime_checkable
class Problem(Protocol):
    """A multi-fidelity problem: a :class:`ProblemSpec` plus the two query types."""

    spec: ProblemSpec

    def probe(self, node: Hashable, rng: np.random.Generator) -> float:
        """Cheap, biased: one noisy value of a uniform leaf below ``node``."""
        ...

    def evaluate(self, leaf: int, rng: np.random.Generator) -> float:
        """Expensive, unbiased: one noisy value of leaf index ``leaf``."""
        ...


class BudgetExceeded(RuntimeError):
    """A query was issued that the remaining budget cannot pay for."""


@functools.cache
def _repeated_sum() -> Callable[[float, float, int], float]:
    """The compiled left-to-right sum (imported on first use: it imports numba)."""
    from canopy._repeated_sum import repeated_sum

    return repeated_sum


class Ledger:
    """Cost ledger: records spending by kind and refuses any charge past the budget."""

    def __init__(self, budget: float) -> None:
        self.budget = check_number(budget, "budget", low=0.0, low_open=True)
        self._limit = self.budget * (1.0 + 1e-12)  # forgives float round-off in sums of costs
        self.spent = 0.0
        self.n_probes = 0
        self.n_leaves = 0

    @property
    def remaining(self) -> float:
        return self.budget - self.spent

    def can_afford(self, cost: float) -> bool:
        return self.spent + cost <= self._limit

    def try_charge(self, kind: QueryKind, cost: float) -> bool:
        """Charge ``cost`` if the budget allows it; ``False`` (and nothing charged) otherwise."""
        spent = self.spent + cost
        if spent > self._limit:
            return False
        self.spent = spent
        if kind == "probe":
            self.n_probes += 1
        else:
            self.n_leaves += 1
        return True

    def affordable(self, cost: float) -> int:
        """How many more queries of ``cost`` the budget pays for."""
        return max(math.floor((self._limit - self.spent) / cost), 0)

    def charge_many(self, kind: QueryKind, cost: float, count: int) -> None:
        """Charge ``count`` queries of ``cost`` at once (as ``count`` calls of :meth:`charge`:
        :class:`BudgetExceeded` and nothing charged if the budget cannot pay them all)."""
        if count <= 0:
            return
        # summed one cost at a time, as that many charges would (bit for bit the same total);
        # whole numbers below 2^53 add exactly, so there one product gives the same total
        total = cost * count
        if float(cost).is_integer() and self.spent.is_integer() and self.spent + total < 2.0**53:
            spent = self.spent + total
        else:
            spent = _repeated_sum()(self.spent, float(cost), int(count))
        if spent > self._limit:
            raise BudgetExceeded(f"{count} {kind} queries cost {total:g} but only "
                                 f"{self.remaining:g} of the budget {self.budget:g} remains")
        self.spent = spent
        if kind == "probe":
            self.n_probes += count
        else:
            self.n_leaves += count

    def refund(self, kind: QueryKind, cost: float) -> None:
        """Return the charge of a query that was never evaluated."""
        self.spent = max(self.spent - cost, 0.0)
        if kind == "probe":
            self.n_probes -= 1
        else:
            self.n_leaves -= 1

    def charge(self, kind: QueryKind, cost: float) -> None:
        """Charge ``cost``; raise :class:`BudgetExceeded` if the budget cannot pay it."""
        if not self.try_charge(kind, cost):
            raise BudgetExceeded(
                f"a {kind} query costs {cost:g} but only {self.remaining:g} of the budget "
                f"{self.budget:g} remains"
            )


class LeafMeans:
    """Synthetic oracle over a finite tree: leaf means in ``[0, 1]`` plus Gaussian noise.

    Exposes the truth for scoring (never for policies): ``means``, ``node_values``
    (Eq. 1), ``best_leaf``, :meth:`top_k`, :meth:`aggregation_bias` (Eq. 2).
    """

    def __init__(self, tree: Tree, means: np.ndarray, *, sigma: float = 0.1,
                 probe_cost: float = 1.0, leaf_cost: float = 1.0) -> None:
        if not isinstance(tree, Tree):
            raise TypeError(f"tree must be a Tree, got {type(tree).__name__}")
        values = np.asarray(means, dtype=float)
        if values.shape != (tree.n_leaves,):
            raise ValueError(f"means has shape {values.shape}, expected ({tree.n_leaves},)")
        if not np.all(np.isfinite(values)):
            raise ValueError("means contain NaN or infinite values")
        if values.min() < 0 or values.max() > 1:
            raise ValueError(
                f"means must lie in [0, 1], got range [{values.min():.4g}, {values.max():.4g}]"
            )
        self.spec = ProblemSpec(tree, float(sigma), float(probe_cost), float(leaf_cost))
        self.means = values
        self.means.setflags(write=False)
        self.node_values = tree.subtree_means(values)
        self.node_values.setflags(write=False)

    @property
    def tree(self) -> Tree:
        return self.spec.tree  # type: ignore[return-value]

    @property
    def best_leaf(self) -> int:
        return int(np.argmax(self.means))

    @property
    def mu_star(self) -> float:
        return float(self.means.max())

    def top_k(self, k: int) -> np.ndarray:
        """Indices of the ``k`` best leaves, best first (ties by index)."""
        check_count(k, "k", high=self.means.size)
        return np.argsort(-self.means, kind="stable")[:k]

    def aggregation_bias(self, node: int) -> float:
        """Eq. (2): ``max`` minus mean of the leaf means below ``node``."""
        leaves = self.tree.leaves_under(node)
        block = self.means[leaves.start:leaves.stop]
        return float(block.max() - block.mean())

    def aggregation_biases(self) -> np.ndarray:
        """Eq. (2) for every node, indexed by node id (round-off below 0 clipped)."""
        return np.maximum(self.tree.subtree_max(self.means) - self.node_values, 0.0)

    def value(self, node: int) -> float:
        """f(v) of Eq. (1)."""
        return float(self.node_values[self.tree.check_node(node)])

    def probe(self, node: int, rng: np.random.Generator) -> float:
        node = self.tree.check_node(node)
        leaf = rng.integers(self.tree.leaf_lo[node], self.tree.leaf_hi[node])
        return float(self.means[leaf] + self.spec.sigma * rng.standard_normal())

    def probe_many(self, node: int, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` independent probes of ``node`` at once (for certificates and benchmarks)."""
        node = self.tree.check_node(node)
        leaves = rng.integers(self.tree.leaf_lo[node], self.tree.leaf_hi[node], size=n)
        return self.means[leaves] + self.spec.sigma * rng.standard_normal(n)

    def evaluate(self, leaf: int, rng: np.random.Generator) -> float:
        leaf = self.tree.check_leaf(leaf)
        return float(self.means[leaf] + self.spec.sigma * rng.standard_normal())


class FunctionOnInterval:
    """Oracle over a :class:`~canopy.tree.LazyTree`: leaf means are a function ``f`` on
    ``[0, 1)``, a probe of a cell is ``f(x) + eta`` at a uniform ``x`` in its interval.

    ``f`` must be vectorised and map into ``[0, 1]``. ``value`` integrates ``f`` over a
    cell numerically (``resolution`` midpoints), for scoring regret."""

    def __init__(self, tree: LazyTree, f: Callable[[np.ndarray], np.ndarray], *,
                 sigma: float = 0.1, probe_cost: float = 1.0, mu_star: float | None = None,
                 resolution: int = 4096) -> None:
        self.spec = ProblemSpec(tree, float(sigma), float(probe_cost), float(probe_cost))
        self.f = f
        self.resolution = int(resolution)
        grid = (np.arange(2**16) + 0.5) / 2**16
        self.mu_star = float(np.max(f(grid))) if mu_star is None else float(mu_star)

    @property
    def tree(self) -> LazyTree:
        return self.spec.tree  # type: ignore[return-value]

    def value(self, node: tuple[int, int]) -> float:
        low, high = self.tree.interval(node)
        points = low + (high - low) * (np.arange(self.resolution) + 0.5) / self.resolution
        return float(np.mean(self.f(points)))

    def probe(self, node: tuple[int, int], rng: np.random.Generator) -> float:
        low, high = self.tree.interval(node)
        x = low + (high - low) * rng.random()
        return float(self.f(np.array([x]))[0] + self.spec.sigma * rng.standard_normal())

    def evaluate(self, leaf: int, rng: np.random.Generator) -> float:
        raise TypeError("an infinite-depth tree has no leaves to evaluate; probe its cells")
