"""Numba kernels for the explored tree of the regret-play policies (paper Eqs. 4-6).

The explored tree lives in two packed arrays that grow by capacity doubling, so memory follows
the explored nodes and never the full tree:

- ``fs`` (float64, one row a node): the columns named ``MEAN .. CLOW`` below (``M2``: the
  running sum of squared deviations of the node's own probes), then (for the certified and
  hybrid spreads) the node's packed certificate state: Algorithm 1's
  ``[n, mean, m2, mean_y[k], m2_y[k]]`` with ``certificate="paper"``, else the running state
  of :func:`canopy.certificate.sharp_push`, whose bounds are composed up the explored tree
  as :mod:`canopy.certified_tree` does (``P_TREECERT``);
- ``ist`` (int64, one row a node): the columns named ``NODE .. ISLEAF``, and ``FREE``, a stack
  of freed child blocks (its first ``n_free`` entries).

Scalars travel in one float64 array ``ctl``: the parameters ``P_*``, the counters ``M_*``, then
one ``(L, rho, t)`` triple per schedule. Few arguments keep numba's per-call dispatch cheap.

The children of an explored node occupy one contiguous block of rows (``FIRST`` is its first
row), allocated all at once when the node is split. Several explored trees may share the arrays
(a forest, one root per schedule, used by POO); ``INST`` says which schedule a row belongs to,
and each schedule counts its own rounds ``t``.

Per round, :func:`observe` folds one observation into the played row (and, with path statistics,
into its ancestors as HOO does), refreshes the row's spread and applies the split rule; when the
row is to be split it returns ``-1`` and the caller runs :func:`split`, the only kernel that
reads the full tree. Either way the round ends by refreshing ``U`` and ``B`` on the path back to
the root (off-path ``B`` values stay stale until their next visit, as in HCT) and descending for
the next round. All of it is O(depth * branching).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numba
import numpy as np

from canopy.certificate import sharp_bounds, sharp_push, state_bound, welford_push
from canopy.certified_tree import combine

# float columns of ``fs`` (OUP/OLOW: a node's own certified upper bound on its best leaf and
# lower bound on its value, CUP/CLOW: the same composed up the explored tree, unit scale)
MEAN, COUNT, SPREAD, UPPER, BVAL, LHAT, SCALE, FLOOR, SUBN, LOGM, M2, OUP, OLOW, CUP, CLOW = (
    range(15))
N_FLOAT = 15
# int columns of ``ist``
NODE, LEVEL, PARENT, FIRST, NKIDS, INST, ISLEAF, FREE = range(8)
N_INT = 8
# parameters at the start of ``ctl``
(P_C, P_DELTA, P_SIGMA, P_Z, P_SPREAD, P_EXPAND, P_MAXDEPTH, P_PATH, P_ARITY, P_MAXNODES,
 P_DEPTHM, P_TREECERT, P_LOW, P_WIDTH, P_SPLIT, P_FORGET, P_RADIUS) = range(17)
N_PARAMS = 17
# counters in ``ctl`` (after the parameters)
M_USED, M_STORED, M_PEAK, M_NFREE, M_ROUNDS, M_DEEPEST = range(N_PARAMS, N_PARAMS + 6)
INST0 = N_PARAMS + 6  # then (L, rho, t) per schedule

#: how every kernel here is compiled: cached, and without numba's reference counting
#: (``_nrt=False``, as numba compiles its own allocation-free helpers). The kernels allocate
#: nothing and every array they touch belongs to the calling policy, so the atomic increment
#: and decrement numba otherwise wraps around each use of an array (most of a round's time in
#: the kernel) guard nothing; the arrays' unboxing on each call is cheaper too.
kernel = numba.njit(cache=True, _nrt=False)

ASSUMED, CERTIFIED, HYBRID, ESTIMATED = 0, 1, 2, 3
# own probes a node needs before ``spread="estimated"`` trusts its own within-cell sd (and
# before it may be split): the sample variance's relative standard error sqrt(2 / (n - 1)) is
# then at most 1/2. Fixed a priori, not tuned on any instance.
MIN_PROBES = 9.0
REFINE, ALWAYS, FIXED = 0, 1, 2
# the refine rule's threshold (``P_SPLIT``): Eq. (6) as written, or the variance-scaled one
EQ6, VARIANCE = 0, 1
# which cells the memory bound may forget (``P_FORGET``): any, or only dominated or deeper ones
ANY, BALANCED = 0, 1
# Eq. (4)'s confidence radius (``P_RADIUS``): ``c sqrt(2 ln t / T)`` as written, or with
# ``ln+(t / T)`` in place of ``ln t`` (MOSS's confidence level)
EQ4, MOSS = 0, 1


def entry_point(kernel: numba.core.registry.CPUDispatcher,
                *example: object) -> Callable[..., Any]:
    """The compiled entry point of ``kernel`` for the argument types of ``example``: calling it
    skips numba's per-call type resolution, about 40% of a call's dispatch cost. Only for
    arguments of exactly those types (the policies' own arrays, an ``int`` row and a ``float``
    observation, which a numpy float also passes as). Falls back to the dispatcher itself if
    this numba does not expose its overloads."""
    signature = tuple(numba.typeof(arg) for arg in example)
    kernel.compile(signature)
    overload = getattr(kernel, "overloads", {}).get(signature)
    return getattr(overload, "entry_point", kernel)


@kernel
def spread_lower(state: np.ndarray, sigma: float, delta: float, z: float) -> float:
    """Lower confidence bound on the noise-deconvolved within-cell standard deviation from a
    packed certificate state; the same quantity as ``Certificate.spread_lower``."""
    n = state[0]
    if n < 2.0:
        return 0.0
    variance = max(state[2] / (n - 1.0), 0.0)
    width = 1.0 + 2.0 * z * sigma
    std_low = max(math.sqrt(variance) - width * math.sqrt(2.0 * math.log(1.0 / delta) / (n - 1.0)),
                  0.0)
    return math.sqrt(max(std_low * std_low - sigma * sigma, 0.0))


@kernel
def _estimated(v: int, fs: np.ndarray, sigma: float) -> float:
    """Section 3.3's data-driven bonus ``sigma_w sqrt(2 log m)`` with the plug-in
    ``sigma_w = sqrt(max(var(own probes) - sigma^2, 0))``, capped at 1 (the values' range).
    With ``MIN_PROBES`` own probes the node's per-subtree estimate ``L_hat = bonus / rho^level``
    is stored in ``LHAT`` (its children inherit it at the split); before, the bonus is the
    inherited ``L_hat rho^level``."""
    n = fs[v, COUNT]
    if n < MIN_PROBES:
        return min(1.0, fs[v, LHAT] * fs[v, SCALE])
    within = math.sqrt(max(fs[v, M2] / (n - 1.0) - sigma * sigma, 0.0))
    bonus = min(1.0, within * math.sqrt(2.0 * fs[v, LOGM]))
    fs[v, LHAT] = bonus / fs[v, SCALE]
    return bonus


@kernel
def _spread(v: int, fs: np.ndarray, ctl: np.ndarray, lambdas: np.ndarray) -> float:
    """The bias bonus of row ``v`` (see :class:`~canopy.policies.descent.OptimisticDescent`)."""
    mode = int(ctl[P_SPREAD])
    floor = fs[v, FLOOR]
    if mode == ASSUMED:
        return floor
    if mode == ESTIMATED:
        return _estimated(v, fs, ctl[P_SIGMA])
    sigma, delta, z = ctl[P_SIGMA], ctl[P_DELTA], ctl[P_Z]
    state = fs[v, N_FLOAT:]
    if ctl[P_TREECERT] > 0:
        width = ctl[P_WIDTH]
        bound = max(fs[v, CUP] - fs[v, CLOW], 0.0) * width
        if mode == CERTIFIED:
            return bound
        if spread_lower(state, sigma / width, delta, z) * width > floor:
            return max(floor, bound)
        return floor
    own = state_bound(state, lambdas, fs[v, LOGM], sigma, delta, z)
    if mode == CERTIFIED:
        return min(1.0, own, fs[v, LHAT] * fs[v, SCALE])
    if spread_lower(state, sigma, delta, z) > floor:
        return max(floor, min(1.0, own))
    return floor


@kernel
def _log_t(v: int, ist: np.ndarray, ctl: np.ndarray) -> float:
    return math.log(max(ctl[INST0 + 3 * ist[v, INST] + 2], 1.0))


@kernel
def _upper(v: int, fs: np.ndarray, ctl: np.ndarray, log_t: float) -> float:
    """Eq. (4)'s ``U(v)``; under ``P_RADIUS = MOSS`` the radius's ``ln t`` is
    ``ln+(t / T(v))``."""
    count = fs[v, COUNT]
    if count <= 0.0:
        return np.inf
    if ctl[P_RADIUS] == MOSS:
        log_t = max(log_t - math.log(count), 0.0)
    return fs[v, MEAN] + ctl[P_C] * math.sqrt(2.0 * log_t / count) + fs[v, SPREAD]


@kernel
def _refresh_b(v: int, fs: np.ndarray, ist: np.ndarray) -> None:
    """Eq. (4): ``B(v) = min(U(v), max_children B)``; ``U(v)`` for an explored leaf."""
    first = ist[v, FIRST]
    if first < 0:
        fs[v, BVAL] = fs[v, UPPER]
        return
    best = -np.inf
    for j in range(ist[v, NKIDS]):
        best = max(best, fs[first + j, BVAL])
    fs[v, BVAL] = min(fs[v, UPPER], best)


@kernel
def descend(root: int, fs: np.ndarray, ist: np.ndarray) -> int:
    """Follow the child of largest ``B`` (first on ties) from ``root`` to an explored leaf."""
    v = root
    while ist[v, FIRST] >= 0:
        first = ist[v, FIRST]
        best = first
        best_b = fs[first, BVAL]
        for j in range(1, ist[v, NKIDS]):
            if fs[first + j, BVAL] > best_b:
                best = first + j
                best_b = fs[first + j, BVAL]
        v = best
    return v


@kernel
def _finish(v: int, fs: np.ndarray, ist: np.ndarray, ctl: np.ndarray) -> int:
    """Refresh ``U`` and ``B`` from ``v`` up to its root, then descend for the next round
    (schedules take rounds in turn). Returns the row to play next."""
    log_t = _log_t(v, ist, ctl)
    a = v
    while a >= 0:
        fs[a, UPPER] = _upper(a, fs, ctl, log_t)
        _refresh_b(a, fs, ist)
        a = ist[a, PARENT]
    n_inst = (ctl.size - INST0) // 3
    return descend(int(ctl[M_ROUNDS]) % n_inst, fs, ist)


@kernel
def _wants_split(v: int, fs: np.ndarray, ist: np.ndarray, ctl: np.ndarray) -> bool:
    """The expand rule: ``always``/``fixed`` split a played explored leaf at once (``fixed``
    stops at ``max_depth``, folded into ``NKIDS``); ``refine`` is Eq. (6) (``P_SPLIT = EQ6``)
    or the variance-scaled threshold ``T(v) >= V_hat(v) / spread(v)^2`` (``VARIANCE``)."""
    if ist[v, FIRST] >= 0 or ist[v, NKIDS] == 0 or fs[v, COUNT] < 1.0:
        return False
    if int(ctl[P_EXPAND]) != REFINE:
        return True
    if int(ctl[P_SPREAD]) == ESTIMATED and fs[v, COUNT] < MIN_PROBES:
        return False  # split only once the node has its own estimate for its children
    spread = fs[v, SPREAD]
    if spread <= 0.0:
        return False
    n = fs[v, COUNT]
    if int(ctl[P_SPLIT]) == VARIANCE:
        # one standard error of the cell's mean within its spread: n spread^2 >= V_hat, with
        # V_hat the sample variance of the own probes, at least the noise's sigma^2
        if n < 2.0:
            return False
        sigma = ctl[P_SIGMA]
        return n * spread * spread >= max(fs[v, M2] / (n - 1.0), sigma * sigma)
    c = ctl[P_C]
    return n >= c * c * _log_t(v, ist, ctl) / (spread * spread)


@kernel
def _compose(a: int, fs: np.ndarray, ist: np.ndarray, ctl: np.ndarray) -> None:
    """Composed bounds of row ``a`` from its own and its explored children's
    (:func:`canopy.certified_tree.combine`); children weigh ``m_c / m_a`` (``1 / arity`` on a
    lazy tree)."""
    kid_up, kid_low = 1.0, 0.0
    first = ist[a, FIRST]
    if first >= 0:
        kid_up = -np.inf
        arity = ctl[P_ARITY]
        for j in range(ist[a, NKIDS]):
            c = first + j
            kid_up = max(kid_up, fs[c, CUP])
            weight = 1.0 / arity if arity > 0 else math.exp(fs[c, LOGM] - fs[a, LOGM])
            kid_low += weight * fs[c, CLOW]
    fs[a, CUP], fs[a, CLOW] = combine(fs[a, OUP], fs[a, OLOW], kid_up, kid_low)


@kernel
def _compose_path(v: int, fs: np.ndarray, ist: np.ndarray, ctl: np.ndarray,
                  setup: np.ndarray) -> None:
    """Refresh the composed bounds, and the certified spreads, of ``v``'s ancestors."""
    _compose(v, fs, ist, ctl)
    a = ist[v, PARENT]
    while a >= 0:
        _compose(a, fs, ist, ctl)
        fs[a, SPREAD] = _spread(a, fs, ctl, setup)
        a = ist[a, PARENT]


@kernel
def observe(v: int, x: float, fs: np.ndarray, ist: np.ndarray, ctl: np.ndarray,
            lambdas: np.ndarray) -> int:
    """Fold observation ``x`` of row ``v`` into the explored tree and descend for the next
    round. Returns the row to play next, or ``-1`` when ``v`` is to be split first (call
    :func:`split`; a split the memory bound makes wait is finished here, as :func:`split`
    would)."""
    ctl[INST0 + 3 * ist[v, INST] + 2] += 1.0
    ctl[M_ROUNDS] += 1.0
    path_stats = ctl[P_PATH] > 0
    a = v
    while a >= 0:
        fs[a, SUBN] += 1.0
        if a == v or path_stats:
            fs[a, COUNT] += 1.0
            d = x - fs[a, MEAN]
            fs[a, MEAN] += d / fs[a, COUNT]
            fs[a, M2] += d * (x - fs[a, MEAN])
        a = ist[a, PARENT]
    if ctl[P_TREECERT] > 0:
        state = fs[v, N_FLOAT:]
        sharp_push(state, (x - ctl[P_LOW]) / ctl[P_WIDTH], lambdas)
        fs[v, OUP], fs[v, OLOW] = sharp_bounds(state, lambdas, fs[v, LOGM])
        _compose_path(v, fs, ist, ctl, lambdas)
    elif fs.shape[1] > N_FLOAT:
        welford_push(fs[v, N_FLOAT:], x, lambdas, ctl[P_SIGMA], ctl[P_Z])
    fs[v, SPREAD] = _spread(v, fs, ctl, lambdas)
    if _wants_split(v, fs, ist, ctl) and not _split_waits(v, fs, ist, ctl):
        return -1
    return _finish(v, fs, ist, ctl)


@kernel
def _prune_target(v: int, fs: np.ndarray, ist: np.ndarray, ctl: np.ndarray) -> int:
    """The explored node whose children the memory bound forgets to split row ``v``: of lowest
    ``B`` among those whose children are all explored leaves, never ``v``'s parent. With
    ``P_FORGET = BALANCED`` only a node that ``v`` dominates (its ``B`` below ``v``'s lower
    confidence bound ``mean(v) - c sqrt(2 ln t / T(v))``: its subtree cannot hold a point as
    good as ``v``'s cell) or one deeper than ``v`` (forgotten, its region stays at least as
    fine as ``v``'s children will be). ``-1`` if there is none."""
    keep = ist[v, PARENT]
    bar = np.inf
    if ctl[P_FORGET] == BALANCED:
        bar = fs[v, MEAN] - ctl[P_C] * math.sqrt(2.0 * _log_t(v, ist, ctl)
                                                 / max(fs[v, COUNT], 1.0))
    target = -1
    lowest = np.inf
    for p in range(int(ctl[M_USED])):
        first = ist[p, FIRST]
        if ist[p, LEVEL] < 0 or first < 0 or p == keep:
            continue
        all_leaves = True
        for j in range(ist[p, NKIDS]):
            if ist[first + j, FIRST] >= 0:
                all_leaves = False
                break
        if not all_leaves or not (fs[p, BVAL] < bar or ist[p, LEVEL] > ist[v, LEVEL]):
            continue
        if fs[p, BVAL] < lowest or target < 0:
            target = p
            lowest = fs[p, BVAL]
    return target


@kernel
def _split_waits(v: int, fs: np.ndarray, ist: np.ndarray, ctl: np.ndarray) -> bool:
    """Whether :func:`split` of row ``v`` would wait: the memory cap is reached and nothing can
    be forgotten (it would then only finish the round)."""
    max_nodes = ctl[P_MAXNODES]
    return (max_nodes > 0 and ctl[M_STORED] + ist[v, NKIDS] > max_nodes
            and _prune_target(v, fs, ist, ctl) < 0)


@kernel
def _prune_one(v: int, fs: np.ndarray, ist: np.ndarray, ctl: np.ndarray) -> bool:
    """Memory bound: forget the children of :func:`_prune_target` of row ``v``. The pruned node
    becomes an explored leaf again with its own statistics. Returns whether there was one."""
    target = _prune_target(v, fs, ist, ctl)
    if target < 0:
        return False
    first = ist[target, FIRST]
    for j in range(ist[target, NKIDS]):
        ist[first + j, LEVEL] = -1
    ist[int(ctl[M_NFREE]), FREE] = first
    ctl[M_NFREE] += 1.0
    ctl[M_STORED] -= ist[target, NKIDS]
    ist[target, FIRST] = -1
    if ctl[P_TREECERT] > 0:
        a = target
        while a >= 0:
            _compose(a, fs, ist, ctl)
            a = ist[a, PARENT]
    fs[target, UPPER] = _upper(target, fs, ctl, _log_t(target, ist, ctl))
    a = target
    while a >= 0:
        _refresh_b(a, fs, ist)
        a = ist[a, PARENT]
    return True


@kernel
def _kid_node(v: int, ist: np.ndarray, arity: int, child_ptr: np.ndarray,
              child_ids: np.ndarray, j: int) -> int:
    if arity > 0:
        return ist[v, NODE] * arity + j
    return child_ids[child_ptr[ist[v, NODE]] + j]


@kernel
def split(v: int, fs: np.ndarray, ist: np.ndarray, ctl: np.ndarray, child_ptr: np.ndarray,
          child_ids: np.ndarray, leaf_lo: np.ndarray,
          leaf_hi: np.ndarray) -> int:
    """Allocate the children block of explored leaf ``v`` (reusing a freed block if any, and
    forgetting cells first under a memory cap), then finish the round as :func:`observe`.
    ``arity > 0`` in ``ctl`` means a lazy tree (the tree arrays are then unused)."""
    n_kids = ist[v, NKIDS]
    max_nodes = ctl[P_MAXNODES]
    while max_nodes > 0 and ctl[M_STORED] + n_kids > max_nodes:
        if not _prune_one(v, fs, ist, ctl):
            return _finish(v, fs, ist, ctl)
    if ctl[M_NFREE] > 0:
        ctl[M_NFREE] -= 1.0
        first = ist[int(ctl[M_NFREE]), FREE]
    else:
        first = int(ctl[M_USED])
        ctl[M_USED] += n_kids
    ctl[M_STORED] += n_kids
    ctl[M_PEAK] = max(ctl[M_PEAK], ctl[M_STORED])
    rho = ctl[INST0 + 3 * ist[v, INST] + 1]
    level = ist[v, LEVEL] + 1
    ctl[M_DEEPEST] = max(ctl[M_DEEPEST], level)
    arity = int(ctl[P_ARITY])
    inherited = fs[v, SPREAD] / fs[v, SCALE]
    mode = int(ctl[P_SPREAD])
    inherits = (mode == CERTIFIED and ctl[P_TREECERT] == 0) or mode == ESTIMATED
    for j in range(n_kids):
        w = first + j
        node = _kid_node(v, ist, arity, child_ptr, child_ids, j)
        ist[w, NODE] = node
        ist[w, LEVEL] = level
        ist[w, PARENT] = v
        ist[w, FIRST] = -1
        ist[w, INST] = ist[v, INST]
        fs[w, :] = 0.0
        if arity > 0:
            ist[w, NKIDS] = arity
            ist[w, ISLEAF] = 0
            fs[w, LOGM] = max(ctl[P_DEPTHM] - level, 0.0) * math.log(arity)
        else:
            ist[w, NKIDS] = child_ptr[node + 1] - child_ptr[node]
            ist[w, ISLEAF] = 1 if ist[w, NKIDS] == 0 else 0
            fs[w, LOGM] = math.log(leaf_hi[node] - leaf_lo[node])
        if level >= ctl[P_MAXDEPTH]:
            ist[w, NKIDS] = 0
        fs[w, SCALE] = fs[v, SCALE] * rho
        fs[w, FLOOR] = fs[v, FLOOR] * rho
        fs[w, LHAT] = inherited
        fs[w, UPPER] = np.inf
        fs[w, BVAL] = np.inf
        fs[w, SPREAD] = min(1.0, inherited * fs[w, SCALE]) if inherits else fs[w, FLOOR]
        if ctl[P_TREECERT] > 0:
            fs[w, OUP] = fs[w, CUP] = 1.0
            fs[w, SPREAD] = ctl[P_WIDTH] if mode == CERTIFIED else fs[w, FLOOR]
    ist[v, FIRST] = first
    return _finish(v, fs, ist, ctl)
