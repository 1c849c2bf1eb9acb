"""The aggregation-bias certificate (Algorithm 1, Theorem 1, Appendix A) and violation flags.

From ``n`` random-path probes ``X_i = mu(L_i) + eta_i`` of a node with ``m`` leaves, noise
``eta ~ N(0, sigma^2)``, the certificate returns

    bound = min over lambda in grid of
            (1/lambda) [log m + log G_up(lambda) - lambda^2 sigma^2 / 2] - (mean(X) - eps_n)

where probes are truncated to ``[-z sigma, 1 + z sigma]``, ``G_up`` is the empirical-Bernstein
upper bound on ``E exp(lambda X)`` with range ``exp(lambda X_max)``, ``eps_n`` the
empirical-Bernstein lower radius on the mean, and ``delta`` is split over ``|grid| + 1``
slices. With probability at least ``1 - delta - 2 n Phibar(z)`` it is at least the aggregation
bias ``max_x mu(x) - f(v)`` of Eq. (2).

Everything is computed from running moments (Welford, per grid point), so the incremental form
(:class:`RunningCertificate`, O(|grid|) memory per node) gives the same bound as the batch form
(:func:`certify`) on the same samples. Exponentials are shifted by ``lambda X_max`` so no grid
point overflows.

On the grid. Truncation makes the factorisation ``E e^{lambda X} = M_mu M_eta`` of Step 2 exact
only on the range event; for ``lambda sigma > z`` the deconvolution term ``- lambda sigma^2 / 2``
outruns the truncated moment and the bound falls without limit, below the true bias. The default
grid therefore stops at ``lambda = z / sigma``, where the bound is still at least
``1 + z sigma / 2 - (mean - eps) >= 1 - f(v)``. A user grid past that point is refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numba
import numpy as np

from canopy.stats import merge_moments, std_lower_bound

__all__ = [
    "Certificate",
    "RunningCertificate",
    "certify",
    "default_lambdas",
    "is_violation",
]

DEFAULT_GRID_SIZE = 16


def default_lambdas(sigma: float, z: float = 3.0, size: int = DEFAULT_GRID_SIZE) -> np.ndarray:
    """Geometric grid of ``size`` points ending at ``z / sigma`` (1000 when ``sigma == 0``)."""
    top = z / sigma if sigma > 0 else 1000.0
    return np.geomspace(max(top / 400.0, 0.05), top, size)


@dataclass(frozen=True)
class Certificate:
    """Result of Algorithm 1 at one node.

    Attributes:
        bound: the certified upper bound on the aggregation bias (min over the grid).
        lam: the minimising lambda.
        mean_lower: ``mean - eps_n``, the lower confidence bound on the subtree value f(v).
        mean: the mean of the truncated probes.
        variance: their sample variance (``n - 1`` denominator).
        n: number of probes.
        bounds: ``U(lambda)`` at every grid point.
        lambdas: the grid.
        sigma, z: the noise scale and truncation level used.
    """

    bound: float
    lam: float
    mean_lower: float
    mean: float
    variance: float
    n: int
    bounds: np.ndarray
    lambdas: np.ndarray
    sigma: float
    z: float

    def spread_lower(self, delta: float) -> float:
        """One-sided lower confidence bound (level ``delta``) on the within-cell standard
        deviation of the leaf means, noise-deconvolved: ``sqrt(max(s_low^2 - sigma^2, 0))``
        with ``s_low`` the lower bound on the probes' standard deviation.

        Clipping to ``[-z sigma, 1 + z sigma]`` is 1-Lipschitz, so it can only shrink the
        variance: a lower bound on the truncated probes' deviation is one on the raw probes'.
        """
        std_low = float(std_lower_bound(self.variance, self.n, delta,
                                        1.0 + 2.0 * self.z * self.sigma))
        return math.sqrt(max(std_low * std_low - self.sigma * self.sigma, 0.0))


def is_violation(certificate: Certificate, floor: float, delta: float) -> bool:
    """Violation flag (Section 3.3): the lower confidence bound on the cell's within-cell
    spread exceeds the Lipschitz floor ``L * rho**level``. A Lipschitz cell whose leaf means
    oscillate by at most the floor has standard deviation at most half of it, so a smooth cell
    is flagged with probability at most ``delta``."""
    return certificate.spread_lower(delta) > floor


def _check_setup(n_leaves: int, sigma: float, delta: float, z: float,
                 lambdas: np.ndarray | None) -> np.ndarray:
    if isinstance(n_leaves, bool) or int(n_leaves) != n_leaves or n_leaves < 1:
        raise ValueError(f"n_leaves must be a positive integer, got {n_leaves!r}")
    if not (math.isfinite(sigma) and sigma >= 0):
        raise ValueError(f"sigma must be finite and >= 0, got {sigma}")
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    if not (math.isfinite(z) and z > 0):
        raise ValueError(f"z must be finite and > 0, got {z}")
    grid = default_lambdas(sigma, z) if lambdas is None else np.asarray(lambdas, dtype=float)
    if grid.ndim != 1 or grid.size == 0 or not np.all(np.isfinite(grid)) or np.any(grid <= 0):
        raise ValueError("lambdas must be a non-empty 1-D array of finite positive numbers")
    if sigma > 0 and np.any(grid * sigma > z * (1 + 1e-12)):
        raise ValueError(
            f"lambdas above z/sigma = {z / sigma:.4g} make the truncated certificate invalid "
            "(see the module docstring)"
        )
    return grid


def _check_samples(samples: np.ndarray) -> np.ndarray:
    x = np.asarray(samples, dtype=float).ravel()
    if x.size and not np.all(np.isfinite(x)):
        bad = int(np.flatnonzero(~np.isfinite(x))[0])
        raise ValueError(f"samples[{bad}] = {x[bad]} is not finite")
    return x


def certify(samples: np.ndarray, n_leaves: int, sigma: float, *, delta: float = 0.05,
            lambdas: np.ndarray | None = None, z: float = 3.0) -> Certificate:
    """Algorithm 1 on a batch of probes of one node with ``n_leaves`` leaves."""
    grid = _check_setup(n_leaves, sigma, delta, z, lambdas)
    x = np.clip(_check_samples(samples), -z * sigma, 1.0 + z * sigma)
    n = x.size
    x_max = 1.0 + z * sigma
    if n == 0:
        mean_x, var_x = math.nan, math.nan
        mean_y = np.full(grid.size, math.nan)
        var_y = np.full(grid.size, math.nan)
    else:
        y = np.exp(np.multiply.outer(x - x_max, grid))
        mean_x = float(x.mean())
        mean_y = y.mean(axis=0)
        var_x = float(x.var(ddof=1)) if n > 1 else 0.0
        var_y = y.var(axis=0, ddof=1) if n > 1 else np.zeros(grid.size)
    return _finish(n, mean_x, var_x, mean_y, var_y, grid, int(n_leaves), sigma, delta, z)


def _finish(n: int, mean_x: float, var_x: float, mean_y: np.ndarray, var_y: np.ndarray,
            grid: np.ndarray, n_leaves: int, sigma: float, delta: float,
            z: float) -> Certificate:
    bounds, mean_lower = bound_curve(n, mean_x, var_x, mean_y, var_y, grid,
                                     math.log(n_leaves), sigma, delta, z)
    best = int(np.argmin(bounds))
    return Certificate(bound=float(bounds[best]), lam=float(grid[best]),
                       mean_lower=float(mean_lower), mean=float(mean_x), variance=float(var_x),
                       n=int(n), bounds=bounds, lambdas=grid, sigma=float(sigma), z=float(z))


@numba.njit(cache=True)
def bound_curve(n: int, mean_x: float, var_x: float, mean_y: np.ndarray, var_y: np.ndarray,
                lambdas: np.ndarray, log_m: float, sigma: float, delta: float,
                z: float) -> tuple[np.ndarray, float]:
    """``U(lambda)`` over the grid and ``mean - eps_n`` from moments of the truncated probes
    (``mean_y``/``var_y`` are moments of ``exp(lambda (X - X_max))``). ``inf`` for n < 2.

    Shared by the batch and incremental forms and by the policies' compiled loops."""
    k = lambdas.size
    out = np.full(k, np.inf)
    if n < 2:
        return out, -np.inf
    log_term = math.log((k + 1) / delta)
    x_max = 1.0 + z * sigma
    x_range = 1.0 + 2.0 * z * sigma
    eps = math.sqrt(2.0 * max(var_x, 0.0) * log_term / n) + 7.0 * x_range * log_term / (
        3.0 * (n - 1))
    mean_lower = mean_x - eps
    for i in range(k):
        lam = lambdas[i]
        # G_up / exp(lam * x_max): the shifted variable lies in [0, 1], so its range is 1.
        g_shifted = (mean_y[i] + math.sqrt(2.0 * max(var_y[i], 0.0) * log_term / n)
                     + 7.0 * log_term / (3.0 * (n - 1)))
        log_g = lam * x_max + math.log(g_shifted)
        out[i] = (log_m + log_g - 0.5 * lam * lam * sigma * sigma) / lam - mean_lower
    return out, mean_lower


