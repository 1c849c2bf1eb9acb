"""The aggregation-bias certificate (Algorithm 1, Theorem 1, Appendix A), sharper valid
variants of it, and violation flags. See ``docs/certificate.md``.

From ``n`` random-path probes ``X_i = mu(L_i) + eta_i`` of a node with ``m`` leaves, leaf means
in ``value_range = [a, b]`` and noise ``eta ~ N(0, sigma^2)``, a certificate is an upper
bound on the aggregation bias ``max_x mu(x) - f(v)`` of Eq. (2). Four methods:

- ``"paper"``: Algorithm 1 exactly as Appendix A writes it (empirical-Bernstein bounds on
  probes truncated to ``[a - z sigma, b + z sigma]``, ``delta`` split over ``|grid|`` + 1
  slices; valid with probability ``1 - delta - 2 n Phibar(z)``). Kept for reproduction.
- ``"betting"``: the same log-sum-exp / deconvolution argument, with the empirical-Bernstein
  steps replaced by the predictable-plug-in betting bounds of Waudby-Smith and Ramdas (2023,
  Thm. 2; anytime-valid) for both the MGF slices and the mean slice. Truncation is paid
  exactly instead of by a range event: clipping changes ``E X`` by at most
  ``sigma (phi(z) - z Phibar(z))`` and ``E e^{lambda X}`` by at most
  ``e^{lambda b} [e^{lambda^2 sigma^2/2} Phibar(z - lambda sigma) - e^{lambda z sigma}
  Phibar(z)]``, both added to the bounds, so the level is ``1 - delta`` with no ``n`` term.
- ``"order"``: an order-statistic bound. For ``c`` in a small grid let ``u = Phi^{-1}(1-c)``;
  each probe lands on the best leaf and has noise above ``sigma u`` with probability at least
  ``c / m``, so ``#{X_i >= mu* + sigma u}`` dominates ``Bin(n, c/m)``; with ``k`` the largest
  count such that ``P(Bin(n, c/m) <= k - 1) <= delta'``, ``mu* <= X_(k) - sigma u`` (``X_(k)``
  the k-th largest probe, read from a 256-bin histogram as the upper edge of its bin), and
  ``+inf`` when no ``k`` exists (``n`` below about ``m ln(1/delta') / c``: the needle fact).
- ``"sharp"`` (default): the union of both (``delta / 4`` to the mean slice, ``delta / 2`` to
  the order grid, ``delta / 4`` to the MGF grid) and the value-range bound ``b``; the upper
  bound on ``mu*`` is the minimum of all of them, minus the shared lower bound on ``f(v)``.

The new methods work in the unit scale ``(X - a) / (b - a)``; everything is a running state
(:func:`sharp_push`), so :class:`RunningCertificate` gives the same bound as :func:`certify`
on the same samples. The betting slices are valid at every ``n`` simultaneously; the
order-statistic slices (and ``"paper"``) hold at each fixed ``n``.

On the paper's grid. Truncation makes the factorisation ``E e^{lambda X} = M_mu M_eta`` of
Step 2 exact only on the range event; for ``lambda sigma > z`` the deconvolution term
``- lambda sigma^2 / 2`` outruns the truncated moment and the paper's bound falls without
limit, below the true bias. Every grid therefore stops at ``lambda = z / sigma``; a user grid
past that point is refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numba
import numpy as np

from canopy.stats import merge_moments, std_lower_bound
from canopy.validation import check_whole

__all__ = [
    "DEFAULT_METHOD",
    "METHODS",
    "Certificate",
    "RunningCertificate",
    "certify",
    "default_lambdas",
    "is_violation",
]

#: The certificate methods: Algorithm 1 as printed (``"paper"``) and the sharper valid bounds
#: (``"betting"``, ``"order"``, ``"sharp"``; ``docs/certificate.md``).
METHODS = ("paper", "betting", "order", "sharp")
DEFAULT_METHOD = "sharp"
DEFAULT_GRID_SIZE = 16
SHARP_GRID_SIZE = 8
ORDER_LEVELS = (0.05, 0.2, 0.5, 0.8, 0.95)
HIST_BINS = 256
BET_CAP = 0.75  # largest bet of the betting slices (Waudby-Smith and Ramdas use 1/2 to 3/4)


def default_lambdas(sigma: float, z: float = 3.0, size: int = DEFAULT_GRID_SIZE) -> np.ndarray:
    """Geometric grid of ``size`` points ending at ``z / sigma`` (1000 when ``sigma == 0``)."""
    top = z / sigma if sigma > 0 else 1000.0
    return np.geomspace(max(top / 400.0, 0.05), top, size)


@dataclass(frozen=True)
class Certificate:
    """A certificate at one node.

    Attributes:
        bound: the certified upper bound on the aggregation bias.
        lam: the minimising lambda of the MGF grid (``nan`` when the method has none).
        mean_lower: the lower confidence bound on the subtree value f(v).
        mean: the mean of the (truncated) probes.
        variance: their sample variance (``n - 1`` denominator).
        n: number of probes.
        bounds: the MGF bound ``U(lambda)`` at every grid point (empty for ``"order"``).
        lambdas: the grid.
        sigma, z: the noise scale and truncation level used.
        method: the method (:data:`METHODS`).
        best_upper: the upper confidence bound on the best leaf value ``mu*``
            (``bound = best_upper - mean_lower``, clipped at 0, for the new methods).
        value_range: the declared range ``(a, b)`` of the leaf means.
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
    method: str = "paper"
    best_upper: float = math.nan
    value_range: tuple[float, float] = (0.0, 1.0)

    def spread_lower(self, delta: float) -> float:
        """One-sided lower confidence bound (level ``delta``) on the within-cell standard
        deviation of the leaf means, noise-deconvolved: ``sqrt(max(s_low^2 - sigma^2, 0))``
        with ``s_low`` the lower bound on the probes' standard deviation.

        Clipping to ``[a - z sigma, b + z sigma]`` is 1-Lipschitz, so it can only shrink the
        variance: a lower bound on the truncated probes' deviation is one on the raw probes'.
        """
        width = self.value_range[1] - self.value_range[0] + 2.0 * self.z * self.sigma
        std_low = float(std_lower_bound(self.variance, self.n, delta, width))
        return math.sqrt(max(std_low * std_low - self.sigma * self.sigma, 0.0))


