"""Radix block cache: an ancestor-closed set of prefix-tree nodes under a block budget.

A request (a root-first path of blocks, :class:`~canopy.apps.cache.traces.Trace`) reuses its
longest cached prefix (reuse stops at the first miss), then inserts its remaining blocks. While
a request runs its blocks are pinned, as engines pin blocks with a positive reference count;
when the cache is full a victim is chosen among unpinned *leaves* only, so the cache stays
ancestor-closed (a node is cached only if its parent is). When every cached block is pinned
(a request longer than the cache), the rest of that request is not cached.

The per-request step is one numba kernel shared by every policy; a policy contributes only
its victim choice (paper Section 4, "Serving systems": the prefix tree is the cache itself):

* ``LRU`` keeps an intrusive doubly linked free queue in vLLM's order (a finished request's
  blocks are appended tail first; the victim is the queue front, always a leaf);
* ``SIEVE`` keeps an insertion-ordered queue and a hand (Zhang et al., NSDI 2024) that skips
  blocks it may not evict (inner nodes, pinned blocks);
* the priority policies (``LFU``, ``CANOPY``, ``OPTIMAL``) keep a binary min-heap of evictable
  leaves with lazy deletion (per-node versions); a node is pushed when it becomes a leaf or a
  leaf is used. A key changes only when its node is used, so the heap is exact.
"""

from __future__ import annotations

import numba as nb
import numpy as np

__all__ = ["CANOPY", "LFU", "LRU", "OPTIMAL", "SIEVE", "RadixCache", "next_use"]

LRU, LFU, SIEVE, CANOPY, OPTIMAL = 0, 1, 2, 3, 4

# integer node fields (columns of ``ni``, one row a node for locality)
_CACHED, _NCHILD, _PIN, _VER, _PREV, _NEXT, _HITS, _LAST, _VISITED, _NU, _CLAST = range(11)
_NI = 11
# float node fields (columns of ``nf``): heap key, canopy statistics
_KEY, _S, _KIDS = range(3)
_NF = 3
# scalars (``sc``): blocks cached, list ends, SIEVE hand, heap length, blocks inserted so far
_SIZE, _HEAD, _TAIL, _HAND, _HLEN, _CLOCK = range(6)


@nb.njit(cache=True)
def next_use(offsets: np.ndarray, nodes: np.ndarray, n_nodes: int) -> np.ndarray:
    """For each block reference, the index of the next request using that block (or the
    number of requests when none does): what the offline optimum knows."""
    n_req = len(offsets) - 1
    seen = np.full(n_nodes, n_req, dtype=np.int64)
    out = np.empty(len(nodes), dtype=np.int64)
    for t in range(n_req - 1, -1, -1):
        for r in range(offsets[t], offsets[t + 1]):
            v = nodes[r]
            out[r] = seen[v]
            seen[v] = t
    return out


# ---------------------------------------------------------------- intrusive linked list
@nb.njit(cache=True, inline="always")
def _unlink(ni, sc, v):
    p, n = ni[v, _PREV], ni[v, _NEXT]
    if p >= 0:
        ni[p, _NEXT] = n
    else:
        sc[_TAIL] = n
    if n >= 0:
        ni[n, _PREV] = p
    else:
        sc[_HEAD] = p
    ni[v, _PREV] = -1
    ni[v, _NEXT] = -1


@nb.njit(cache=True, inline="always")
def _push_head(ni, sc, v):
    h = sc[_HEAD]
    ni[v, _PREV] = h
    ni[v, _NEXT] = -1
    if h >= 0:
        ni[h, _NEXT] = v
    else:
        sc[_TAIL] = v
    sc[_HEAD] = v


# ---------------------------------------------------------------- heap with lazy deletion
@nb.njit(cache=True)
def _heap_push(hkey, hnode, hver, sc, key, v, ver):
    i = sc[_HLEN]
    sc[_HLEN] = i + 1
    while i > 0:
        up = (i - 1) >> 1
        if hkey[up] <= key:
            break
        hkey[i], hnode[i], hver[i] = hkey[up], hnode[up], hver[up]
        i = up
    hkey[i], hnode[i], hver[i] = key, v, ver


@nb.njit(cache=True)
def _heap_pop(hkey, hnode, hver, sc):
    n = sc[_HLEN] - 1
    sc[_HLEN] = n
    key, v, ver = hkey[n], hnode[n], hver[n]
    i = 0
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and hkey[c + 1] < hkey[c]:
            c += 1
        if hkey[c] >= key:
            break
        hkey[i], hnode[i], hver[i] = hkey[c], hnode[c], hver[c]
        i = c
    if n > 0:
        hkey[i], hnode[i], hver[i] = key, v, ver


