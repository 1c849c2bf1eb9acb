"""Policies on one ask/tell surface (:class:`~canopy.policies.base.Policy`).

Imported lazily by name, so ``import canopy`` compiles nothing:

- regret play (Eqs. 4-6): :class:`OptimisticDescent`, :class:`MemoryBoundedDescent`, and
  the instrument :class:`KnownBiasDescent` (spreads given, e.g. the true biases);
- fixed-budget identification (Section 3.4, Appendix B): :class:`EdgeTargeted`,
  :class:`TopKBeam`, :class:`TopKSound`;
- baselines: :class:`Uniform`, :class:`SuccessiveElimination`, :class:`SuccessiveRejects`,
  :class:`SequentialHalving`, :class:`FlatUCB`, :class:`HOO`, :class:`POO`.
"""

from __future__ import annotations

import importlib
from typing import Any

from canopy.policies.base import Policy, check_k

_EXPORTS = {
    "OptimisticDescent": "canopy.policies.descent",
    "MemoryBoundedDescent": "canopy.policies.descent",
    "KnownBiasDescent": "canopy.policies.descent",
    "EdgeTargeted": "canopy.policies.identify",
    "TopKBeam": "canopy.policies.identify",
    "TopKSound": "canopy.policies.identify",
    "Uniform": "canopy.policies.baselines",
    "SuccessiveElimination": "canopy.policies.baselines",
    "SuccessiveRejects": "canopy.policies.baselines",
    "SequentialHalving": "canopy.policies.baselines",
    "FlatUCB": "canopy.policies.baselines",
    "HOO": "canopy.policies.hoo",
    "POO": "canopy.policies.hoo",
}

__all__ = ["Policy", "check_k", *_EXPORTS]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'canopy.policies' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