def is_violation(certificate: Certificate, floor: float, delta: float) -> bool:
    """Violation flag (Section 3.3): the lower confidence bound on the cell's within-cell
    spread exceeds the Lipschitz floor ``L * rho**level``. A Lipschitz cell whose leaf means
    oscillate by at most the floor has standard deviation at most half of it, so a smooth cell
    is flagged with probability at most ``delta``."""
    return certificate.spread_lower(delta) > floor


# ---------------------------------------------------------------------- checks
def check_n_leaves(n_leaves: object) -> int:
    """``n_leaves`` as an int >= 1 (a whole float too), or a ``ValueError``/``TypeError``
    naming it."""
    return check_whole(n_leaves, "n_leaves")


def check_value_range(value_range: object) -> tuple[float, float]:
    """A finite ``(low, high)`` pair with ``low < high``."""
    try:
        low, high = (float(v) for v in value_range)  # type: ignore[union-attr]
    except (TypeError, ValueError):
        raise ValueError(f"value_range must be a (low, high) pair, got {value_range!r}") from None
    if not (math.isfinite(low) and math.isfinite(high) and low < high):
        raise ValueError(f"value_range must be finite with low < high, got {value_range!r}")
    return low, high


def _check_setup(n_leaves: int, sigma: float, delta: float, z: float,
                 lambdas: np.ndarray | None, method: str = "paper",
                 value_range: object = (0.0, 1.0)) -> np.ndarray:
    """Validate the arguments; returns the MGF grid in the caller's units."""
    check_n_leaves(n_leaves)
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if not (math.isfinite(sigma) and sigma >= 0):
        raise ValueError(f"sigma must be finite and >= 0, got {sigma}")
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    if not (math.isfinite(z) and z > 0):
        raise ValueError(f"z must be finite and > 0, got {z}")
    low, high = check_value_range(value_range)
    width = high - low
    if lambdas is not None:
        grid = np.asarray(lambdas, dtype=float)
    elif method == "paper":
        grid = default_lambdas(sigma / width, z) / width
    else:
        grid = sharp_lambdas(sigma / width, z) / width
    if grid.ndim != 1 or grid.size == 0 or not np.all(np.isfinite(grid)) or np.any(grid <= 0):
        raise ValueError("lambdas must be a non-empty 1-D array of finite positive numbers")
    if sigma > 0 and np.any(grid * sigma > z * (1 + 1e-12)):
        raise ValueError(
            f"lambdas above z/sigma = {z / sigma:.4g} make the truncated certificate invalid "
            "(see the module docstring)"
        )
    return grid


