"""Numba kernels of the regional learners: per-(region, model) running moments pushed along
the region's root-to-node chain, estimates that share the parent region's statistics (and,
at the root, the whole pool's), and the UCB and Thompson indices built on them.

Sharing. Walking the chain from the root down, a node's estimate for a model merges its own
moments with the parent's estimate taken as a pseudo-sample of ``w`` observations (Chan's
merge), ``w`` given by the sharing rule (``canopy.sharing.prior_weight``): all of the
parent's until a test shows the node differs (then none), or the fixed back-off weight
``min(kappa, n_eff(parent))``. The parent's estimate leaves out the data of the child on the
chain, so nothing is counted twice. The effective count ``n_eff = n + w`` enters the
confidence radius: this is the data the region borrows.

Indices, for rewards ``r = quality - lambda * cost``. The reward has no useful a-priori
range (a per-query cost can be many times its mean), so both indices scale with the
estimated variance, shrunk towards the worst case of a [0, 1] quality by one
pseudo-observation: ``V_eff = (n_eff V + 1/4) / (n_eff + 1)``.

* UCB with a variance estimate (Auer, Cesa-Bianchi and Fischer 2002, "UCB1-Normal" form):
  ``mean + c sqrt(2 V_eff log t / n_eff)``, ``t`` the region's total effective count;
* Gaussian Thompson sampling (Agrawal and Goyal 2013): ``mean + z sqrt(V_eff / n_eff)``,
  ``z ~ N(0, 1)``.

A model with no data anywhere on the chain gets index ``+inf`` (played first, lowest index).
"""

from __future__ import annotations

import math

import numba
import numpy as np

from canopy.sharing import prior_weights

UCB = 0
THOMPSON = 1

# stats[node, model] = (count, mean, m2)
COUNT, MEAN, M2 = 0, 1, 2


@numba.njit(cache=True)
def push(stats: np.ndarray, chain: np.ndarray, model: int, reward: float) -> None:
    """Welford update of ``(count, mean, m2)`` at every node of ``chain`` (``-1``-padded)."""
    for v in chain:
        if v < 0:
            break
        n = stats[v, model, COUNT] + 1.0
        delta = reward - stats[v, model, MEAN]
        stats[v, model, COUNT] = n
        stats[v, model, MEAN] += delta / n
        stats[v, model, M2] += delta * (reward - stats[v, model, MEAN])


@numba.njit(cache=True)
def share(stats: np.ndarray, chain: np.ndarray, rule: np.ndarray, out: np.ndarray) -> None:
    """``out[m] = (n_eff, mean, variance)`` of each model at the chain's last node.

    At each ancestor the data of the child on the chain is taken out first (reverse Chan
    merge), so a region's prior is its siblings' data, shared further up: a region's own
    observations are never counted twice. ``out`` carries the running prior (``m2`` in
    place of the variance) down the chain."""
    k = stats.shape[1]
    depth = 0
    while depth < chain.size and chain[depth] >= 0:
        depth += 1
    out[:] = 0.0
    own = np.empty((k, 3))  # (n, mean, m2) of the node's own data
    moments = np.empty((k, 3))  # (n, mean, variance) for the test: own, then prior
    prior = np.empty((k, 3))
    weight = np.empty(k)
    for j in range(depth):
        v = chain[j]
        for m in range(k):
            n, own_mean, own_m2 = stats[v, m, COUNT], stats[v, m, MEAN], stats[v, m, M2]
            if j + 1 < depth:  # take the child's data out of this ancestor's
                c = chain[j + 1]
                n_c = stats[c, m, COUNT]
                rest = n - n_c
                if rest > 0.5:
                    rest_mean = (n * own_mean - n_c * stats[c, m, MEAN]) / rest
                    d = stats[c, m, MEAN] - rest_mean
                    own_m2 = max(own_m2 - stats[c, m, M2] - d * d * rest * n_c / n, 0.0)
                    n, own_mean = rest, rest_mean
                else:
                    n, own_mean, own_m2 = 0.0, 0.0, 0.0
            own[m, 0], own[m, 1], own[m, 2] = n, own_mean, own_m2
            moments[m, 0], moments[m, 1] = n, own_mean
            moments[m, 2] = own_m2 / n if n > 0.0 else 0.0
            eff = out[m, 0]
            prior[m, 0], prior[m, 1] = eff, out[m, 1]
            prior[m, 2] = out[m, 2] / eff if eff > 0.0 else 0.0
        prior_weights(moments, prior, rule, weight)
        for m in range(k):
            n, own_mean, own_m2 = own[m, 0], own[m, 1], own[m, 2]
            eff, mean, m2, w = out[m, 0], out[m, 1], out[m, 2], weight[m]
            prior_m2 = m2 * (w / eff) if eff > 0.0 else 0.0
            total = n + w
            if total > 0.0:
                delta = own_mean - mean
                out[m, 1] = mean + delta * (n / total)
                out[m, 2] = own_m2 + prior_m2 + delta * delta * (n * w / total)
            out[m, 0] = total
    for m in range(k):
        out[m, 2] = out[m, 2] / out[m, 0] if out[m, 0] > 0.0 else 0.0


@numba.njit(cache=True)
def scores(stats: np.ndarray, chain: np.ndarray, kind: int, rule: np.ndarray,
           explore: float, z: np.ndarray, est: np.ndarray, out: np.ndarray) -> None:
    """Index of every model at the chain's last node into ``out`` (``est`` is scratch)."""
    share(stats, chain, rule, est)
    k = stats.shape[1]
    t = 0.0
    for m in range(k):
        t += est[m, 0]
    log_t = math.log(max(t, 1.0) + 1.0)
    for m in range(k):
        eff = est[m, 0]
        if eff <= 0.0:
            out[m] = np.inf
            continue
        var = (eff * est[m, 2] + 0.25) / (eff + 1.0)
        if kind == UCB:
            out[m] = est[m, 1] + explore * math.sqrt(2.0 * var * log_t / eff)
        else:
            out[m] = est[m, 1] + z[m] * math.sqrt(var / eff)


@numba.njit(cache=True)
def replay_learner(stats: np.ndarray, chains: np.ndarray, quality: np.ndarray,
                   cost: np.ndarray, lam: float, kind: int, rule: np.ndarray,
                   explore: float, z: np.ndarray) -> np.ndarray:
    """Bandit replay: query ``i`` (in the given order) at ``chains[i]``; the learner sees only
    the chosen model's outcome. Returns the chosen model per query."""
    n, k = quality.shape
    est = np.empty((k, 3))
    index = np.empty(k)
    choices = np.empty(n, dtype=np.int64)
    for i in range(n):
        scores(stats, chains[i], kind, rule, explore, z[i], est, index)
        best = 0
        for m in range(1, k):
            if index[m] > index[best]:
                best = m
        choices[i] = best
        push(stats, chains[i], best, quality[i, best] - lam * cost[i, best])
    return choices
