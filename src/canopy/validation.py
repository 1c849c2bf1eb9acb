"""Argument validation, one rule everywhere: ``check_*(value, name, ...)`` returns the value
(as ``float`` or ``int``) or raises naming the parameter: ``TypeError`` when the value is not
of the expected kind (a string, a bool or ``None`` where a number is due), ``ValueError`` when
it is of the right kind but not finite or out of range."""

from __future__ import annotations

import math

import numpy as np

__all__ = ["check_count", "check_nonnegative", "check_number", "check_open_unit",
           "check_positive"]

_NUMBER = (int, float, np.integer, np.floating)
_INTEGER = (int, np.integer)


def check_number(value: object, name: str, *, low: float = -math.inf, high: float = math.inf,
                 low_open: bool = False, high_open: bool = False) -> float:
    """A finite real number in ``[low, high]`` (an end excluded when ``*_open``)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, _NUMBER):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    number = float(value)
    below = number <= low if low_open else number < low
    above = number >= high if high_open else number > high
    if not math.isfinite(number) or below or above:
        if math.isinf(high):
            bound = f"{'>' if low_open else '>='} {low:g}" if math.isfinite(low) else ""
        elif math.isinf(low):
            bound = f"{'<' if high_open else '<='} {high:g}"
        else:
            bound = (f"in {'(' if low_open else '['}{low:g}, {high:g}"
                     f"{')' if high_open else ']'}")
        raise ValueError(f"{name} must be a finite number {bound}".rstrip() +
                         f", got {value!r}")
    return number


def check_positive(value: object, name: str, *, allow_none: bool = False) -> float | None:
    """A finite number > 0 (or ``None`` when ``allow_none``)."""
    if value is None and allow_none:
        return None
    return check_number(value, name, low=0.0, low_open=True)


def check_nonnegative(value: object, name: str) -> float:
    """A finite number >= 0."""
    return check_number(value, name, low=0.0)


def check_open_unit(value: object, name: str, *, allow_none: bool = False) -> float | None:
    """A number in the open interval (0, 1) (or ``None`` when ``allow_none``)."""
    if value is None and allow_none:
        return None
    return check_number(value, name, low=0.0, high=1.0, low_open=True, high_open=True)


def check_count(value: object, name: str, *, low: int = 1) -> int:
    """An integer >= ``low`` (seeds, rounds, workers, branching)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, _INTEGER):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < low:
        raise ValueError(f"{name} must be >= {low}, got {value}")
    return int(value)