@nb.njit(cache=True)
def _heap_compact(hkey, hnode, hver, sc, ni):
    """Drop dead entries when the heap array is full (rare: pushes are O(1) per request)."""
    entries = sc[_HLEN]
    sc[_HLEN] = 0
    keys, nodes_, vers = hkey[:entries].copy(), hnode[:entries].copy(), hver[:entries].copy()
    for e in range(entries):
        v = nodes_[e]
        if ni[v, _CACHED] == 1 and ni[v, _NCHILD] == 0 and ni[v, _VER] == vers[e]:
            _heap_push(hkey, hnode, hver, sc, keys[e], v, vers[e])


# ---------------------------------------------------------------- policy hooks
@nb.njit(cache=True, inline="always")
def _logaddexp(a, b):
    return max(a, b) + np.log1p(np.exp(-abs(a - b)))


@nb.njit(cache=True)
def _key(kind, v, parent, depth, ni, nf, params):
    if kind == LFU:
        return ni[v, _HITS] * params[0] + ni[v, _LAST]
    if kind == OPTIMAL:
        return -(ni[v, _NU] * params[0] + depth[v])
    return nf[v, _S] + params[_LAM] * ni[v, _CLAST]  # CANOPY: log discounted count


@nb.njit(cache=True)
def _push_leaf(kind, v, parent, depth, ni, nf, params, hkey, hnode, hver, sc):
    if sc[_HLEN] == len(hkey):
        _heap_compact(hkey, hnode, hver, sc, ni)
    ni[v, _VER] += 1
    key = _key(kind, v, parent, depth, ni, nf, params)
    nf[v, _KEY] = key
    _heap_push(hkey, hnode, hver, sc, key, v, ni[v, _VER])


@nb.njit(cache=True)
def _victim(kind, t, parent, depth, ni, nf, params, hkey, hnode, hver, sc):
    """An unpinned leaf to evict, or -1 when every cached block is pinned."""
    if kind == LRU:
        v = sc[_TAIL]
        return v if v >= 0 else -1
    if kind == SIEVE:
        v = sc[_HAND] if sc[_HAND] >= 0 else sc[_TAIL]
        for _ in range(2 * sc[_SIZE] + 2):
            if v < 0:
                v = sc[_TAIL]
            if ni[v, _NCHILD] == 0 and ni[v, _PIN] != t and ni[v, _VISITED] == 0:
                sc[_HAND] = ni[v, _NEXT]
                return v
            ni[v, _VISITED] = 0
            v = ni[v, _NEXT]
        return -1
    while sc[_HLEN] > 0:
        v, ver = hnode[0], hver[0]
        _heap_pop(hkey, hnode, hver, sc)
        if ni[v, _CACHED] == 0 or ni[v, _NCHILD] != 0 or ni[v, _VER] != ver:
            continue  # dead entry
        if ni[v, _PIN] == t:
            continue  # in use; pushed again when the request ends
        return v
    return -1


@nb.njit(cache=True, inline="always")
def _touch(v, t, nu, ni):
    """Account one use of cached block ``v`` by request ``t``."""
    ni[v, _HITS] += 1
    ni[v, _LAST] = t
    ni[v, _NU] = nu


# canopy configuration (``params``): decay rate per inserted block, prior weight
_LAM, _RHO = range(2)


@nb.njit(cache=True, inline="always")
def _discounted(v, clock, ni, nf, params):
    """log of ``v``'s discounted use count now."""
    return nf[v, _S] - params[_LAM] * (clock - ni[v, _CLAST])


@nb.njit(cache=True)
def _canopy_update(lo, k, end, nodes, parent, ni, nf, sc, params):
    """Canopy's cell values after a request used ``nodes[lo:end]`` (``k``: first miss).

    ``S(v)`` is the log of ``v``'s use count discounted by ``2^{-(c - c_i)/H}`` (``c``: blocks
    inserted so far) at its last use ``c_last``; its heap key ``S + lam * c_last`` orders
    blocks by their discounted count at any common later time. A block inserted now has no
    evidence of its own and is seeded optimistically with its parent cell's share,
    ``rho * count(parent) / children(parent)``.
    """
    clock = sc[_CLOCK]
    seed = -np.inf
    if k > lo:
        p = nodes[k - 1]
        seed = np.log(params[_RHO]) + _discounted(p, clock, ni, nf, params) - np.log(
            max(nf[p, _KIDS], 1.0))
    for r in range(lo, end):
        v = nodes[r]
        if r < k:
            nf[v, _S] = _logaddexp(_discounted(v, clock, ni, nf, params), 0.0)
        else:
            nf[v, _S] = _logaddexp(seed, 0.0)
            if parent[v] >= 0:
                nf[parent[v], _KIDS] += 1.0
        ni[v, _CLAST] = clock