@numba.njit(cache=True)
def welford_push(state: np.ndarray, x: float, lambdas: np.ndarray, sigma: float,
                 z: float) -> None:
    """Add one probe to a packed running state ``[n, mean_x, m2_x, mean_y[k], m2_y[k]]``
    (length ``3 + 2k``), truncating it first."""
    k = lambdas.size
    x_max = 1.0 + z * sigma
    x = min(max(x, -z * sigma), x_max)
    state[0] += 1.0
    n = state[0]
    d = x - state[1]
    state[1] += d / n
    state[2] += d * (x - state[1])
    for i in range(k):
        y = math.exp(lambdas[i] * (x - x_max))
        dy = y - state[3 + i]
        state[3 + i] += dy / n
        state[3 + k + i] += dy * (y - state[3 + i])


@numba.njit(cache=True)
def state_bound(state: np.ndarray, lambdas: np.ndarray, log_m: float, sigma: float,
                delta: float, z: float) -> float:
    """The certificate's bound (min over the grid) from a packed running state."""
    k = lambdas.size
    n = int(state[0])
    if n < 2:
        return np.inf
    denom = n - 1.0
    var_y = state[3 + k:3 + 2 * k] / denom
    bounds, _ = bound_curve(n, state[1], state[2] / denom, state[3:3 + k], var_y, lambdas,
                            log_m, sigma, delta, z)
    return bounds.min()