def _check_samples(samples: object) -> np.ndarray:
    raw = np.asarray(samples)
    if np.iscomplexobj(raw):
        raise TypeError("samples must be real numbers, got complex values")
    if raw.dtype == object or raw.dtype.kind in "USV":
        raise TypeError(f"samples must be real numbers, got dtype {raw.dtype}")
    x = raw.astype(float).ravel()
    if x.size and not np.all(np.isfinite(x)):
        bad = int(np.flatnonzero(~np.isfinite(x))[0])
        raise ValueError(f"samples[{bad}] = {x[bad]} is not finite")
    return x


def _check_value(value: object) -> float:
    if isinstance(value, (complex, np.complexfloating)):
        raise TypeError(f"probe value {value!r} is complex; probes are real numbers")
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise TypeError(f"probe value {value!r} is not a real number") from None
    if not math.isfinite(number):
        raise ValueError(f"probe value {value!r} is not finite")
    return number


# ---------------------------------------------------------------------- the new methods
def sharp_lambdas(sigma: float, z: float = 3.0, size: int = SHARP_GRID_SIZE) -> np.ndarray:
    """The MGF grid of the new methods in unit scale: ``size`` geometric points from
    ``z / (64 sigma)`` to ``z / sigma`` (to 1000 when ``sigma == 0``)."""
    top = z / sigma if sigma > 0 else 1000.0
    return np.geomspace(top / 64.0, top, size)


def _gauss_tail(x: np.ndarray | float) -> np.ndarray:
    """``Phibar(x) = P(N(0, 1) > x)``."""
    from scipy.special import ndtr

    return ndtr(-np.asarray(x, dtype=float))


def _gauss_quantile(p: np.ndarray) -> np.ndarray:
    from scipy.special import ndtri

    return ndtri(np.asarray(p, dtype=float))


# setup layout (unit scale): scalars, then lambdas[K], mgf corrections[K], levels[C],
# sigma * u of each level[C]
(S_SIGMA, S_Z, S_LOGA_MEAN, S_LOGA_MGF, S_LOGD_ORD, S_MEAN_CORR, S_K, S_C, S_H) = range(9)
N_SETUP = 9
SLICE = 5  # per betting slice: sum x, sum of squared deviations, sum lam, sum lam x, sum v psi


