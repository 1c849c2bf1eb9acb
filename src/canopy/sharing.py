"""Certified sharing: a child cell pools its parent's statistics until a test at level
``delta`` shows that it differs (paper Sections 3.3-3.4: the data, not an assumed schedule,
decide where the tree is smooth).

The child is compared with its parent's pool (the parent's data without the child's) arm by
arm. While no arm separates, the child *is* the pool and borrows all of it on every arm it
has tried (so a region that does not differ routes as the flat learner would); once one arm
separates, the child is a region of its own and every arm keeps only a weak prior of
``min(kappa, n_pool)`` pseudo-observations (hierarchical shrinkage), as does an arm the child
has never tried (it has no evidence there). Per arm, with ``n`` observations of mean ``x``:

* ``"test"`` (default): a two-sample z-test on the shrunk variances
  ``V = (n var + 1/4) / (n + 1)``: ``|x_a - x_b| > z sqrt(V_a/n_a + V_b/n_b)``, ``z`` the
  ``1 - delta / (2 arms)`` normal quantile. Its level is ``delta`` per look; a learner looks
  after every observation, so across a run it is not controlled. A false split costs data
  (the child stops borrowing), never exploration: the learner's own confidence radius still
  covers what it then sees.
* ``"anytime"``: the two means' time-uniform Hoeffding intervals (a union bound
  over every sample size, ``delta_n = delta / (arms n (n + 1))``, half per side) for rewards
  in an interval of width ``value_range`` do not overlap. A child equal to its pool splits
  with probability at most ``delta`` over the whole run, however often it is tested;
  it splits much later (more data per region).
* ``"backoff"``: no test; the child always keeps the weak prior (the fixed weight this
  module replaces, kept for comparison).

:func:`prior_weights` is the one primitive the regional learners call
(:mod:`canopy.regional.kernels`).
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numba
import numpy as np

from canopy.validation import check_count, check_nonnegative, check_number

__all__ = ["RULES", "differs", "prior_weights", "sharing_rule"]

BACKOFF, TEST, ANYTIME = 0, 1, 2
RULES = {"test": TEST, "anytime": ANYTIME, "backoff": BACKOFF}

# rule = (mode, kappa, level, value_range): level is z for TEST, delta for ANYTIME
MODE, KAPPA, LEVEL, RANGE = 0, 1, 2, 3


def sharing_rule(name: str = "test", *, delta: float = 0.01, kappa: float = 5.0,
                 arms: int = 1, value_range: float = 1.0) -> np.ndarray:
    """The rule the kernels read: ``(mode, kappa, level, value_range)`` as a float array.

    A child is tested on each of its ``arms``; each test runs at ``delta / arms`` (Bonferroni),
    so a child equal to its pool splits with probability at most ``delta`` per look."""
    if name not in RULES:
        raise ValueError(f"sharing must be one of {sorted(RULES)}, got {name!r}")
    delta = check_number(delta, "delta", low=0.0, high=1.0, low_open=True, high_open=True)
    kappa = check_nonnegative(kappa, "kappa")
    delta = delta / check_count(arms, "arms")
    value_range = check_number(value_range, "value_range", low=0.0, low_open=True)
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
def prior_weights(own: np.ndarray, prior: np.ndarray, rule: np.ndarray,
                  out: np.ndarray) -> None:
    """Pseudo-observations of the parent pool a child borrows, per arm, into ``out``.

    ``own[m]`` and ``prior[m]`` are ``(n, mean, variance)`` of arm ``m`` in the child and in
    the parent's pool without it. Until the test separates the child from its pool on some
    arm, the child borrows all of the pool on every arm it has tried (it is the pool); once
    it does, and on arms it has never tried, it keeps ``min(kappa, n_prior)`` (the pool as a
    weak prior). Under ``backoff`` the child always keeps the weak prior."""
    split = int(rule[MODE]) == BACKOFF
    k = own.shape[0]
    m = 0
    while not split and m < k:
        split = differs(own[m, 0], own[m, 1], own[m, 2], prior[m, 0], prior[m, 1],
                        prior[m, 2], rule)
        m += 1
    for m in range(k):
        pooled = not split and own[m, 0] >= 1.0
        out[m] = prior[m, 0] if pooled else min(rule[KAPPA], prior[m, 0])
