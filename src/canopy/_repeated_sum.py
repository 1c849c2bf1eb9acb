"""Compiled helper of :meth:`canopy.problem.Ledger.charge_many`, in a module of its own so that
importing :mod:`canopy.problem` does not import numba (the ledger imports it on first use)."""

from __future__ import annotations

import math

import numba

# steps kept back from a binade's end when jumping (the quotient that counts them may be off by
# a unit or two); those few are added one at a time
_MARGIN = 4


@numba.njit(cache=True)
def repeated_sum(start: float, term: float, count: int) -> float:
    """``start + term + ... + term`` (``count`` terms) added left to right in float64, bit for
    bit what ``count`` separate additions give, in O(binades crossed) rather than O(count).

    While the running total ``x`` stays in one binade ``[2^(e-1), 2^e)``, where floats are the
    multiples of one ulp ``u``, ``fl(x + term) - x`` depends only on ``term``'s remainder
    modulo ``u`` (and, on an exact tie, on the parity of ``x / u``, which settles after one
    step): so once two consecutive additions add the same ``d``, every addition whose exact
    sum stays below ``2^e`` adds ``d`` too, and those are taken at once as ``x + m d`` (exact:
    a multiple of ``u`` below ``2^e``). Additions near a binade's end, and any input that is
    not positive and finite, go one at a time."""
    total = start
    left = count
    last_step, last_exponent = -1.0, 0
    while left > 0:
        before = total
        total = before + term
        left -= 1
        if not (before > 0.0 and term > 0.0 and math.isfinite(total)):
            last_step = -1.0
            continue
        exponent = math.frexp(before)[1]  # before in [2^(exponent-1), 2^exponent)
        if math.frexp(total)[1] != exponent:  # crossed into the next binade
            last_step = -1.0
            continue
        step = total - before  # exact: both multiples of one ulp in one binade
        if step == last_step and exponent == last_exponent:
            if step == 0.0:  # absorbed, and so every addition after
                return total
            room = math.ldexp(1.0, exponent) - total  # exact (Sterbenz)
            jump = min(int((room - term) / step) - _MARGIN, left)
            if jump > 0:
                total += jump * step
                left -= jump
        last_step, last_exponent = step, exponent
    return total
