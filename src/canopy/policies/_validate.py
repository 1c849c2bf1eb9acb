"""Validation of policy parameters, shared by every policy family: each check returns the
value as a float or raises a ``TypeError``/``ValueError`` naming the parameter."""

from __future__ import annotations

import math

import numpy as np

_NUMBER = (int, float, np.integer, np.floating)


def check_positive(value: object, name: str, *, allow_none: bool = False) -> float | None:
    """A finite number > 0 (or ``None`` when ``allow_none``)."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, _NUMBER):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be finite and > 0, got {value}")
    return float(value)


def check_unit(value: float, name: str) -> float:
    """A number in the open interval (0, 1)."""
    if not 0.0 < value < 1.0:
        raise ValueError(f"{name} must be in (0, 1), got {value}")
    return float(value)


def check_rho(rho: float | None, name: str = "rho") -> float | None:
    """``None`` (meaning ``1/branching``) or a number in (0, 1)."""
    if rho is None:
        return None
    if isinstance(rho, bool) or not isinstance(rho, _NUMBER):
        raise TypeError(f"{name} must be a number or None, got {type(rho).__name__}")
    return check_unit(rho, name)
