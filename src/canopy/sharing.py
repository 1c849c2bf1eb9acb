"""Certified sharing: a child cell pools its parent's statistics until a test at level
``delta`` shows that it differs (paper Sections 3.3-3.4: the data, not an assumed schedule,
decide where the tree is smooth).

A child with ``n_a`` observations of mean ``mean_a`` and a parent pool (the parent's data
without the child's) with ``n_b`` observations of mean ``mean_b`` differ when

* ``"test"`` (default): a two-sample z-test at level ``delta`` on the shrunk variances
  ``V = (n var + 1/4) / (n + 1)``, ``|mean_a - mean_b| > z_{1-delta/2} sqrt(V_a/n_a + V_b/n_b)``.
  Its error is ``delta`` per look; a learner looks after every observation, so across a run
  it is not controlled. A false "differs" costs data (the child stops borrowing), never
  exploration: the learner's own confidence radius still covers what it then sees.
* ``"anytime"``: the two means' time-uniform Hoeffding intervals (a union bound over every
  sample size, ``delta_n = delta / (n (n + 1))``, half of ``delta`` per side) for rewards in
  an interval of width ``value_range`` do not overlap. Valid across all looks; it needs many
  more observations to split.
* ``"backoff"``: no test; the child always borrows ``min(kappa, n_b)`` pseudo-observations
  of its parent (hierarchical shrinkage, the fixed prior weight this module replaces).

:func:`prior_weight` is the one primitive the regional learners call (``canopy.regional``).
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numba
import numpy as np

__all__ = ["RULES", "prior_weight", "sharing_rule"]

BACKOFF, TEST, ANYTIME = 0, 1, 2
RULES = {"test": TEST, "anytime": ANYTIME, "backoff": BACKOFF}

# rule = (mode, kappa, level, value_range): level is z for TEST, delta for ANYTIME
MODE, KAPPA, LEVEL, RANGE = 0, 1, 2, 3


def sharing_rule(name: str = "test", *, delta: float = 0.05, kappa: float = 5.0,
                 value_range: float = 1.0) -> np.ndarray:
    """The rule the kernels read: ``(mode, kappa, level, value_range)`` as a float array."""
    if name not in RULES:
        raise ValueError(f"sharing must be one of {sorted(RULES)}, got {name!r}")
    if not isinstance(delta, (int, float)) or not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    if not isinstance(kappa, (int, float)) or not math.isfinite(kappa) or kappa < 0:
        raise ValueError(f"kappa must be finite and >= 0, got {kappa!r}")
    if not math.isfinite(value_range) or value_range <= 0:
        raise ValueError(f"value_range must be finite and > 0, got {value_range!r}")
    level = NormalDist().inv_cdf(1.0 - delta / 2.0) if RULES[name] == TEST else delta
    return np.array([RULES[name], kappa, level, value_range], dtype=float)


@numba.njit(cache=True)
def _shrunk(n: float, var: float) -> float:
    return (n * var + 0.25) / (n + 1.0)


@numba.njit(cache=True)
def _anytime_radius(n: float, delta: float, value_range: float) -> float:
    """Time-uniform Hoeffding radius at level ``delta`` (union over every ``n``)."""
    return value_range * math.sqrt(math.log(n * (n + 1.0) / delta) / (2.0 * n))


@numba.njit(cache=True)
def differs(n_a: float, mean_a: float, var_a: float, n_b: float, mean_b: float,
            var_b: float, rule: np.ndarray) -> bool:
    """Whether the rule's test separates mean ``a`` from mean ``b`` (never for ``backoff``)."""
    mode = int(rule[MODE])
    if mode == BACKOFF or n_a < 1.0 or n_b < 1.0:
        return False
    gap = abs(mean_a - mean_b)
    if mode == TEST:
        return gap > rule[LEVEL] * math.sqrt(_shrunk(n_a, var_a) / n_a
                                             + _shrunk(n_b, var_b) / n_b)
    half = rule[LEVEL] / 2.0
    return gap > (_anytime_radius(n_a, half, rule[RANGE])
                  + _anytime_radius(n_b, half, rule[RANGE]))


@numba.njit(cache=True)
def prior_weight(n_own: float, mean_own: float, var_own: float, n_prior: float,
                 mean_prior: float, var_prior: float, rule: np.ndarray) -> float:
    """Pseudo-observations of the parent pool a child borrows: ``min(n_prior, kappa + n_own)``
    until the test separates the two (then none); ``min(kappa, n_prior)`` under ``backoff``.

    The cap keeps the child exploring: borrowing the whole pool would shrink its confidence
    radius to the pool's, so it would stop sampling the arms the pool dislikes and the test
    could never gather the data that separates it."""
    if int(rule[MODE]) == BACKOFF:
        return min(rule[KAPPA], n_prior)
    if differs(n_own, mean_own, var_own, n_prior, mean_prior, var_prior, rule):
        return 0.0
    return min(n_prior, rule[KAPPA] + n_own)
