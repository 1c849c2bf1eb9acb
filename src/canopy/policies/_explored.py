"""Numba kernels for the explored tree of the regret-play policies (paper Eqs. 4-6).

The explored tree lives in two packed arrays that grow by capacity doubling, so memory follows
the explored nodes and never the full tree:

- ``fs`` (float64, one row a node): the columns named ``MEAN .. LOGM`` below;
- ``ist`` (int64, one row a node): the columns named ``NODE .. ISLEAF``.

The children of an explored node occupy one contiguous block of rows (``FIRST`` is its first
row), allocated all at once when the node is split. Several explored trees may share the arrays
(a forest, one root per schedule, used by POO); ``INST`` says which schedule a row belongs to and
``inst[i] = (L_i, rho_i, t_i)`` holds that schedule and its own round count.

Per round, :func:`observe` folds one observation into the played row (and, with path statistics,
into its ancestors as HOO does), refreshes the row's spread, applies the split rule, refreshes
``U`` and ``B`` on the path back to the root (off-path ``B`` values stay stale until their next
visit, as in HCT), and returns the next descent. All of it is O(depth * branching).
"""

from __future__ import annotations

import math

import numba
import numpy as np

from canopy.certificate import state_bound, welford_push

# float columns of ``fs``
MEAN, COUNT, SPREAD, UPPER, BVAL, LHAT, SCALE, FLOOR, SUBN, LOGM = range(10)
N_FLOAT = 10
# int columns of ``ist``
NODE, LEVEL, PARENT, FIRST, NKIDS, INST, ISLEAF = range(7)
N_INT = 7
# entries of ``params`` (float64)
(P_C, P_DELTA, P_SIGMA, P_Z, P_SPREAD, P_EXPAND, P_MAXDEPTH, P_PATH, P_ARITY, P_MAXNODES,
 P_DEPTHM) = range(11)
N_PARAMS = 11
# entries of ``meta`` (int64)
M_USED, M_STORED, M_PEAK, M_NFREE, M_ROUNDS, M_DEEPEST = range(6)
N_META = 6

ASSUMED, CERTIFIED, HYBRID = 0, 1, 2
REFINE, ALWAYS, FIXED = 0, 1, 2


@numba.njit(cache=True)
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


@numba.njit(cache=True)
def _spread(v: int, fs: np.ndarray, cert: np.ndarray, lambdas: np.ndarray,
            params: np.ndarray) -> float:
    """The bias bonus of row ``v`` (see :class:`~canopy.policies.descent.OptimisticDescent`)."""
    mode = int(params[P_SPREAD])
    floor = fs[v, FLOOR]
    if mode == ASSUMED:
        return floor
    sigma, delta, z = params[P_SIGMA], params[P_DELTA], params[P_Z]
    own = state_bound(cert[v], lambdas, fs[v, LOGM], sigma, delta, z)
    if mode == CERTIFIED:
        return min(1.0, own, fs[v, LHAT] * fs[v, SCALE])
    if spread_lower(cert[v], sigma, delta, z) > floor:
        return max(floor, min(1.0, own))
    return floor


@numba.njit(cache=True)
def _upper(v: int, fs: np.ndarray, c: float, log_t: float) -> float:
    count = fs[v, COUNT]
    if count <= 0.0:
        return np.inf
    return fs[v, MEAN] + c * math.sqrt(2.0 * log_t / count) + fs[v, SPREAD]


@numba.njit(cache=True)
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


@numba.njit(cache=True)
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


@numba.njit(cache=True)
def _wants_split(v: int, fs: np.ndarray, ist: np.ndarray, params: np.ndarray,
                 log_t: float) -> bool:
    """The expand rule: ``always``/``fixed`` split a played explored leaf at once (``fixed``
    stops at ``max_depth``, folded into ``NKIDS``); ``refine`` is Eq. (6)."""
    if ist[v, FIRST] >= 0 or ist[v, NKIDS] == 0 or fs[v, COUNT] < 1.0:
        return False
    if int(params[P_EXPAND]) != REFINE:
        return True
    spread = fs[v, SPREAD]
    if spread <= 0.0:
        return False
    c = params[P_C]
    return fs[v, COUNT] >= c * c * log_t / (spread * spread)


@numba.njit(cache=True)
def _kids_of(v: int, ist: np.ndarray, params: np.ndarray, child_ptr: np.ndarray,
             child_ids: np.ndarray, j: int) -> int:
    arity = int(params[P_ARITY])
    if arity > 0:
        return ist[v, NODE] * arity + j
    return child_ids[child_ptr[ist[v, NODE]] + j]


@numba.njit(cache=True)
def _n_kids(node: int, level: int, params: np.ndarray, child_ptr: np.ndarray) -> int:
    """Children a full-tree node may be split into (0 at ``max_depth`` or at a leaf)."""
    if level >= params[P_MAXDEPTH]:
        return 0
    arity = int(params[P_ARITY])
    if arity > 0:
        return arity
    return child_ptr[node + 1] - child_ptr[node]