# ---------------------------------------------------------------- one request
@nb.njit(cache=True)
def _request(kind, t, lo, hi, nodes, nu, parent, depth, capacity, params, ni, nf, sc,
             hkey, hnode, hver):
    k = lo
    while k < hi and ni[nodes[k], _CACHED] == 1:
        v = nodes[k]
        ni[v, _PIN] = t
        if kind == LRU:
            _unlink(ni, sc, v)
        elif kind == SIEVE:
            ni[v, _VISITED] = 1
        k += 1
    end = k
    for r in range(k, hi):
        if sc[_SIZE] >= capacity:
            u = _victim(kind, t, parent, depth, ni, nf, params, hkey, hnode, hver, sc)
            if u < 0:
                break
            if kind == LRU or kind == SIEVE:
                _unlink(ni, sc, u)
            ni[u, _CACHED] = 0
            sc[_SIZE] -= 1
            p = parent[u]
            if p >= 0:
                ni[p, _NCHILD] -= 1
                if ni[p, _NCHILD] == 0 and ni[p, _PIN] != t and kind != LRU and kind != SIEVE:
                    _push_leaf(kind, p, parent, depth, ni, nf, params, hkey, hnode, hver, sc)
        v = nodes[r]
        ni[v, _CACHED] = 1
        ni[v, _PIN] = t
        ni[v, _HITS] = 0
        ni[v, _VISITED] = 0
        sc[_SIZE] += 1
        sc[_CLOCK] += 1
        if parent[v] >= 0:
            ni[parent[v], _NCHILD] += 1
        if kind == SIEVE:
            _push_head(ni, sc, v)
        end = r + 1
    if kind == CANOPY:
        _canopy_update(lo, k, end, nodes, parent, ni, nf, sc, params)
    for r in range(lo, end):
        _touch(nodes[r], t, nu[r], ni)
    if kind == LRU:
        for r in range(end - 1, lo - 1, -1):  # freed tail first, as vLLM does
            _push_head(ni, sc, nodes[r])
    elif kind != SIEVE and end > lo:
        _push_leaf(kind, nodes[end - 1], parent, depth, ni, nf, params, hkey, hnode, hver, sc)
    return k - lo


@nb.njit(cache=True)
def _run(kind, t0, t1, offsets, nodes, nu, parent, depth, capacity, params, ni, nf, sc,
         hkey, hnode, hver, reused):
    for t in range(t0, t1):
        reused[t] = _request(kind, t, offsets[t], offsets[t + 1], nodes, nu, parent, depth,
                             capacity, params, ni, nf, sc, hkey, hnode, hver)


class RadixCache:
    """The cache for one trace's block universe, one policy and a capacity in blocks.

    ``policy`` is an eviction policy object from :mod:`canopy.apps.cache.policies`. Requests
    are processed in trace order with :meth:`run` (or :meth:`step`); ``reused_[i]`` holds the
    prefix-constrained number of blocks request ``i`` found cached.
    """

    def __init__(self, trace, policy, capacity: int) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)):
            raise TypeError(f"capacity must be an int, got {type(capacity).__name__}")
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1 block, got {capacity}")
        self.trace = trace
        self.policy = policy
        self.capacity = int(capacity)
        self.kind, self.params = policy.kernel(trace, self.capacity)
        n = trace.n_nodes
        self._nu = (next_use(trace.offsets, trace.nodes, n) if self.kind == OPTIMAL
                    else np.zeros(0, dtype=np.int64))
        self._ni = np.zeros((n, _NI), dtype=np.int64)
        self._ni[:, [_PIN, _PREV, _NEXT]] = -1
        self._nf = np.zeros((n, _NF), dtype=np.float64)
        self._sc = np.full(6, -1, dtype=np.int64)
        self._sc[[_SIZE, _HLEN, _CLOCK]] = 0
        heap = 2 * (trace.n_refs + trace.n_requests) + 16
        self._hkey = np.zeros(heap, dtype=np.float64)
        self._hnode = np.zeros(heap, dtype=np.int64)
        self._hver = np.zeros(heap, dtype=np.int64)
        self.reused_ = np.zeros(trace.n_requests, dtype=np.int64)
        self.next_request_ = 0

    def run(self, stop: int | None = None) -> np.ndarray:
        """Process requests up to ``stop`` (default: all); returns their reused blocks."""
        stop = self.trace.n_requests if stop is None else stop
        if not self.next_request_ <= stop <= self.trace.n_requests:
            raise ValueError(f"stop must be in {self.next_request_}..{self.trace.n_requests}, "
                             f"got {stop}")
        nu = self._nu if self.kind == OPTIMAL else self.trace.nodes  # unused unless optimal
        _run(self.kind, self.next_request_, stop, self.trace.offsets, self.trace.nodes, nu,
             self.trace.parent, self.trace.depth, self.capacity, self.params, self._ni,
             self._nf, self._sc, self._hkey, self._hnode, self._hver, self.reused_)
        start, self.next_request_ = self.next_request_, stop
        return self.reused_[start:stop]

    def step(self) -> int:
        """Process the next request; returns the blocks it reused."""
        return int(self.run(self.next_request_ + 1)[0])

    @property
    def size(self) -> int:
        """Blocks cached now."""
        return int(self._sc[_SIZE])

    def cached(self) -> np.ndarray:
        """Node ids cached now, ascending."""
        return np.flatnonzero(self._ni[:, _CACHED])
