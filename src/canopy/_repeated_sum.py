"""Compiled helper of :meth:`canopy.problem.Ledger.charge_many`, in a module of its own so that
importing :mod:`canopy.problem` does not import numba (the ledger imports it on first use)."""

from __future__ import annotations

import numba


@numba.njit(cache=True)
def repeated_sum(start: float, term: float, count: int) -> float:
    """``start + term + ... + term`` (``count`` terms) added left to right in float64, bit for
    bit what ``count`` separate additions give (no fast-math, so nothing is reassociated)."""
    total = start
    for _ in range(count):
        total += term
    return total