@numba.njit(cache=True)
def _prune_one(keep: int, fs: np.ndarray, ist: np.ndarray, meta: np.ndarray,
               free: np.ndarray, c: float, inst: np.ndarray) -> bool:
    """Memory bound: forget the children of the explored node of lowest ``B`` whose children
    are all explored leaves (never ``keep``, the parent of the row being split). The pruned
    node becomes an explored leaf again with its own statistics. Returns whether one was
    found."""
    target = -1
    lowest = np.inf
    for p in range(meta[M_USED]):
        first = ist[p, FIRST]
        if ist[p, LEVEL] < 0 or first < 0 or p == keep:
            continue
        all_leaves = True
        for j in range(ist[p, NKIDS]):
            if ist[first + j, FIRST] >= 0:
                all_leaves = False
                break
        if all_leaves and (target < 0 or fs[p, BVAL] < lowest):
            target = p
            lowest = fs[p, BVAL]
    if target < 0:
        return False
    first = ist[target, FIRST]
    for j in range(ist[target, NKIDS]):
        ist[first + j, LEVEL] = -1
    free[meta[M_NFREE]] = first
    meta[M_NFREE] += 1
    meta[M_STORED] -= ist[target, NKIDS]
    ist[target, FIRST] = -1
    log_t = math.log(max(inst[ist[target, INST], 2], 1.0))
    fs[target, UPPER] = _upper(target, fs, c, log_t)
    v = target
    while v >= 0:
        _refresh_b(v, fs, ist)
        v = ist[v, PARENT]
    return True


@numba.njit(cache=True)
def _split(v: int, fs: np.ndarray, ist: np.ndarray, cert: np.ndarray, params: np.ndarray,
           inst: np.ndarray, meta: np.ndarray, free: np.ndarray, child_ptr: np.ndarray,
           child_ids: np.ndarray, leaf_lo: np.ndarray, leaf_hi: np.ndarray) -> None:
    """Allocate the children block of explored leaf ``v`` (reusing a freed block if any)."""
    n_kids = ist[v, NKIDS]
    max_nodes = params[P_MAXNODES]
    c = params[P_C]
    while max_nodes > 0 and meta[M_STORED] + n_kids > max_nodes:
        if not _prune_one(ist[v, PARENT], fs, ist, meta, free, c, inst):
            return
    if meta[M_NFREE] > 0:
        meta[M_NFREE] -= 1
        first = free[meta[M_NFREE]]
    else:
        first = meta[M_USED]
        meta[M_USED] += n_kids
    meta[M_STORED] += n_kids
    meta[M_PEAK] = max(meta[M_PEAK], meta[M_STORED])
    rho = inst[ist[v, INST], 1]
    level = ist[v, LEVEL] + 1
    meta[M_DEEPEST] = max(meta[M_DEEPEST], level)
    arity = int(params[P_ARITY])
    inherited = fs[v, SPREAD] / fs[v, SCALE]
    for j in range(n_kids):
        w = first + j
        node = _kids_of(v, ist, params, child_ptr, child_ids, j)
        ist[w, NODE] = node
        ist[w, LEVEL] = level
        ist[w, PARENT] = v
        ist[w, FIRST] = -1
        ist[w, NKIDS] = _n_kids(node, level, params, child_ptr)
        ist[w, INST] = ist[v, INST]
        if arity > 0:
            ist[w, ISLEAF] = 0
            fs[w, LOGM] = max(params[P_DEPTHM] - level, 0.0) * math.log(arity)
        else:
            ist[w, ISLEAF] = 1 if child_ptr[node + 1] == child_ptr[node] else 0
            fs[w, LOGM] = math.log(leaf_hi[node] - leaf_lo[node])
        fs[w, MEAN] = 0.0
        fs[w, COUNT] = 0.0
        fs[w, SUBN] = 0.0
        fs[w, SCALE] = fs[v, SCALE] * rho
        fs[w, FLOOR] = fs[v, FLOOR] * rho
        fs[w, LHAT] = inherited
        fs[w, UPPER] = np.inf
        fs[w, BVAL] = np.inf
        if cert.shape[1] > 0:
            cert[w, :] = 0.0
        mode = int(params[P_SPREAD])
        fs[w, SPREAD] = min(1.0, inherited * fs[w, SCALE]) if mode == CERTIFIED else fs[w, FLOOR]
    ist[v, FIRST] = first


@numba.njit(cache=True)
def observe(v: int, x: float, fs: np.ndarray, ist: np.ndarray, cert: np.ndarray,
            lambdas: np.ndarray, params: np.ndarray, inst: np.ndarray, meta: np.ndarray,
            free: np.ndarray, child_ptr: np.ndarray, child_ids: np.ndarray,
            leaf_lo: np.ndarray, leaf_hi: np.ndarray) -> tuple[int, int, int, int]:
    """Fold observation ``x`` of row ``v`` into the explored tree and descend for the next
    round. Returns ``(next_row, its node, its level, its full-tree-leaf flag)``."""
    k = ist[v, INST]
    inst[k, 2] += 1.0
    meta[M_ROUNDS] += 1
    log_t = math.log(inst[k, 2])
    c = params[P_C]
    path_stats = params[P_PATH] > 0
    a = v
    while a >= 0:
        fs[a, SUBN] += 1.0
        if a == v or path_stats:
            fs[a, COUNT] += 1.0
            fs[a, MEAN] += (x - fs[a, MEAN]) / fs[a, COUNT]
        a = ist[a, PARENT]
    if cert.shape[1] > 0:
        welford_push(cert[v], x, lambdas, params[P_SIGMA], params[P_Z])
    fs[v, SPREAD] = _spread(v, fs, cert, lambdas, params)
    if _wants_split(v, fs, ist, params, log_t):
        _split(v, fs, ist, cert, params, inst, meta, free, child_ptr, child_ids, leaf_lo,
               leaf_hi)
    a = v
    while a >= 0:
        fs[a, UPPER] = _upper(a, fs, c, log_t)
        _refresh_b(a, fs, ist)
        a = ist[a, PARENT]
    root = meta[M_ROUNDS] % inst.shape[0]
    w = descend(root, fs, ist)
    return w, ist[w, NODE], ist[w, LEVEL], ist[w, ISLEAF]
