"""Spread, confidence radius and violation test of the identification policies (Sections 3.3
and 3.4).

The violation test. Appendix B asks for a one-sided test that never flags a smooth cell
(level ``delta``) and catches violations that exceed the Lipschitz floor by a margin
(Assumption 1). The core's :func:`~canopy.certificate.is_violation` (empirical-Bernstein lower
bound on the spread) needs about ``(R / spread)^2 2 log(1/delta)`` probes per cell, ~1,500 for a
0.4 spike in a 4-leaf cell: far beyond a 400-unit budget. The policies therefore use a test
that spends the same knowledge the certificate's deconvolution does, exactly Gaussian noise of
known scale ``sigma``. A probe is ``X_i = f(v) + d_i + eta_i`` with ``|d_i - c| <= floor / 2``
for some ``c`` in a cell whose leaf means oscillate by at most ``floor = L rho^level``. The
centred probe vector is the projection ``P(d + eta)``, so by the triangle inequality
``sqrt(M2) <= ||P eta|| + ||P d|| <= sigma sqrt(chi2_{n-1}) + sqrt(n) floor / 2``, with
``M2 = sum (X_i - mean)^2``. The test flags when
``sqrt(M2) > sigma sqrt(chi2.isf(delta, n - 1)) + sqrt(n) floor / 2``: a smooth cell is flagged
with probability at most ``delta`` at any ``n``, with no truncation needed.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from scipy.stats import chi2

from canopy.certificate import welford_push
from canopy.stats import eb_radius

__all__ = ["oscillation_estimate", "push_probes", "radius", "violation_test"]

# Range-to-deviation ratio of a uniform distribution: turns a within-cell standard deviation
# into an oscillation (max - min) estimate for the Lipschitz pre-pass.
UNIFORM_RANGE_PER_STD = 2.0 * math.sqrt(3.0)


def violation_test(n: np.ndarray, m2: np.ndarray, sigma: float, floor: np.ndarray,
                   delta: float) -> np.ndarray:
    """``True`` where the probes' spread is too large for a cell oscillating by at most
    ``floor`` (module docstring); ``False`` for cells with fewer than two probes."""
    n = np.asarray(n, dtype=float)
    dof = np.maximum(n - 1.0, 1.0)
    threshold = sigma * np.sqrt(chi2.isf(delta, dof)) + np.sqrt(n) * np.asarray(floor) / 2.0
    return (n >= 2) & (np.sqrt(np.maximum(m2, 0.0)) > threshold)


def within_std(n: np.ndarray, m2: np.ndarray, sigma: float) -> np.ndarray:
    """Noise-deconvolved standard deviation of a cell's leaf means from its probes."""
    n = np.asarray(n, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        variance = np.where(n >= 2, m2 / np.maximum(n - 1.0, 1.0), 0.0)
    return np.sqrt(np.maximum(variance - sigma * sigma, 0.0))


def oscillation_estimate(n: np.ndarray, m2: np.ndarray, sigma: float) -> np.ndarray:
    """Point estimate of each cell's oscillation, ``2 sqrt(3)`` times its within-cell
    deviation (exact for uniformly spread leaf means)."""
    return UNIFORM_RANGE_PER_STD * within_std(n, m2, sigma)


def radius(n: np.ndarray, m2: np.ndarray, sigma: float, floor: np.ndarray | None,
           delta: float, z: float) -> np.ndarray:
    """One-sided confidence radius of a cell's probe mean. Under assumed smoothness
    (``floor`` given) a probe is Gaussian plus a term in an interval of width ``floor``, so
    sub-Gaussian with variance proxy ``sigma^2 + floor^2 / 4``; without it, the
    empirical-Bernstein radius on the range ``1 + 2 z sigma`` of truncated probes."""
    n = np.asarray(n, dtype=float)
    log_term = math.log(1.0 / delta)
    if floor is not None:
        proxy = sigma * sigma + np.asarray(floor) ** 2 / 4.0
        with np.errstate(divide="ignore"):
            return np.where(n > 0, np.sqrt(2.0 * proxy * log_term / np.maximum(n, 1.0)), np.inf)
    with np.errstate(invalid="ignore", divide="ignore"):
        variance = np.where(n >= 2, m2 / np.maximum(n - 1.0, 1.0), 0.0)
    return eb_radius(variance, n, delta, 1.0 + 2.0 * z * sigma)


@numba.njit(cache=True)
def push_probes(states: np.ndarray, rows: np.ndarray, values: np.ndarray,
                lambdas: np.ndarray, sigma: float, z: float) -> None:
    """Add probes to the packed certificate states ``states[rows[i]]`` in arrival order
    (Welford's update is sequential, so this loop is compiled)."""
    for i in range(rows.size):
        welford_push(states[rows[i]], values[i], lambdas, sigma, z)