def sharp_setup(sigma: float, delta: float, z: float, method: str,
                lambdas: np.ndarray | None = None) -> np.ndarray:
    """The packed setup array of a new method in unit scale (``sigma`` and ``lambdas``
    already divided by / multiplied with the value range's width)."""
    use_mgf = method in ("betting", "sharp")
    use_order = method in ("order", "sharp")
    grid = (sharp_lambdas(sigma, z) if lambdas is None else np.asarray(lambdas, float)
            ) if use_mgf else np.zeros(0)
    if use_order:
        levels = np.array(ORDER_LEVELS) if sigma > 0 else np.ones(1)
    else:
        levels = np.zeros(0)
    k, c = grid.size, levels.size
    if method == "sharp":
        d_mean, d_mgf, d_ord = delta / 4.0, delta / 4.0 / k, delta / 2.0 / c
    elif method == "betting":
        d_mean = d_mgf = delta / (k + 1.0)
        d_ord = 1.0
    else:
        d_mean = d_ord = delta / (c + 1.0)
        d_mgf = 1.0
    out = np.zeros(N_SETUP + 2 * k + 2 * c)
    tail_z = float(_gauss_tail(z))
    out[S_SIGMA], out[S_Z] = sigma, z
    out[S_LOGA_MEAN], out[S_LOGA_MGF] = math.log(1.0 / d_mean), math.log(1.0 / d_mgf)
    out[S_LOGD_ORD] = math.log(d_ord)
    out[S_MEAN_CORR] = sigma * (math.exp(-0.5 * z * z) / math.sqrt(2 * math.pi) - z * tail_z)
    out[S_K], out[S_C], out[S_H] = k, c, HIST_BINS
    out[N_SETUP:N_SETUP + k] = grid
    ls = grid * sigma
    with np.errstate(over="ignore"):
        corr = np.exp(0.5 * ls * ls - ls * z) * _gauss_tail(z - ls) - tail_z
    out[N_SETUP + k:N_SETUP + 2 * k] = np.maximum(corr, 0.0)
    out[N_SETUP + 2 * k:N_SETUP + 2 * k + c] = levels
    out[N_SETUP + 2 * k + c:] = sigma * _gauss_quantile(1.0 - levels) if sigma > 0 else 0.0
    return out


def sharp_width(setup: np.ndarray) -> int:
    """Length of the running state of a new method: ``[n, mean, m2]``, one betting slice for
    the mean and one per lambda, then the histogram (``H`` bins and an overflow bin)."""
    k, h = int(setup[S_K]), int(setup[S_H])
    return 3 + SLICE * (1 + k) + (h + 1 if setup[S_C] > 0 else 0)


@numba.njit(cache=True)
def _bet_push(state: np.ndarray, o: int, t: float, x: float, log_a: float) -> None:
    """Waudby-Smith and Ramdas' predictable plug-in bet (their Eq. 13-14, CS tuning) on
    ``x`` in [0, 1], the ``t``-th value of the slice at ``state[o:o + 5]``."""
    mu_prev = (0.5 + state[o]) / t
    var_prev = (0.25 + state[o + 1]) / t
    lam = min(math.sqrt(2.0 * log_a / (var_prev * t * math.log(1.0 + t))), BET_CAP)
    v = 4.0 * (x - mu_prev) * (x - mu_prev)
    state[o + 2] += lam
    state[o + 3] += lam * x
    state[o + 4] += v * (-math.log(1.0 - lam) - lam) / 4.0
    state[o] += x
    mu_now = (0.5 + state[o]) / (t + 1.0)
    state[o + 1] += (x - mu_now) * (x - mu_now)


@numba.njit(cache=True)
def _bet_lower(state: np.ndarray, o: int, log_a: float) -> float:
    """The slice's lower confidence bound on the mean (in [0, 1])."""
    if state[o + 2] <= 0.0:
        return 0.0
    return max((state[o + 3] - log_a - state[o + 4]) / state[o + 2], 0.0)


@numba.njit(cache=True)
def sharp_push(state: np.ndarray, x: float, setup: np.ndarray) -> None:
    """Add one probe, already in unit scale, to a new method's running state."""
    sigma, z = setup[S_SIGMA], setup[S_Z]
    k, c, h = int(setup[S_K]), int(setup[S_C]), int(setup[S_H])
    bottom, top = -z * sigma, 1.0 + z * sigma
    width = top - bottom
    xc = min(max(x, bottom), top)
    state[0] += 1.0
    t = state[0]
    d = xc - state[1]
    state[1] += d / t
    state[2] += d * (xc - state[1])
    _bet_push(state, 3, t, (xc - bottom) / width, setup[S_LOGA_MEAN])
    for i in range(k):
        lam = setup[N_SETUP + i]
        _bet_push(state, 3 + SLICE * (1 + i), t, 1.0 - math.exp(lam * (xc - top)),
                  setup[S_LOGA_MGF])
    if c > 0:
        hist = 3 + SLICE * (1 + k)
        if x > top:
            j = h
        else:
            j = min(max(int((xc - bottom) / width * h), 0), h - 1)
        state[hist + j] += 1.0


