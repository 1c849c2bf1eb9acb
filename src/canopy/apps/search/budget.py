"""Validation of budget lists, shared by the offline replay and the live search."""

from __future__ import annotations

from collections.abc import Sequence

from canopy.validation import check_number, check_whole

__all__ = ["check_budgets"]


def check_budgets(budgets: Sequence[float], *, whole: bool = False) -> list[float]:
    """Budgets in calls, each at least one call (whole numbers when ``whole``); a budget of
    zero, a negative or non-finite one, or an empty list raises ``ValueError``, a budget that
    is no number ``TypeError``."""
    checked = [float(check_whole(budget, "budgets") if whole else
                     check_number(budget, "budgets", low=1.0)) for budget in budgets]
    if not checked:
        raise ValueError("budgets is empty")
    return checked
