"""Argument validation, one rule everywhere: ``check_*(value, name, ...)`` returns the value
(as ``float`` or ``int``) or raises naming the parameter: ``TypeError`` when the value is not
of the expected kind (a string, a bool or ``None`` where a number is due), ``ValueError`` when
it is of the right kind but not finite or out of range."""

from __future__ import annotations

import math
from typing import Literal, overload

import numpy as np

__all__ = ["check_count", "check_http_url", "check_nonnegative", "check_number",
           "check_open_unit", "check_positive", "check_text", "check_whole"]

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


@overload
def check_positive(value: object, name: str, *, allow_none: Literal[False] = ...) -> float: ...
@overload
def check_positive(value: object, name: str, *, allow_none: bool) -> float | None: ...
def check_positive(value: object, name: str, *, allow_none: bool = False) -> float | None:
    """A finite number > 0 (or ``None`` when ``allow_none``)."""
    if value is None and allow_none:
        return None
    return check_number(value, name, low=0.0, low_open=True)


def check_nonnegative(value: object, name: str) -> float:
    """A finite number >= 0."""
    return check_number(value, name, low=0.0)


@overload
def check_open_unit(value: object, name: str, *, allow_none: Literal[False] = ...) -> float: ...
@overload
def check_open_unit(value: object, name: str, *, allow_none: bool) -> float | None: ...
def check_open_unit(value: object, name: str, *, allow_none: bool = False) -> float | None:
    """A number in the open interval (0, 1) (or ``None`` when ``allow_none``)."""
    if value is None and allow_none:
        return None
    return check_number(value, name, low=0.0, high=1.0, low_open=True, high_open=True)


def check_count(value: object, name: str, *, low: int = 1, high: int | None = None) -> int:
    """An integer >= ``low`` (seeds, rounds, workers, branching), and <= ``high`` when given
    (a top-``k`` request over ``high`` items: ``check_count(k, "k", high=n)``)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, _INTEGER):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if high is not None and not low <= value <= high:
        raise ValueError(f"{name} must be in {low}..{high}, got {value}")
    if value < low:
        raise ValueError(f"{name} must be >= {low}, got {value}")
    return int(value)


def check_whole(value: object, name: str, *, low: int = 1) -> int:
    """A number with an integer value >= ``low``: an int, or a float such as ``1024.0`` (a leaf
    count carried through a formula)."""
    number = check_number(value, name)
    if int(number) != number or number < low:
        raise ValueError(f"{name} must be a whole number >= {low}, got {value!r}")
    return int(number)


def check_text(value: object, name: str) -> str:
    """A non-empty string."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a string, got {type(value).__name__}")
    if not value:
        raise ValueError(f"{name} must be a non-empty string")
    return value


def check_http_url(value: object, name: str) -> str:
    """A string starting ``http://`` or ``https://``."""
    text = check_text(value, name)
    if not text.startswith(("http://", "https://")):
        raise ValueError(f"{name} must be an http(s) URL, got {text!r}")
    return text