@numba.njit(cache=True)
def binomial_rank(n: float, p: float, log_delta: float) -> int:
    """The largest ``k`` with ``P(Bin(n, p) <= k - 1) <= delta`` (0 when none)."""
    if p >= 1.0:
        return int(n)
    if p <= 0.0:
        return 0
    log_pmf = n * math.log1p(-p)
    log_cdf = log_pmf
    if log_cdf > log_delta:
        return 0
    step = math.log(p) - math.log1p(-p)
    j = 0
    while j < n:
        log_pmf += math.log(n - j) - math.log(j + 1.0) + step
        j += 1
        hi = max(log_cdf, log_pmf)
        log_cdf = hi + math.log(math.exp(log_cdf - hi) + math.exp(log_pmf - hi))
        if log_cdf > log_delta:
            return j
    return int(n)


@numba.njit(cache=True)
def _sharp_mean_lower(state: np.ndarray, setup: np.ndarray) -> float:
    """The lower bound on ``f(v)`` in unit scale from a state of at least two probes."""
    sigma, z = setup[S_SIGMA], setup[S_Z]
    bottom, top = -z * sigma, 1.0 + z * sigma
    return max(bottom + (top - bottom) * _bet_lower(state, 3, setup[S_LOGA_MEAN])
               - setup[S_MEAN_CORR], 0.0)


@numba.njit(cache=True)
def _sharp_mgf_bound(state: np.ndarray, setup: np.ndarray, log_m: float, i: int) -> float:
    """The upper bound on ``mu*`` at the ``i``-th lambda (``inf`` where the betting bound on
    the transformed mean leaves no room)."""
    sigma, z = setup[S_SIGMA], setup[S_Z]
    k = int(setup[S_K])
    top = 1.0 + z * sigma
    lam = setup[N_SETUP + i]
    g = max(1.0 - _bet_lower(state, 3 + SLICE * (1 + i), setup[S_LOGA_MGF]), 0.0) + setup[
        N_SETUP + k + i]
    if g <= 0.0:
        return np.inf
    return (log_m + lam * top + math.log(g) - 0.5 * lam * lam * sigma * sigma) / lam


@numba.njit(cache=True)
def _sharp_order_bound(state: np.ndarray, setup: np.ndarray, m: float, i: int) -> float:
    """The upper bound on ``mu*`` at the ``i``-th order level, from the histogram's upper
    order statistic (``inf`` where too few probes rank); ``m``: the leaves below."""
    sigma, z = setup[S_SIGMA], setup[S_Z]
    k, c, h = int(setup[S_K]), int(setup[S_C]), int(setup[S_H])
    bottom, top = -z * sigma, 1.0 + z * sigma
    width = top - bottom
    hist = 3 + SLICE * (1 + k)
    level = setup[N_SETUP + 2 * k + i]
    rank = binomial_rank(state[0], level / m, setup[S_LOGD_ORD])
    if rank < 1:
        return np.inf
    seen = 0.0
    for j in range(h, -1, -1):
        seen += state[hist + j]
        if seen >= rank:
            if j < h:
                return bottom + (j + 1.0) * width / h - setup[N_SETUP + 2 * k + c + i]
            return np.inf
    return np.inf


@numba.njit(cache=True)
def sharp_curve(state: np.ndarray, setup: np.ndarray, log_m: float
                ) -> tuple[np.ndarray, np.ndarray, float]:
    """Upper bounds on ``mu*`` per lambda and per order level, and the lower bound on
    ``f(v)``, all in unit scale, from a running state (``inf``/0 below two probes)."""
    k, c = int(setup[S_K]), int(setup[S_C])
    mgf = np.full(k, np.inf)
    order = np.full(c, np.inf)
    if state[0] < 2.0:
        return mgf, order, 0.0
    for i in range(k):
        mgf[i] = _sharp_mgf_bound(state, setup, log_m, i)
    m = math.exp(log_m)
    for i in range(c):
        order[i] = _sharp_order_bound(state, setup, m, i)
    return mgf, order, _sharp_mean_lower(state, setup)


