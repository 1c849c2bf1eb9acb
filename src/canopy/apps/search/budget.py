"""Validation of budget lists, shared by the offline replay and the live search."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = ["check_budgets"]


def check_budgets(budgets: Sequence[float], *, whole: bool = False) -> list[float]:
    """Budgets in calls, each at least one call (whole numbers when ``whole``); a budget of
    zero, a negative or non-finite one, or an empty list raises ``ValueError``."""
    checked = []
    for budget in budgets:
        number = isinstance(budget, (int, float, np.integer, np.floating)) and not isinstance(
            budget, bool)
        if not (number and math.isfinite(budget) and budget >= 1) or (
                whole and float(budget) != int(budget)):
            kind = "whole numbers" if whole else "numbers"
            raise ValueError(f"budgets must be {kind} of calls >= 1, got {budget!r}")
        checked.append(float(budget))
    if not checked:
        raise ValueError("budgets is empty")
    return checked
