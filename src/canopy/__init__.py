"""Canopy: multi-fidelity tree bandits with a data-driven aggregation-bias certificate.

Core objects: :class:`Tree` and :class:`LazyTree` (topology), :class:`LeafMeans` and the
:class:`Problem` protocol (cheap probes, expensive leaf evaluations, a cost :class:`Ledger`),
:func:`certify` (Algorithm 1), the policies in :mod:`canopy.policies`, and :func:`run`.

The certificate (which compiles with numba) is imported on first use (PEP 562), so
``canopy``'s command line starts without loading numba or scipy. ``run`` stays eager: it
shares its name with the module :mod:`canopy.run`.
"""

from __future__ import annotations

from canopy._lazy import lazy_exports
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

_EXPORTS = {name: "canopy.certificate"
            for name in ("Certificate", "RunningCertificate", "certify", "is_violation")}

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


lazy_exports(__name__, _EXPORTS)
