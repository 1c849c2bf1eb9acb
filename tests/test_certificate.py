"""Certificate coverage (Theorem 1) by Monte Carlo, batch/incremental agreement, and flags."""

import zlib

import numpy as np
import pytest

from canopy import RunningCertificate, certify, is_violation
from canopy.certificate import METHODS, default_lambdas
from canopy.experiments.studies.certwidth import cell_means, method_bounds

SIGMA = 0.1
DELTA = 0.05


def cell_family(name: str, m: int, rng: np.random.Generator) -> np.ndarray:
    if name == "flat":
        return np.full(m, 0.5)
    if name == "one_spike":
        means = np.full(m, 0.3)
        means[rng.integers(m)] = 0.95
        return means
    if name == "two_point":
        return np.where(np.arange(m) < m // 2, 0.2, 0.8)
    if name == "uniform":
        return rng.uniform(0, 1, m)
    raise ValueError(name)


@pytest.mark.parametrize("family", ["flat", "one_spike", "two_point", "uniform"])
@pytest.mark.parametrize("n", [16, 64, 256, 1024, 4096])
def test_bound_covers_true_bias(family, n):
    # seeded from the parameters alone (``hash`` of a str is salted per process)
    rng = np.random.default_rng([n, zlib.crc32(family.encode())])
    m = 64
    trials = 200
    covered = 0
    for _ in range(trials):
        means = cell_family(family, m, rng)
        bias = means.max() - means.mean()
        probes = means[rng.integers(m, size=n)] + SIGMA * rng.standard_normal(n)
        covered += certify(probes, m, SIGMA, delta=DELTA).bound >= bias
    assert covered / trials >= 1 - DELTA


def test_bound_tightens_with_samples_on_a_benign_cell():
    rng = np.random.default_rng(3)
    m = 4
    means = np.array([0.50, 0.52, 0.48, 0.51])
    bounds = [certify(means[rng.integers(m, size=n)] + SIGMA * rng.standard_normal(n), m,
                      SIGMA).bound for n in (64, 1024, 16384)]
    assert bounds[0] > bounds[1] > bounds[2]
    assert bounds[2] < 0.5  # far below the trivial bound 1 - f(v) ~ 0.5 + slack


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("n", [2, 17, 500, 4096])
def test_incremental_equals_batch(n, method):
    rng = np.random.default_rng(n)
    probes = rng.uniform(0, 1, n) + SIGMA * rng.standard_normal(n)
    batch = certify(probes, 256, SIGMA, method=method)
    one_by_one = RunningCertificate(256, SIGMA, method=method)
    for value in probes:
        one_by_one.update(value)
    chunked = RunningCertificate(256, SIGMA, method=method)
    for chunk in np.array_split(probes, 5):
        chunked.update_many(chunk)
    for running in (one_by_one, chunked):
        result = running.certificate()
        assert result.bound == pytest.approx(batch.bound, abs=1e-9, rel=1e-9)
        assert result.mean_lower == pytest.approx(batch.mean_lower, abs=1e-9, rel=1e-9)
        np.testing.assert_allclose(result.bounds, batch.bounds, rtol=1e-9, atol=1e-9)


def test_result_exposes_minimiser_and_mean_lower_bound():
    rng = np.random.default_rng(0)
    probes = 0.5 + SIGMA * rng.standard_normal(1000)
    result = certify(probes, 8, SIGMA, method="paper")
    assert result.bound == result.bounds.min()
    assert result.lam == result.lambdas[np.argmin(result.bounds)]
    assert result.mean_lower < result.mean
    assert certify(probes[:1], 8, SIGMA, method="paper").bound == np.inf
    assert certify(probes[:1], 8, SIGMA).bound == np.inf


def test_flags_no_smooth_cell_but_a_planted_violation():
    rng = np.random.default_rng(11)
    level_floor = 0.05  # L rho^level
    smooth_flags = 0
    trials = 400
    for _ in range(trials):
        means = 0.5 + rng.uniform(-level_floor / 2, level_floor / 2, 16)
        probes = means[rng.integers(16, size=512)] + SIGMA * rng.standard_normal(512)
        smooth_flags += is_violation(certify(probes, 16, SIGMA), level_floor, DELTA)
    assert smooth_flags / trials <= DELTA
    assert smooth_flags == 0
    # Assumption 1: with a margin, detection needs enough probes. Maurer-Pontil's deviation
    # bound costs range * sqrt(2 log(1/delta) / n), so 2,048 probes resolve sd 0.26 vs 0.05.
    planted_hits = 0
    for _ in range(100):
        means = np.full(16, 0.3)
        means[:4] = 0.9  # spread sd ~0.26, far above the floor
        probes = means[rng.integers(16, size=2048)] + SIGMA * rng.standard_normal(2048)
        planted_hits += is_violation(certify(probes, 16, SIGMA), level_floor, DELTA)
    assert planted_hits >= 95


@pytest.mark.parametrize("kwargs, message", [
    ({"n_leaves": 0}, "n_leaves"),
    ({"sigma": -1.0}, "sigma"),
    ({"delta": 1.5}, "delta"),
    ({"lambdas": [1.0, -2.0]}, "lambdas"),
    ({"lambdas": [1000.0]}, "z/sigma"),
])
def test_bad_setup_is_refused(kwargs, message):
    args = {"n_leaves": 4, "sigma": SIGMA, **kwargs}
    with pytest.raises(ValueError, match=message):
        certify(np.ones(10) * 0.5, args.pop("n_leaves"), args.pop("sigma"), **args)


def test_non_finite_samples_are_refused_and_state_kept():
    with pytest.raises(ValueError, match="not finite"):
        certify(np.array([0.1, np.nan]), 4, SIGMA)
    running = RunningCertificate(4, SIGMA)
    running.update(0.4)
    with pytest.raises(ValueError, match="not finite"):
        running.update(float("inf"))
    assert running.n == 1


def test_default_grid_stops_at_z_over_sigma():
    grid = default_lambdas(0.2, z=3.0)
    assert grid.max() == pytest.approx(15.0)
    assert np.all(np.diff(grid) > 0)


# ---------------------------------------------------------------- the new methods (issue 11)
MC_TRIALS = 400
COVERAGE_CELLS = [(4, 256), (64, 64), (256, 1024)]  # (m, n): below and above the needle count


def _mc_bounds(method, shape, m, n, trials, seed):
    rng = np.random.default_rng([seed, m, n, len(shape)])
    means = cell_means(shape, m, trials, rng)
    probes = (np.take_along_axis(means, rng.integers(m, size=(trials, n)), axis=1)
              + SIGMA * rng.standard_normal((trials, n)))
    bias = means.max(axis=1) - means.mean(axis=1)
    return method_bounds(method, probes, m, SIGMA, DELTA), bias


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("shape", ["flat", "lipschitz", "one-spike", "two-point", "uniform"])
@pytest.mark.parametrize("m, n", COVERAGE_CELLS)
def test_every_method_covers_at_level_delta(method, shape, m, n):
    bounds, bias = _mc_bounds(method, shape, m, n, MC_TRIALS, seed=1)
    assert np.mean(bounds >= bias) >= 1 - DELTA


def test_one_spike_missed_by_the_probes_is_still_covered():
    """The needle: with n = m probes the spike is missed with probability (1 - 1/m)^n ~ 1/e,
    and the bound must still cover it (it falls back on the value range)."""
    m = n = 256
    rng = np.random.default_rng(5)
    means = cell_means("one-spike", m, MC_TRIALS, rng)
    picks = rng.integers(m, size=(MC_TRIALS, n))
    probes = np.take_along_axis(means, picks, axis=1) + SIGMA * rng.standard_normal(picks.shape)
    missed = ~np.any(np.take_along_axis(means, picks, axis=1) > 0.5, axis=1)
    assert missed.mean() > 0.3
    bounds = method_bounds("sharp", probes, m, SIGMA, DELTA)
    assert np.all(bounds[missed] >= 0.95 - means[missed].mean(axis=1))


@pytest.mark.parametrize("shape", ["flat", "lipschitz"])
@pytest.mark.parametrize("m", [4, 16])
@pytest.mark.parametrize("n", [256, 1024])
def test_default_is_at_most_half_of_the_paper_on_narrow_benign_cells(shape, m, n):
    default, bias = _mc_bounds("sharp", shape, m, n, 200, seed=2)
    paper, _ = _mc_bounds("paper", shape, m, n, 200, seed=2)
    assert np.median(default) <= 0.5 * np.median(paper)
    assert np.mean(default >= bias) >= 1 - DELTA


@pytest.mark.parametrize("method", METHODS)
def test_value_range_rescales_the_bound(method):
    rng = np.random.default_rng(4)
    unit = rng.uniform(0, 1, 16)[rng.integers(16, size=600)] + SIGMA * rng.standard_normal(600)
    low, width = -3.0, 20.0
    base = certify(unit, 16, SIGMA, method=method)
    scaled = certify(low + width * unit, 16, SIGMA * width, method=method,
                     value_range=(low, low + width))
    assert scaled.bound == pytest.approx(width * base.bound, rel=1e-9)
    assert scaled.mean_lower == pytest.approx(low + width * base.mean_lower, rel=1e-9)


def test_sharp_bound_is_the_best_upper_minus_the_mean_lower_bound():
    rng = np.random.default_rng(8)
    probes = 0.4 + SIGMA * rng.standard_normal(2000)
    result = certify(probes, 8, SIGMA)
    assert result.method == "sharp"
    assert result.bound == pytest.approx(max(result.best_upper - result.mean_lower, 0.0))
    assert result.mean_lower < 0.4 < result.best_upper <= 1.0


@pytest.mark.parametrize("samples, error, message", [
    ([], ValueError, "empty"),
    (np.array([0.1, 0.2j]), TypeError, "complex"),
    (["a", "b"], TypeError, "real"),
])
def test_bad_samples_are_refused(samples, error, message):
    with pytest.raises(error, match=message):
        certify(samples, 4, SIGMA)


@pytest.mark.parametrize("n_leaves", [float("inf"), float("nan"), 2.5, -1])
def test_bad_n_leaves_is_named(n_leaves):
    with pytest.raises(ValueError, match="n_leaves"):
        certify(np.full(10, 0.5), n_leaves, SIGMA)
    with pytest.raises(ValueError, match="n_leaves"):
        RunningCertificate(n_leaves, SIGMA)


@pytest.mark.parametrize("kwargs, message", [
    ({"method": "magic"}, "method"),
    ({"value_range": (1.0, 0.0)}, "value_range"),
    ({"value_range": (0.0, float("inf"))}, "value_range"),
])
def test_bad_method_or_range_is_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        certify(np.full(10, 0.5), 4, SIGMA, **kwargs)


def test_running_certificate_refuses_complex_probe_and_keeps_state():
    running = RunningCertificate(4, SIGMA)
    running.update(0.3)
    with pytest.raises(TypeError, match="complex"):
        running.update(0.3 + 1j)
    assert running.n == 1
