"""Canopy: multi-fidelity tree bandits with a data-driven aggregation-bias certificate.

Core objects: :class:`Tree` and :class:`LazyTree` (topology), :class:`LeafMeans` and the
:class:`Problem` protocol (cheap probes, expensive leaf evaluations, a cost :class:`Ledger`),
:func:`certify` (Algorithm 1), the policies in :mod:`canopy.policies`, and :func:`run`.
"""

from canopy.certificate import Certificate, RunningCertificate, certify, is_violation
from canopy.problem import (
    BudgetExceeded,
    FunctionOnInterval,
    LeafMeans,
    Ledger,
    Problem,
    ProblemSpec,
    Query,
)
from canopy.run import History, RunResult, run
from canopy.tree import LazyTree, Tree

__version__ = "0.1.0"

__all__ = [
    "BudgetExceeded",
    "Certificate",
    "FunctionOnInterval",
    "History",
    "LazyTree",
    "LeafMeans",
    "Ledger",
    "Problem",
    "ProblemSpec",
    "Query",
    "RunResult",
    "RunningCertificate",
    "Tree",
    "certify",
    "is_violation",
    "run",
]