@numba.njit(cache=True)
def sharp_bounds(state: np.ndarray, setup: np.ndarray, log_m: float) -> tuple[float, float]:
    """``(upper bound on mu*, lower bound on f(v))`` in unit scale: the minimum over the
    method's bounds and the value range's top 1; the value range ``(1, 0)`` below two
    probes. Allocates nothing, so the explored tree's
    kernels (compiled without numba's reference counting) may call it."""
    if state[0] < 2.0:
        return 1.0, 0.0
    upper = 1.0
    for i in range(int(setup[S_K])):
        upper = min(upper, _sharp_mgf_bound(state, setup, log_m, i))
    m = math.exp(log_m)
    for i in range(int(setup[S_C])):
        upper = min(upper, _sharp_order_bound(state, setup, m, i))
    return upper, _sharp_mean_lower(state, setup)


@numba.njit(cache=True)
def sharp_bound(state: np.ndarray, setup: np.ndarray, log_m: float) -> float:
    """The certified bias bound in unit scale (``inf`` below two probes)."""
    if state[0] < 2.0:
        return np.inf
    upper, mean_lower = sharp_bounds(state, setup, log_m)
    return max(upper - mean_lower, 0.0)


@numba.njit(cache=True)
def sharp_batch(samples: np.ndarray, setup: np.ndarray, log_m: float,
                width: int) -> np.ndarray:
    """The bias bound of every row of ``samples`` (one cell's probes per row, unit scale)."""
    out = np.empty(samples.shape[0])
    state = np.zeros(width)
    for r in range(samples.shape[0]):
        state[:] = 0.0
        for i in range(samples.shape[1]):
            sharp_push(state, samples[r, i], setup)
        out[r] = sharp_bound(state, setup, log_m)
    return out


class _Scale:
    """The affine map of a value range onto the unit scale."""

    def __init__(self, value_range: tuple[float, float]) -> None:
        self.low, self.high = value_range
        self.width = self.high - self.low

    def to_unit(self, x: np.ndarray) -> np.ndarray:
        return (x - self.low) / self.width


def certify(samples: np.ndarray, n_leaves: int, sigma: float, *, delta: float = 0.05,
            method: str = DEFAULT_METHOD, lambdas: np.ndarray | None = None, z: float = 3.0,
            value_range: tuple[float, float] = (0.0, 1.0)) -> Certificate:
    """The certificate of one node with ``n_leaves`` leaves from a batch of its probes.

    ``method="paper"`` is Algorithm 1 exactly; the default ``"sharp"`` is the sharpest valid
    method (module docstring). ``value_range`` is the range ``(a, b)`` of the leaf means (the
    paper's ``[0, 1]`` by default). An empty batch, complex values or a non-finite
    ``n_leaves`` are refused."""
    grid = _check_setup(n_leaves, sigma, delta, z, lambdas, method, value_range)
    x = _check_samples(samples)
    if x.size == 0:
        raise ValueError("samples is empty: a certificate needs at least one probe")
    running = RunningCertificate(n_leaves, sigma, delta=delta, method=method, lambdas=grid,
                                 z=z, value_range=value_range)
    if method == "paper":
        return running._paper_batch(x)
    running.update_many(x)
    return running.certificate()


@numba.njit(cache=True)
def _bound_terms(n: int, mean_x: float, var_x: float, k: int, sigma: float, delta: float,
                 z: float) -> tuple[float, float, float]:
    """The grid-wide terms of the bound for ``n >= 2`` probes: ``log((k + 1) / delta)``, the
    truncation's top ``x_max`` and ``mean - eps_n``."""
    log_term = math.log((k + 1) / delta)
    x_max = 1.0 + z * sigma
    x_range = 1.0 + 2.0 * z * sigma
    eps = math.sqrt(2.0 * max(var_x, 0.0) * log_term / n) + 7.0 * x_range * log_term / (
        3.0 * (n - 1))
    return log_term, x_max, mean_x - eps