class RunningCertificate:
    """Incremental form of Algorithm 1 at one node: O(|grid|) running moments, updated one
    probe (or one batch) at a time, giving the same bound as :func:`certify` on the same
    samples."""

    def __init__(self, n_leaves: int, sigma: float, *, delta: float = 0.05,
                 lambdas: np.ndarray | None = None, z: float = 3.0) -> None:
        self.lambdas = _check_setup(n_leaves, sigma, delta, z, lambdas)
        self.n_leaves, self.sigma, self.delta, self.z = int(n_leaves), float(sigma), delta, z
        self.state = np.zeros(3 + 2 * self.lambdas.size)

    @property
    def n(self) -> int:
        return int(self.state[0])

    def update(self, value: float) -> None:
        """Add one probe."""
        number = float(value)
        if not math.isfinite(number):
            raise ValueError(f"probe value {value!r} is not finite")
        welford_push(self.state, number, self.lambdas, self.sigma, self.z)

    def update_many(self, values: np.ndarray) -> None:
        """Add a batch of probes (merged with Chan's pairwise formula)."""
        x = np.clip(_check_samples(values), -self.z * self.sigma, 1.0 + self.z * self.sigma)
        if x.size == 0:
            return
        k = self.lambdas.size
        y = np.exp(np.multiply.outer(x - (1.0 + self.z * self.sigma), self.lambdas))
        n_a, n_b = float(self.state[0]), float(x.size)
        for mean_at, m2_at, batch in ((slice(1, 2), slice(2, 3), x[:, None]),
                                      (slice(3, 3 + k), slice(3 + k, 3 + 2 * k), y)):
            batch_mean = batch.mean(axis=0)
            _, self.state[mean_at], self.state[m2_at] = merge_moments(
                n_a, self.state[mean_at], self.state[m2_at],
                n_b, batch_mean, ((batch - batch_mean) ** 2).sum(axis=0))
        self.state[0] = n_a + n_b

    def certificate(self) -> Certificate:
        """The certificate on all probes so far."""
        k = self.lambdas.size
        n = self.n
        denom = max(n - 1, 1)
        return _finish(n, float(self.state[1]) if n else math.nan, float(self.state[2]) / denom,
                       self.state[3:3 + k].copy(), self.state[3 + k:] / denom, self.lambdas,
                       self.n_leaves, self.sigma, self.delta, self.z)
