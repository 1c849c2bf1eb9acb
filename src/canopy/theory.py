"""Checks of the paper's theorems: their algebra symbolically (sympy) and their elementary
inequalities on random exact instances (:class:`fractions.Fraction`).

What is checked, per theorem of the paper:

- Theorem 1 (certificate, Eq. 7 and Appendix proof): the log-sum-exp chain (Step 1), the
  Gaussian MGF used to deconvolve the noise (Step 2), the pairwise form of the sample variance
  in the empirical-Bernstein bound (Step 3), the ``|Lambda| + 1`` confidence split, and the
  light-tail optimum ``sigma_w sqrt(2 log m)`` with its minimality.
- Theorem 2 (fixed-budget error): the budget split that equalises the exponents, its
  optimality, the union bound, and ``|V| < 2N`` for a complete tree.
- Theorem 3 (regret): the dispersion count (at most ``K`` jump cells a level, ``K D`` in all)
  and the jump sum ``sum_v log n / Delta_v <= K D log n / Delta_min``.

What is not checked (cited, as in the paper): the concentration results themselves (empirical
Bernstein, Maurer and Pontil 2009), the successive-rejects and fixed-budget guarantees
(Audibert et al. 2010, Kaufmann et al. 2016, Carpentier and Locatelli 2016), the HOO regret
analysis (Bubeck et al. 2011), and the constants ``kappa``, ``C_1``, ``C_2``.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction

__all__ = ["NOT_CHECKED", "TheoremCheck", "check_all"]

NOT_CHECKED = (
    "the cited concentration results (empirical Bernstein, Maurer and Pontil 2009; Gaussian "
    "tails), the successive-rejects and fixed-budget identification guarantees and lower "
    "bound (Audibert et al. 2010; Kaufmann et al. 2016; Carpentier and Locatelli 2016), the "
    "HOO regret analysis (Bubeck et al. 2011), and the unspecified constants kappa, C_1, C_2"
)


@dataclass
class TheoremCheck:
    """One theorem: its symbolic identities (description -> verified) and random instances."""

    theorem: str
    symbolic: dict[str, bool] = field(default_factory=dict)
    checked: list[str] = field(default_factory=list)
    instances: int = 0
    failures: int = 0

    @property
    def ok(self) -> bool:
        return self.failures == 0 and all(self.symbolic.values())

    def as_dict(self) -> dict[str, object]:
        return {"theorem": self.theorem, "symbolic": self.symbolic, "checked": self.checked,
                "instances": self.instances, "failures": self.failures, "ok": self.ok}


def _frac(rng: random.Random, low: int = 1, high: int = 1000) -> Fraction:
    return Fraction(rng.randint(low, high), rng.randint(1, high))


def _is_zero(expr: object) -> bool:
    import sympy

    return sympy.simplify(expr) == 0


# ---- Theorem 1 ------------------------------------------------------------------------------

def _theorem1_symbolic() -> dict[str, bool]:
    import sympy as sp

    lam, sigma, sw, x = sp.symbols("lambda sigma sigma_w x", positive=True)
    m = sp.Symbol("m", integer=True, positive=True)
    mus = sp.symbols("mu1:5", real=True)
    total = sum(sp.exp(lam * mu) for mu in mus)
    chain = sp.expand_log(sp.log(m * (total / m)), force=True) - sp.log(total)
    density = sp.exp(-x**2 / (2 * sigma**2)) / sp.sqrt(2 * sp.pi * sigma**2)
    mgf = sp.integrate(sp.exp(lam * x) * density, (x, -sp.oo, sp.oo), conds="none")
    ys = sp.symbols("y1:6", real=True)
    n = len(ys)
    mean = sum(ys) / n
    pairwise = sum((ys[i] - ys[j])**2 for i in range(n) for j in range(i + 1, n)) / (n * (n - 1))
    unbiased = sum((y - mean)**2 for y in ys) / (n - 1)
    grid = sp.Symbol("Lambda", integer=True, positive=True)
    delta = sp.Symbol("delta", positive=True)
    log_m = sp.Symbol("ell", positive=True)  # log m > 0 for m >= 2
    bound = log_m / lam + lam * sw**2 / 2    # sub-Gaussian leaf mixture, after deconvolution
    stationary = sp.solve(sp.diff(bound, lam), lam)
    optimum = sp.sqrt(2 * log_m) / sw
    return {
        "Step 1: (1/lambda)[log m + log((1/m) sum e^(lambda mu))] = (1/lambda) log sum "
        "e^(lambda mu)": _is_zero(chain),
        "Step 2: E e^(lambda eta) = e^(lambda^2 sigma^2 / 2) for eta ~ N(0, sigma^2)":
            _is_zero(mgf - sp.exp(lam**2 * sigma**2 / 2)),
        "Step 3: pairwise V_n = unbiased sample variance (n = 5)": _is_zero(pairwise - unbiased),
        "confidence split: (|Lambda| + 1) slices of delta / (|Lambda| + 1) sum to delta":
            _is_zero((grid + 1) * (delta / (grid + 1)) - delta),
        "light tail: the only stationary lambda is sqrt(2 log m) / sigma_w":
            len(stationary) == 1 and _is_zero(stationary[0] - optimum),
        "light tail: the bound there is sigma_w sqrt(2 log m)":
            _is_zero(bound.subs(lam, optimum) - sw * sp.sqrt(2 * log_m)),
        "light tail: minimal (second derivative 2 log m / lambda^3 > 0)":
            bool(sp.simplify(sp.diff(bound, lam, 2)).is_positive),
        "light tail: bound - optimum = (lambda sigma_w - sqrt(2 log m))^2 / (2 lambda)":
            _is_zero(bound - sw * sp.sqrt(2 * log_m)
                     - (lam * sw - sp.sqrt(2 * log_m))**2 / (2 * lam)),
    }


def _theorem1_instance(rng: random.Random) -> bool:
    m = rng.randint(1, 12)
    # a_i = e^(lambda mu_i) > 0: max <= sum = m * mean (Step 1, exponentiated)
    a = [_frac(rng) for _ in range(m)]
    if not max(a) <= sum(a) == m * (sum(a) / m):
        return False
    ys = [Fraction(rng.randint(-1000, 1000), rng.randint(1, 50)) for _ in range(rng.randint(2, 9))]
    n, mean = len(ys), sum(ys) / len(ys)
    pairwise = sum((ys[i] - ys[j])**2 for i in range(n) for j in range(i + 1, n)) / (n * (n - 1))
    if pairwise != sum((y - mean)**2 for y in ys) / (n - 1):
        return False
    # light tail: for every lambda > 0, log m / lambda + lambda sw^2 / 2 >= sw sqrt(2 log m);
    # both sides are positive, so compare squares exactly (ell stands for log m > 0).
    ell, sw, lam = _frac(rng), _frac(rng), _frac(rng)
    return (ell / lam + lam * sw**2 / 2)**2 >= 2 * ell * sw**2


# ---- Theorem 2 ------------------------------------------------------------------------------

def _theorem2_symbolic() -> dict[str, bool]:
    import sympy as sp

    budget, c0, cert, kappa, share = sp.symbols("B c_0 S kappa s", positive=True)
    hardness = c0 + cert  # H_edge = c_0 + sum_k c_l h_k
    b_smooth, b_cert = budget * c0 / hardness, budget * cert / hardness
    delta, v, k = sp.symbols("delta_det V K", positive=True)
    tail = sp.exp(-kappa * budget / hardness)
    b, depth = sp.symbols("b D", integer=True, positive=True)
    i = sp.Symbol("i", integer=True, nonnegative=True)
    nodes = sp.summation(b**i, (i, 0, depth))
    return {
        "budget split: B_smooth + B_cert = B": _is_zero(b_smooth + b_cert - budget),
        "budget split: B_smooth / c_0 = B_cert / sum_k c_l h_k = B / H_edge":
            _is_zero(b_smooth / c0 - budget / hardness)
            and _is_zero(b_cert / cert - budget / hardness),
        "budget split: moving a share s from one phase lowers the smaller exponent":
            _is_zero(sp.Min((b_smooth - share) / c0, (b_cert + share) / cert)
                     - (b_smooth - share) / c0),
        "union bound: delta + V e + K e = delta + (V + K) e, e = exp(-kappa B / H)":
            _is_zero(delta + v * tail + k * tail - (delta + (v + k) * tail)),
        "complete b-ary tree of depth D: nodes = (b^(D+1) - 1)/(b - 1)":
            _is_zero(sp.simplify(nodes.rewrite(sp.Piecewise).subs(b, b + 2))
                     - ((b + 2)**(depth + 1) - 1) / (b + 1)),
    }


def _theorem2_instance(rng: random.Random) -> bool:
    c0, cert, budget = _frac(rng), _frac(rng), _frac(rng, 1, 10**6)
    hardness = c0 + cert
    split = budget * Fraction(rng.randint(0, 1000), 1000)  # any split of the budget
    if not min(split / c0, (budget - split) / cert) <= budget / hardness:
        return False
    if budget * c0 / hardness / c0 != budget / hardness:
        return False
    # union bound on a finite probability space of equally likely outcomes
    size = rng.randint(1, 60)
    events = [{w for w in range(size) if rng.random() < rng.random()} for _ in range(3)]
    if not len(set().union(*events)) <= sum(len(e) for e in events):
        return False
    b, depth = rng.randint(2, 9), rng.randint(0, 7)
    leaves = b**depth
    return sum(b**i for i in range(depth + 1)) < 2 * leaves


# ---- Theorem 3 ------------------------------------------------------------------------------

def _theorem3_symbolic() -> dict[str, bool]:
    import sympy as sp

    gap, n, c = sp.symbols("Delta n c", positive=True)
    pulls = c * sp.log(n) / gap**2
    d = sp.Symbol("d", nonnegative=True)
    return {
        "jump cell: (c log n / Delta^2) pulls x Delta regret = c log n / Delta":
            _is_zero(pulls * gap - c * sp.log(n) / gap),
        "jump term is dominated: log n / n^((d+1)/(d+2)) -> 0":
            all(sp.limit(sp.log(n) / n**sp.Rational(k + 1, k + 2), n, sp.oo) == 0
                for k in range(4)) and bool(sp.simplify(1 - (d + 1) / (d + 2)).is_positive),
    }


def _theorem3_instance(rng: random.Random) -> bool:
    b, depth = rng.randint(2, 5), rng.randint(1, 6)
    n_leaves = b**depth
    k = rng.randint(0, 6)
    boundary = {rng.randrange(n_leaves) for _ in range(k)}  # leaves next to a discontinuity
    jump_cells = 0
    for level in range(1, depth + 1):  # the cell of leaf x at `level` is x // b^(depth-level)
        cells = {x // b**(depth - level) for x in boundary}
        if len(cells) > k:
            return False
        jump_cells += len(cells)
    if jump_cells > k * depth:
        return False
    gaps = [Fraction(rng.randint(1, 1000), 1000) for _ in range(jump_cells)]
    if not gaps:
        return True
    return sum(1 / g for g in gaps) <= k * depth / min(gaps)


CHECKS: dict[str, tuple[str, Callable[[], dict[str, bool]], Callable[[random.Random], bool],
                        list[str]]] = {
    "theorem1": ("Theorem 1 (aggregation-bias certificate)", _theorem1_symbolic,
                 _theorem1_instance,
                 ["max a_i <= sum a_i = m mean a_i for a_i = e^(lambda mu_i) > 0",
                  "pairwise sample variance = unbiased sample variance",
                  "log m / lambda + lambda sigma_w^2 / 2 >= sigma_w sqrt(2 log m) (squared)"]),
    "theorem2": ("Theorem 2 (fixed-budget error)", _theorem2_symbolic, _theorem2_instance,
                 ["min(B_s / c_0, (B - B_s) / S) <= B / (c_0 + S) for every split B_s",
                  "P(A u B u C) <= P(A) + P(B) + P(C) on a finite uniform space",
                  "a complete b-ary tree with N leaves has fewer than 2N nodes"]),
    "theorem3": ("Theorem 3 (regret with K discontinuities)", _theorem3_symbolic,
                 _theorem3_instance,
                 ["at most K jump cells a level and K D in all (random trees, boundaries)",
                  "sum over jump cells of 1 / Delta_v <= K D / Delta_min"]),
}


def check_all(instances: int = 20_000, seed: int = 0) -> list[TheoremCheck]:
    """Run every theorem's symbolic checks and ``instances`` random exact instances in all
    (split evenly across the theorems). Needs sympy (the ``theory`` extra)."""
    if instances < 0:
        raise ValueError(f"instances must be >= 0, got {instances}")
    rng = random.Random(seed)
    results = []
    for index, (label, symbolic, instance, checked) in enumerate(CHECKS.values()):
        share = instances // len(CHECKS) + (index < instances % len(CHECKS))
        result = TheoremCheck(theorem=label, symbolic=symbolic(), checked=list(checked),
                              instances=share)
        result.failures = sum(not instance(rng) for _ in range(share))
        results.append(result)
    return results