@numba.njit(cache=True)
def _grid_bound(lam: float, mean_y: float, var_y: float, n: int, log_term: float,
                x_max: float, mean_lower: float, log_m: float, sigma: float) -> float:
    """``U(lambda)`` at one grid point from the moments of ``exp(lambda (X - X_max))``."""
    # G_up / exp(lam * x_max): the shifted variable lies in [0, 1], so its range is 1.
    g_shifted = (mean_y + math.sqrt(2.0 * max(var_y, 0.0) * log_term / n)
                 + 7.0 * log_term / (3.0 * (n - 1)))
    log_g = lam * x_max + math.log(g_shifted)
    return (log_m + log_g - 0.5 * lam * lam * sigma * sigma) / lam - mean_lower


@numba.njit(cache=True)
def bound_curve(n: int, mean_x: float, var_x: float, mean_y: np.ndarray, var_y: np.ndarray,
                lambdas: np.ndarray, log_m: float, sigma: float, delta: float,
                z: float) -> tuple[np.ndarray, float]:
    """``U(lambda)`` over the grid and ``mean - eps_n`` from moments of the truncated probes
    (``mean_y``/``var_y`` are moments of ``exp(lambda (X - X_max))``). ``inf`` for n < 2."""
    k = lambdas.size
    out = np.full(k, np.inf)
    if n < 2:
        return out, -np.inf
    log_term, x_max, mean_lower = _bound_terms(n, mean_x, var_x, k, sigma, delta, z)
    for i in range(k):
        out[i] = _grid_bound(lambdas[i], mean_y[i], var_y[i], n, log_term, x_max, mean_lower,
                             log_m, sigma)
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
    """The certificate's bound (min over the grid) from a packed running state. Allocates
    nothing, so the explored tree's kernels (compiled without numba's reference counting) may
    call it."""
    k = lambdas.size
    n = int(state[0])
    if n < 2:
        return np.inf
    denom = n - 1.0
    log_term, x_max, mean_lower = _bound_terms(n, state[1], state[2] / denom, k, sigma, delta,
                                               z)
    best = np.inf
    for i in range(k):
        best = min(best, _grid_bound(lambdas[i], state[3 + i], state[3 + k + i] / denom, n,
                                     log_term, x_max, mean_lower, log_m, sigma))
    return best


class RunningCertificate:
    """Incremental certificate at one node: a running state updated one probe (or one
    batch) at a time, giving the same bound as :func:`certify` on the same samples.
    ``method="paper"`` keeps O(``|grid|``) running moments (Algorithm 1); the new methods keep
    one betting slice per grid point and a 256-bin histogram."""

    def __init__(self, n_leaves: int, sigma: float, *, delta: float = 0.05,
                 method: str = DEFAULT_METHOD, lambdas: np.ndarray | None = None,
                 z: float = 3.0, value_range: tuple[float, float] = (0.0, 1.0)) -> None:
        grid = _check_setup(n_leaves, sigma, delta, z, lambdas, method, value_range)
        self.n_leaves, self.sigma, self.delta, self.z = check_n_leaves(n_leaves), float(sigma), \
            delta, z
        self.method = method
        self.value_range = check_value_range(value_range)
        self._scale = _Scale(self.value_range)
        self._unit_sigma = self.sigma / self._scale.width
        self.lambdas = grid
        if method == "paper":
            self._unit_lambdas = grid * self._scale.width
            self.state = np.zeros(3 + 2 * grid.size)
        else:
            self.setup = sharp_setup(self._unit_sigma, delta, z, method,
                                     grid * self._scale.width)
            self.state = np.zeros(sharp_width(self.setup))

    @property
    def n(self) -> int:
        return int(self.state[0])

    def update(self, value: float) -> None:
        """Add one probe."""
        number = self._scale.to_unit(_check_value(value))
        if self.method == "paper":
            welford_push(self.state, number, self._unit_lambdas, self._unit_sigma, self.z)
        else:
            sharp_push(self.state, number, self.setup)

    def update_many(self, values: np.ndarray) -> None:
        """Add a batch of probes."""
        x = self._scale.to_unit(_check_samples(values))
        if x.size == 0:
            return
        if self.method != "paper":
            _push_all(self.state, x, self.setup)
            return
        x = np.clip(x, -self.z * self._unit_sigma, 1.0 + self.z * self._unit_sigma)
        k = self.lambdas.size
        y = np.exp(np.multiply.outer(x - (1.0 + self.z * self._unit_sigma), self._unit_lambdas))
        n_a, n_b = float(self.state[0]), float(x.size)
        for mean_at, m2_at, batch in ((slice(1, 2), slice(2, 3), x[:, None]),
                                      (slice(3, 3 + k), slice(3 + k, 3 + 2 * k), y)):
            batch_mean = batch.mean(axis=0)
            _, self.state[mean_at], self.state[m2_at] = merge_moments(
                n_a, self.state[mean_at], self.state[m2_at],
                n_b, batch_mean, ((batch - batch_mean) ** 2).sum(axis=0))
        self.state[0] = n_a + n_b

    def _paper_batch(self, x: np.ndarray) -> Certificate:
        """Algorithm 1 on a batch (moments computed in one pass, as before)."""
        u = np.clip(self._scale.to_unit(x), -self.z * self._unit_sigma,
                    1.0 + self.z * self._unit_sigma)
        n, grid = u.size, self._unit_lambdas
        y = np.exp(np.multiply.outer(u - (1.0 + self.z * self._unit_sigma), grid))
        var_x = float(u.var(ddof=1)) if n > 1 else 0.0
        var_y = y.var(axis=0, ddof=1) if n > 1 else np.zeros(grid.size)
        return self._paper_finish(n, float(u.mean()), var_x, y.mean(axis=0), var_y)

    def _paper_finish(self, n: int, mean_x: float, var_x: float, mean_y: np.ndarray,
                      var_y: np.ndarray) -> Certificate:
        bounds, mean_lower = bound_curve(n, mean_x, var_x, mean_y, var_y, self._unit_lambdas,
                                         math.log(self.n_leaves), self._unit_sigma, self.delta,
                                         self.z)
        best = int(np.argmin(bounds))
        w, low = self._scale.width, self._scale.low
        return Certificate(bound=float(bounds[best]) * w, lam=float(self.lambdas[best]),
                           mean_lower=float(mean_lower) * w + low, mean=float(mean_x) * w + low,
                           variance=float(var_x) * w * w, n=int(n), bounds=bounds * w,
                           lambdas=self.lambdas, sigma=self.sigma, z=float(self.z),
                           method="paper",
                           best_upper=(float(bounds[best] + mean_lower) * w + low if n >= 2
                                       else math.inf),
                           value_range=self.value_range)

    def certificate(self) -> Certificate:
        """The certificate on all probes so far."""
        n = self.n
        denom = max(n - 1, 1)
        mean_x = float(self.state[1]) if n else math.nan
        if self.method == "paper":
            k = self.lambdas.size
            return self._paper_finish(n, mean_x, float(self.state[2]) / denom,
                                      self.state[3:3 + k].copy(), self.state[3 + k:] / denom)
        log_m = math.log(self.n_leaves)
        mgf, order, mean_lower = sharp_curve(self.state, self.setup, log_m)
        upper = min(1.0, float(mgf.min(initial=np.inf)), float(order.min(initial=np.inf)))
        w, low = self._scale.width, self._scale.low
        bound = max(upper - mean_lower, 0.0) * w if n >= 2 else math.inf
        best = int(np.argmin(mgf)) if mgf.size else -1
        return Certificate(bound=bound, lam=float(self.lambdas[best]) if best >= 0 else math.nan,
                           mean_lower=mean_lower * w + low if n >= 2 else -math.inf,
                           mean=mean_x * w + low, variance=float(self.state[2]) / denom * w * w,
                           n=n, bounds=(mgf - mean_lower) * w,
                           lambdas=self.lambdas if mgf.size else np.zeros(0),
                           sigma=self.sigma, z=float(self.z), method=self.method,
                           best_upper=upper * w + low if n >= 2 else math.inf,
                           value_range=self.value_range)


@numba.njit(cache=True)
def _push_all(state: np.ndarray, x: np.ndarray, setup: np.ndarray) -> None:
    for i in range(x.size):
        sharp_push(state, x[i], setup)
