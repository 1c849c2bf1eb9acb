"""Radix block cache: an ancestor-closed set of prefix-tree nodes under a block budget.

A request (a root-first path of blocks, :class:`~canopy.prefix.traces.Trace`) reuses its
longest cached prefix (reuse stops at the first miss), then inserts its remaining blocks. While
a request runs its blocks are pinned, as engines pin blocks with a positive reference count;
when the cache is full a victim is chosen among unpinned *leaves* only, so the cache stays
ancestor-closed (a node is cached only if its parent is). When every cached block is pinned
(a request longer than the cache), the rest of that request is not cached.

A request is served by one numba kernel per eviction structure, each keeping its hot scalars
in local variables (paper Section 4, "Serving systems": the prefix tree is the cache itself):

* ``LRU`` keeps an intrusive doubly linked free queue in vLLM's order (a finished request's
  blocks are appended tail first; the victim is the queue front, always a leaf);
* ``SIEVE`` keeps a list of the leaves in insertion order and a hand (Zhang et al., NSDI
  2024) walking it that skips pinned leaves and clears visited bits, so an eviction is
  O(1), as LRU's is. Inner nodes' bits are cleared lazily (a bit set before the hand's next
  pass over the node's position is cleared when the node becomes a leaf), which evicts
  exactly what a walk over every node would. A parent that becomes a leaf mostly takes its
  evicted child's place in the list, and the chain of blocks a request inserts is linked in
  once, when the request ends (only its newest block is a leaf);
* the priority policies (``LFU``, ``CANOPY``, ``OPTIMAL`` and ``PRIORITY``: any
  :class:`~canopy.prefix.policies.PriorityPolicy` with its own key function) keep a binary
  min-heap of evictable leaves with lazy deletion (per-node versions); a node is pushed when
  it becomes a leaf or a leaf is used. A key changes only when its node is used, so the heap
  is exact. ``CANOPY``'s main cache is LRU's queue while it evicts by recency (the same
  victims as the recency key's heap) and builds its heap, or re-keys it, when it switches
  arms.

A cache's state travels as a :class:`Cache` (node table, scalars, heap), ``CANOPY``'s shadows
as a :class:`ShadowState`; their owner, :class:`~canopy.prefix.blocks.BlockTree`, calls the
public kernels :func:`request`, :func:`replay`, :func:`canopy_request`, :func:`observe` and
:func:`priorities` (``_keyed`` for a policy's own key), and renumbers the tables after
forgetting with :func:`compact`.

``CANOPY`` values cells by statistics of the request stream (``_cells_update``, shared by
the main cache and its shadows) and replays a hashed sample of the requests in one
metadata-only shadow cache per arm (recency: LRU's kernel; a decayed arm: eviction by
sampling among its leaves, ``_sampled_request``, or the heap), see
:class:`~canopy.prefix.policies.Canopy`. At full rate the shadow of the arm the main cache
evicts by is a copy of the main cache, taken when the main cache switched to it: the
replay's kernels do not replay it at all (it *is* the main cache, which ``_adopt``
copies when the main cache leaves the arm); a cache served one request at a time copies
the main cache into it at the switch, a host its own cache (:func:`shadow_from_table`).
"""

from __future__ import annotations

from collections import namedtuple
from typing import Any

import numba as nb
import numpy as np

__all__ = ["CANOPY", "LFU", "LRU", "OPTIMAL", "PRIORITY", "SAMPLED", "SIEVE", "Cache",
           "ShadowState", "Shadows", "canopy_request", "canopy_shadows", "cell_counts",
           "cells_table", "compact", "next_use", "node_table", "observe", "priorities",
           "priorities_keyed", "replay", "replay_canopy", "replay_keyed", "request",
           "request_keyed", "scalars", "shadow_from_table", "shadow_heap_size", "unit_hash"]

LRU, LFU, SIEVE, CANOPY, OPTIMAL, PRIORITY = 0, 1, 2, 3, 4, 5
"""Kernel codes: the built-in policies, and ``PRIORITY``: a policy's own key function
``key(v, ni, depth, params)`` of node ``v``, its row of cache fields ``ni[v]`` (columns
``HITS``: uses since insertion, ``LAST``: the last request using it), its depth ``depth[v]``
(root blocks: 1) and the policy's parameter vector."""

# integer node fields (columns of ``ni``, one row a node for locality)
CACHED, NCHILD, PIN, VER, PREV, NEXT, HITS, LAST, VISITED, NEXT_USE = range(10)
_NI = 10
# SIEVE has no heap and counts nothing in the replay: its leaf list, the lap of the hand's
# next pass over a node whose visited bit is set, its insertion order and its parent (in the
# row the eviction reads anyway, not in a line of the trace's parent array) reuse those columns
LPREV, LNEXT, LAP, SEQ, PAR = VER, HITS, LAST, NEXT_USE, PREV
# ``CANOPY`` cell statistics (columns of ``cells``, one row a node of the prefix tree, cached
# or not): clock at the last use (-1: never used), children seen, then one discounted use
# count (as of the last use) per decayed arm
CELL_CLOCK, CELL_KIDS, CELL_S0 = range(3)
# scalars (``sc``): blocks cached, list ends, SIEVE's hand leaf, heap length, blocks
# referenced so far, the arm whose priority orders the heap (``CANOPY``: 0 recency, ``j >= 1``
# decayed arm j), SIEVE's leaf list ends, the hand's position (the insertion order it examines
# next) and laps, and the next insertion order
SIZE, HEAD, TAIL, HAND, HLEN, CLOCK, ARM, LHEAD, LTAIL, HPOS, LAPS, SEQN = range(12)
_SC = 12
Cache = namedtuple("Cache", "ni sc hkey hnode hver")
"""One cache's state, as the kernels take it: the node table (one row of the columns above a
node), the scalars, and the heap of the priority policies (keys, nodes, versions)."""

ShadowState = namedtuple("ShadowState",
                         "ac stats pairs got sm kinds capacity ni sc hkey hnode hver")
"""``canopy``'s shadows, as the kernels take them: sampling and switching configuration
(rate, discount, z, evidence, leaves a decayed shadow draws), the discounted statistics, the
switches and sample salt, and per arm (stacked on the first axis) its kernel code and a
:class:`Cache` of ``capacity`` blocks (a sampled shadow's leaf list in the heap's arrays)."""

# shadows' counters (``sm``): switches so far, the sample's hash salt, whether the shadows
# are at full rate and capacity (``FULL``: each replays every request at the main cache's
# size, and the shadow of the arm the main cache switches to takes the main cache's state),
# and whether the shadow of the main cache's arm rides on it (``RIDES``: at full rate, the
# main cache serving a trace's requests through these kernels; that shadow *is* the main
# cache and is not replayed)
SWITCHES, SALT, RIDES, FULL = range(4)
# a shadow's kernel code beside the policies': a decayed arm evicting by sampling
# (``Canopy.candidates``; ``CANOPY``: by its heap, as a main cache does)
SAMPLED = 6
# a sampled shadow keeps its evictable leaves in the heap's arrays,
# unordered (``hnode[:HLEN]``, their keys in ``hkey``), each leaf's slot there in its row's
# ``PREV`` (-1: not a leaf on the list; the shadow keeps no recency queue) and its draws'
# generator state in its ``CLOCK`` (a shadow reads its main cache's clock, never its own); a
# decayed arm's cache, sampled or a heap, holds the start of the cells' epoch its keys are
# scaled to in ``SEQN`` (SIEVE's alone)
SLOT, DRAW, EPOCH = PREV, CLOCK, SEQN
# the node fields that start at -1 (unpinned, unlinked); the rest start at 0
_UNSET = (PIN, PREV, NEXT)

# decayed-count configuration (``params``): prior weight, deepest depth, the cells' epoch
# length in referenced blocks, one decay rate (per referenced block) per decayed arm
RHO, DMAX, PERIOD, LAM0 = range(4)


_BARE: dict[str, Any] = {"cache": True, "_nrt": False}
"""Compile options of the kernels a replay calls once a request: without numba's reference
counting, which costs an atomic increment and decrement of every array argument a call and
of every array an inlined helper takes (half of a decayed main cache's time, measured). They
allocate nothing (the compiler refuses one that does), and what they call is compiled as they
are unless it names its own options: what allocates runs between their calls
(:func:`_canopy_loop`), and a policy's own key function goes through counted kernels
(:func:`_heap_request_counted`, :func:`_heap_compact`)."""
_COUNTED: dict[str, Any] = {"cache": True, "_nrt": True}
"""Compile options of a kernel reached from counted and uncounted callers alike."""


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
def _unlink(ni, head, tail, v):
    """Take ``v`` out of the list with ends ``head`` (newest) and ``tail``; returns the ends."""
    p, n = ni[v, PREV], ni[v, NEXT]
    if p >= 0:
        ni[p, NEXT] = n
    else:
        tail = n
    if n >= 0:
        ni[n, PREV] = p
    else:
        head = p
    ni[v, PREV] = -1
    ni[v, NEXT] = -1
    return head, tail


@nb.njit(cache=True, inline="always")
def _push_head(ni, head, tail, v):
    """Append ``v`` at the list's ``head``; returns the ends."""
    ni[v, PREV] = head
    ni[v, NEXT] = -1
    if head >= 0:
        ni[head, NEXT] = v
    else:
        tail = v
    return v, tail


# ---------------------------------------------------------------- SIEVE's hand over leaves
@nb.njit(cache=True, inline="always")
def _sieve_join(ni, a, n, lhead, ltail):
    """Link leaves ``a`` and ``n`` (-1: an end of the list) as neighbours, dropping what was
    between them; returns the list's ends (newest, oldest). (It takes the node table alone:
    an inlined helper that takes two arrays, or loops, costs reference counting per call.)"""
    if a >= 0:
        ni[a, LNEXT] = n
    else:
        ltail = n
    if n >= 0:
        ni[n, LPREV] = a
    else:
        lhead = a
    return lhead, ltail


@nb.njit(**_BARE)
def _sieve_request(t, lo, hi, nodes, parent, capacity, ni, sc):
    """SIEVE's request: :func:`request`'s steps with the hand over the leaf list. What every
    block reads (the size, the hand, the newest leaf, the next insertion order) is in locals,
    written back at the end; the rest (the hand's position and laps, the oldest leaf) stays
    in ``sc``, read where the hand wraps, a block is reused or a parent's bit is checked.

    The blocks a request inserts form a chain (a request is a root-first path) whose newest
    block is its only leaf: the list holds the chain's first block in its place until the
    request ends (pinned, the hand only passes it, as it would the chain's end).
    """
    size, hand, lhead, seqn = sc[SIZE], sc[HAND], sc[LHEAD], sc[SEQN]
    k = lo
    if k < hi and ni[nodes[k], CACHED] == 1:
        hpos, laps = sc[HPOS], sc[LAPS]
        while k < hi and ni[nodes[k], CACHED] == 1:
            v = nodes[k]
            ni[v, PIN] = t
            ni[v, VISITED] = 1  # the lap of the hand's next pass over v
            ni[v, LAP] = laps if ni[v, SEQ] >= hpos else laps + 1
            k += 1
    w = -1  # the newest block inserted
    for r in range(k, hi):
        if size >= capacity:
            u = hand
            if u < 0 or ni[u, PIN] == t or ni[u, VISITED] != 0:
                # mostly the hand rests on a leaf to evict; else it walks the leaves oldest
                # to newest and around, clearing visited bits, to the first unvisited
                # unpinned leaf, found within two laps (none: every leaf is pinned, every
                # bit cleared, the hand stays and the rest of the request is not cached)
                laps0, hpos0 = sc[LAPS], sc[HPOS]
                laps, hpos = laps0, hpos0
                while laps <= laps0 + 2:
                    if u < 0:
                        laps += 1
                        hpos = -1
                        u = sc[LTAIL]
                    elif ni[u, PIN] != t and ni[u, VISITED] == 0:
                        break
                    else:
                        ni[u, VISITED] = 0
                        hpos = ni[u, SEQ] + 1
                        u = ni[u, LNEXT]
                if laps > laps0 + 2:
                    sc[LAPS], sc[HPOS] = laps0 + 2, hpos0
                    break
                sc[LAPS], sc[HPOS] = laps, hpos
            after, n = ni[u, LPREV], ni[u, LNEXT]
            ni[u, CACHED] = 0  # its list links go stale: only leaves' are read
            size -= 1
            p = ni[u, PAR]
            if p >= 0:
                ni[p, NCHILD] -= 1
                if ni[p, NCHILD] > 0:
                    p = -1  # p is not a leaf yet
            if p >= 0 and n >= 0 and (after < 0 or ni[after, SEQ] < ni[p, SEQ]):
                # mostly: p becomes a leaf in u's place and the hand moves on, past it
                sc[HPOS] = ni[u, SEQ] + 1
                hand = n
                if ni[p, VISITED] == 1 and sc[LAPS] >= ni[p, LAP]:
                    ni[p, VISITED] = 0  # the hand passed p since its bit was set
                ni[p, LPREV] = after
                ni[p, LNEXT] = n
                ni[n, LPREV] = p
                if after >= 0:
                    ni[after, LNEXT] = p
                else:
                    sc[LTAIL] = p
            else:  # u out of the list and the hand past it; p after the newest older leaf
                if n < 0:  # the newest leaf (the newest block is a leaf): the hand starts over
                    sc[LAPS] += 1
                    sc[HPOS] = -1
                    hand = sc[LTAIL] if sc[LTAIL] != u else n
                else:
                    sc[HPOS] = ni[u, SEQ] + 1
                    hand = n
                lhead, sc[LTAIL] = _sieve_join(ni, after, n, lhead, sc[LTAIL])
                if p >= 0:
                    s = ni[p, SEQ]
                    if ni[p, VISITED] == 1 and (sc[LAPS] > ni[p, LAP] or (
                            sc[LAPS] == ni[p, LAP] and sc[HPOS] > s)):
                        ni[p, VISITED] = 0
                    while after >= 0 and ni[after, SEQ] > s:
                        after = ni[after, LPREV]
                    n = sc[LTAIL] if after < 0 else ni[after, LNEXT]
                    lhead, sc[LTAIL] = _sieve_join(ni, after, p, lhead, sc[LTAIL])
                    lhead, sc[LTAIL] = _sieve_join(ni, p, n, lhead, sc[LTAIL])
                    if s >= sc[HPOS] and (hand < 0 or s < ni[hand, SEQ]):
                        hand = p  # the hand rests on the first leaf at or after HPOS
        v = nodes[r]
        ni[v, CACHED] = 1
        ni[v, PIN] = t
        ni[v, VISITED] = 0
        ni[v, SEQ] = seqn
        seqn += 1
        size += 1
        if w >= 0:  # v extends the chain (its parent is w)
            ni[v, PAR] = w
            ni[w, NCHILD] = 1
            w = v
            continue
        w = v
        p = parent[v]
        ni[v, PAR] = p
        if p >= 0:
            ni[p, NCHILD] += 1
            if ni[p, NCHILD] == 1:  # p is no longer a leaf: out of the list
                if hand == p:
                    hand = v
                if p == lhead:
                    lhead = ni[p, LPREV]
                else:
                    pn = ni[p, LNEXT]
                    if hand == v:
                        hand = pn
                    lhead, sc[LTAIL] = _sieve_join(ni, ni[p, LPREV], pn, lhead, sc[LTAIL])
        lhead, sc[LTAIL] = _sieve_join(ni, lhead, v, lhead, sc[LTAIL])  # the newest leaf
        lhead = v
        ni[v, LNEXT] = -1
        if hand < 0:
            hand = v
    if w >= 0 and w != lhead:  # the chain's end takes its first block's place
        if hand == lhead:
            hand = w
        lhead, sc[LTAIL] = _sieve_join(ni, ni[lhead, LPREV], w, lhead, sc[LTAIL])
        lhead = w
        ni[w, LNEXT] = -1
    sc[SIZE], sc[HAND], sc[LHEAD], sc[SEQN] = size, hand, lhead, seqn
    return k - lo


# ---------------------------------------------------------------- heap with lazy deletion
@nb.njit(cache=True, inline="always")
def _heap_push(hkey, hnode, hver, n, key, v, ver):
    """Push onto the heap of ``n`` entries; returns its new length."""
    i = n
    while i > 0:
        up = (i - 1) >> 1
        if hkey[up] <= key:
            break
        hkey[i], hnode[i], hver[i] = hkey[up], hnode[up], hver[up]
        i = up
    hkey[i], hnode[i], hver[i] = key, v, ver
    return n + 1


@nb.njit(cache=True, inline="always")
def _heap_pop(hkey, hnode, hver, n):
    """Drop the root of the heap of ``n`` entries; returns its new length."""
    n -= 1
    key, v, ver = hkey[n], hnode[n], hver[n]
    i = 0
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n:  # the smaller child, by a flag's value: no branch to mispredict
            c += hkey[c + 1] < hkey[c]
        if hkey[c] >= key:
            break
        hkey[i], hnode[i], hver[i] = hkey[c], hnode[c], hver[c]
        i = c
    if n > 0:
        hkey[i], hnode[i], hver[i] = key, v, ver
    return n


# ---------------------------------------------------------------- policy hooks
@nb.njit(cache=True, inline="always")
def _key(kind, key, v, depth, ni, nf, params, arm):
    if key is not None:  # ``PRIORITY``; ``None`` for the built-in policies
        return key(v, ni, depth, params)
    if kind == LFU:
        return ni[v, HITS] * params[0] + ni[v, LAST]
    if kind == OPTIMAL:
        return -(ni[v, NEXT_USE] * params[0] + depth[v])
    if arm == 0:  # CANOPY; ``nf`` holds the cell statistics
        return _recency(v, depth, ni, params[DMAX])
    period = params[PERIOD]  # the cell is scaled to its epoch's start (see _cells_update)
    return np.log(nf[v, CELL_S0 + arm - 1]) + params[LAM0 + arm - 1] * period * np.floor(
        nf[v, CELL_CLOCK] / period)


@nb.njit(cache=True, inline="always")
def _cache_key(kind, key, v, depth, ni, nf, params, sc):
    """The key a cache's own heap holds: :func:`_key`, but a decayed ``CANOPY`` arm's as
    its count in the scale of the cells' epoch starting at ``sc[EPOCH]`` (:func:`_count`:
    the same order as the logarithm, without one a key; the heap is rescaled when an epoch
    begins, :func:`_keys_to_epoch`)."""
    arm = sc[ARM]
    if kind == CANOPY and key is None and arm > 0:
        return _count(v, nf, arm - 1, float(sc[EPOCH]), params[LAM0 + arm - 1], params[PERIOD])
    return _key(kind, key, v, depth, ni, nf, params, arm)


@nb.njit(cache=True, inline="always")
def _keys_to_epoch(v, nf, params, sc, keys, n):
    """Move the first ``n`` of a decayed ``CANOPY`` arm's ``keys`` (a heap, a sampled shadow's
    leaves) to the epoch of the request whose first block ``v`` has its cell updated already,
    when it is later than theirs (``sc[EPOCH]``): every key times one factor, so their order
    holds."""
    period = params[PERIOD]
    epoch = period * np.floor(nf[v, CELL_CLOCK] / period)
    if epoch > sc[EPOCH]:
        scale = np.exp(-params[LAM0 + sc[ARM] - 1] * (epoch - sc[EPOCH]))
        for i in range(n):  # a loop: a slice's ``*=`` allocates
            keys[i] *= scale
        sc[EPOCH] = int(epoch)


@nb.njit(cache=True, inline="always")
def _recency(v, depth, ni, dmax):
    """Recency, deepest first within a request (vLLM's tail-first order): LRU's order as a
    key, for blocks no deeper than ``dmax``."""
    return ni[v, LAST] * (dmax + 1.0) + dmax - depth[v]


@nb.njit(**_COUNTED)  # counted, from any caller: a policy's key may allocate
def _heap_compact(kind, key, depth, ni, nf, params, sc, hkey, hnode, hver, rekey):
    """Drop dead entries (when the heap array is full: rare, pushes are O(1) per request);
    with ``rekey``, also recompute every key (when ``CANOPY`` switches arms). In place, with
    no copy (the request kernels calling it allocate nothing): the live entries move to the
    front in their order, then are pushed in that order (pushing entry ``e`` never writes
    beyond slot ``e``)."""
    live = 0
    for e in range(sc[HLEN]):
        v, ver = hnode[e], hver[e]
        if ni[v, CACHED] == 1 and ni[v, NCHILD] == 0 and ni[v, VER] == ver:
            hkey[live], hnode[live], hver[live] = hkey[e], v, ver
            live += 1
    n = 0
    for e in range(live):
        v, ver = hnode[e], hver[e]
        k = _cache_key(kind, key, v, depth, ni, nf, params, sc) if rekey else hkey[e]
        n = _heap_push(hkey, hnode, hver, n, k, v, ver)
    sc[HLEN] = n


@nb.njit(cache=True, inline="always")
def _push_leaf(kind, key, v, k, depth, ni, nf, params, hkey, hnode, hver, sc, n):
    """Push leaf ``v`` with key ``k`` (retiring its older entries) onto the heap of ``n``
    entries, compacted first when full; returns the heap's new length."""
    if n == len(hkey):
        sc[HLEN] = n
        _heap_compact(kind, key, depth, ni, nf, params, sc, hkey, hnode, hver, False)
        n = sc[HLEN]
    ni[v, VER] += 1
    return _heap_push(hkey, hnode, hver, n, k, v, ni[v, VER])


@nb.njit(cache=True, inline="always")
def _touch(v, t, nu, ni):
    """Account one use of cached block ``v`` by request ``t``."""
    ni[v, HITS] += 1
    ni[v, LAST] = t
    ni[v, NEXT_USE] = nu


@nb.njit(cache=True, inline="always")
def _cells_update(lo, hi, nodes, parent, cells, sc, params, paths):
    """Cell values after a request used ``nodes[lo:hi]`` (all of them, cached or not).

    For each decayed arm ``j``, ``S_j(v)`` is ``v``'s use count discounted by
    ``2^{-(c - c_i) lam_j / ln 2}`` (``c``: blocks referenced so far). A cell stores it as of
    its last use ``c_last``, scaled by ``e^{lam_j (c_last - b)}`` where ``b`` is the start of
    ``c_last``'s epoch (a multiple of ``params[PERIOD]``): within an epoch a use adds
    ``e^{lam_j (c - b)}`` to the stored value, one exponential a request and arm rather than
    one a block, and only a cell last used in an older epoch is rescaled. A host's key
    ``log S_j + lam_j * c_last`` (:func:`_key`) orders blocks by their discounted count at any
    common later time, so keys never need rescaling; a cache's own heap holds the count in
    its epoch's scale instead (:func:`_cache_key`: no logarithm a key), every key rescaled
    when an epoch begins. The statistics are of the request
    stream, not of a cache: a block that is evicted and comes back resumes its history, and
    the main cache and every shadow read the same cells. A cell with less evidence of its own
    than its parent's share, ``rho * (S_j(parent) - 1) / children(parent)`` (the parent's
    count before this use, split over the children seen), starts from that share: optimism
    where evidence is thin, from the aggregate of the subtree above it.

    The arms go two at a time (an odd one out paired with itself), each pair one pass over
    the request with its counts in locals: where a block's parent is the block before it (a
    request's path), the parent's count before this use is carried from that block rather
    than read back. ``paths``: every request these cells have counted was a whole root-first
    path (a trace's, a tree the kernels serve; not a host's, which may count part of one), so
    once a block was never used before, neither was any block after it, each the only child
    seen of the one before: the rest of the request needs no cell read, its shares being
    ``rho`` (59% of the conversation trace's references, 33% of the synthetic one's).
    """
    clock, period, rho = sc[CLOCK], params[PERIOD], params[RHO]
    base = period * np.floor(clock / period)
    k = len(params) - LAM0
    for j0 in range(0, k, 2):
        j1 = min(j0 + 1, k - 1)
        l0, l1 = params[LAM0 + j0], params[LAM0 + j1]
        n0, n1 = np.exp(l0 * (clock - base)), np.exp(l1 * (clock - base))  # one use
        a0 = a1 = 0.0  # the parent's counts before this use, in this epoch's scale
        r = lo
        while r < hi:
            v = nodes[r]
            p = parent[v]
            last = cells[v, CELL_CLOCK]  # the clock is written in the last pass
            o0 = o1 = 0.0
            if last >= 0:
                o0, o1 = cells[v, CELL_S0 + j0], cells[v, CELL_S0 + j1]
                if last < base:  # last used in an older epoch: rescaled to this one
                    d = base - period * np.floor(last / period)
                    o0 *= np.exp(-l0 * d)
                    o1 *= np.exp(-l1 * d)
            if p >= 0:
                if last < 0 and j0 == 0:
                    cells[p, CELL_KIDS] += 1.0
                share = rho / cells[p, CELL_KIDS]
                if r == lo or p != nodes[r - 1]:  # not the block before: as stored
                    at = cells[p, CELL_CLOCK]
                    at -= period * np.floor(at / period)
                    a0 = n0 * (cells[p, CELL_S0 + j0] * np.exp(-l0 * at) - 1.0)
                    a1 = n1 * (cells[p, CELL_S0 + j1] * np.exp(-l1 * at) - 1.0)
                o0 = max(o0, share * a0)
                o1 = max(o1, share * a1)
            o0 += n0
            o1 += n1
            cells[v, CELL_S0 + j0], cells[v, CELL_S0 + j1] = o0, o1
            a0, a1 = o0 - n0, o1 - n1
            if j0 + 2 >= k:
                cells[v, CELL_CLOCK] = clock
            r += 1
            if last < 0 and paths:
                break
        while r < hi:  # blocks never used, each under the one before (``paths``): a0 >= 0
            if j0 == 0:
                cells[nodes[r - 1], CELL_KIDS] = 1.0  # its first child
            o0, o1 = rho * a0 + n0, rho * a1 + n1  # the share: rho / 1
            v = nodes[r]
            cells[v, CELL_S0 + j0], cells[v, CELL_S0 + j1] = o0, o1
            a0, a1 = o0 - n0, o1 - n1
            if j0 + 2 >= k:
                cells[v, CELL_CLOCK] = clock
            r += 1
    sc[CLOCK] = clock + hi - lo


def cell_counts(cells: np.ndarray, clock: float, params: np.ndarray) -> np.ndarray:
    """Each cell's discounted counts ``S_j`` at ``clock`` (one column a decayed arm), from
    the scaled values ``_cells_update`` stores."""
    last = cells[:, CELL_CLOCK]
    base = params[PERIOD] * np.floor(np.maximum(last, 0.0) / params[PERIOD])
    return cells[:, CELL_S0:] * np.exp(-np.outer(clock - base, params[LAM0:]))


# ---------------------------------------------------------------- one request
@nb.njit(**_BARE)
def _lru_request(t, lo, hi, nodes, nu, parent, capacity, ni, sc):
    """LRU's request: the victim is the free queue's front; a request's blocks join the
    queue's end when it finishes, deepest first (the queue's ends and the cache's size in
    locals). ``nu`` ``None``: a recency shadow, which keeps no use counts (no one reads its
    table but its kernels)."""
    size, head, tail = sc[SIZE], sc[HEAD], sc[TAIL]
    k = lo
    while k < hi and ni[nodes[k], CACHED] == 1:
        ni[nodes[k], PIN] = t
        head, tail = _unlink(ni, head, tail, nodes[k])
        k += 1
    end = k
    for r in range(k, hi):
        if size >= capacity:
            u = tail
            if u < 0:  # every cached block is pinned
                break
            head, tail = _unlink(ni, head, tail, u)
            ni[u, CACHED] = 0
            size -= 1
            if parent[u] >= 0:
                ni[parent[u], NCHILD] -= 1
        v = nodes[r]
        ni[v, CACHED] = 1
        ni[v, PIN] = t
        if nu is not None:
            ni[v, VISITED] = 0
            ni[v, HITS] = 0
        size += 1
        if parent[v] >= 0:
            ni[parent[v], NCHILD] += 1
        end = r + 1
    if nu is not None:
        for r in range(lo, end):
            _touch(nodes[r], t, nu[r], ni)
    for r in range(end - 1, lo - 1, -1):  # freed tail first, as vLLM does
        head, tail = _push_head(ni, head, tail, nodes[r])
    sc[SIZE], sc[HEAD], sc[TAIL] = size, head, tail
    return k - lo


@nb.njit(cache=True, inline="always")
def _heap_serve(kind, key, t, lo, hi, nodes, nu, parent, depth, capacity, params, ni, nf, sc,
                hkey, hnode, hver):
    """A priority policy's request: the victim is the unpinned leaf with the lowest key
    (:func:`_cache_key`), from a heap with lazy deletion (the heap's length and the cache's
    size in locals)."""
    size, n = sc[SIZE], sc[HLEN]
    if kind == CANOPY and sc[ARM] > 0 and hi > lo:
        _keys_to_epoch(nodes[lo], nf, params, sc, hkey, n)
    k = lo
    while k < hi and ni[nodes[k], CACHED] == 1:
        ni[nodes[k], PIN] = t
        if kind == CANOPY:  # its keys read no use counts: the cells, and the last use
            ni[nodes[k], LAST] = t
        k += 1
    end = k
    held, kheld = -1, 0.0  # a parent that just became the lowest leaf, kept off the heap
    for r in range(k, hi):
        if size >= capacity:
            u, held = held, -1
            while u < 0 and n > 0:
                v, ver = hnode[0], hver[0]
                n = _heap_pop(hkey, hnode, hver, n)
                if ni[v, CACHED] == 1 and ni[v, NCHILD] == 0 and ni[v, VER] == ver and (
                        ni[v, PIN] != t):  # else dead, or in use (pushed when it ends)
                    u = v
            if u < 0:  # every cached block is pinned
                break
            ni[u, CACHED] = 0
            size -= 1
            p = parent[u]
            if p >= 0:
                ni[p, NCHILD] -= 1
                if ni[p, NCHILD] == 0 and ni[p, PIN] != t:
                    # evicting a chain tail first: when the parent's key is at most every
                    # heap key it is the next victim, so skip its push and pop
                    ni[p, VER] += 1  # retires heap entries from when it was a leaf before
                    kp = _cache_key(kind, key, p, depth, ni, nf, params, sc)
                    if n == 0 or kp <= hkey[0]:
                        held, kheld = p, kp  # not used by this request: its key holds
                    else:
                        n = _push_leaf(kind, key, p, kp, depth, ni, nf, params, hkey, hnode,
                                       hver, sc, n)
        v = nodes[r]
        ni[v, CACHED] = 1
        ni[v, PIN] = t
        if kind == CANOPY:
            ni[v, LAST] = t
        else:
            ni[v, VISITED] = 0
            ni[v, HITS] = 0
        size += 1
        if parent[v] >= 0:
            ni[parent[v], NCHILD] += 1
        end = r + 1
    if held >= 0:
        n = _push_leaf(kind, key, held, kheld, depth, ni, nf, params, hkey, hnode, hver, sc, n)
    if kind != CANOPY:
        for r in range(lo, end):
            _touch(nodes[r], t, nu[r], ni)
    if end > lo:
        v = nodes[end - 1]
        n = _push_leaf(kind, key, v, _cache_key(kind, key, v, depth, ni, nf, params, sc),
                       depth, ni, nf, params, hkey, hnode, hver, sc, n)
    sc[SIZE], sc[HLEN] = size, n
    return k - lo


@nb.njit(**_BARE)
def _heap_request(kind, key, t, lo, hi, nodes, nu, parent, depth, capacity, params, ni, nf, sc,
                  hkey, hnode, hver):
    """:func:`_heap_serve` for the built-in keys (``key`` is ``None``)."""
    return _heap_serve(kind, key, t, lo, hi, nodes, nu, parent, depth, capacity, params, ni, nf,
                       sc, hkey, hnode, hver)


@nb.njit(cache=True)
def _heap_request_counted(kind, key, t, lo, hi, nodes, nu, parent, depth, capacity, params, ni,
                          nf, sc, hkey, hnode, hver):
    """:func:`_heap_serve` for a policy's own key function, with reference counting: the key
    is compiled as its caller is, and it may allocate."""
    return _heap_serve(kind, key, t, lo, hi, nodes, nu, parent, depth, capacity, params, ni, nf,
                       sc, hkey, hnode, hver)


@nb.njit(cache=True, inline="always")
def _leaf_drop(ni, lkey, lnode, n, v):
    """Take leaf ``v`` off a sampled shadow's unordered list of ``n`` leaves (the last one
    takes its slot); returns the list's new length."""
    i = ni[v, SLOT]
    n -= 1
    w = lnode[n]
    lnode[i], lkey[i] = w, lkey[n]
    ni[w, SLOT] = i
    ni[v, SLOT] = -1
    return n


@nb.njit(cache=True, inline="always")
def _count(v, nf, j, epoch, lam, period):
    """Decayed arm ``j``'s count of cell ``v`` in the scale of the epoch starting at clock
    ``epoch`` (``_cells_update``): as stored when ``v`` was last used in it, rescaled
    otherwise (rare). Within one scale the counts order blocks as :func:`_key` does."""
    at = nf[v, CELL_CLOCK]
    if at >= epoch:
        return nf[v, CELL_S0 + j]
    return nf[v, CELL_S0 + j] * np.exp(-lam * (epoch - period * np.floor(at / period)))


@nb.njit(**_BARE)
def _sampled_request(t, lo, hi, nodes, parent, capacity, params, ni, nf, sc, lkey, lnode,
                     draws):
    """A decayed arm's shadow request, evicting by sampling (as Redis and LHD do): the victim
    is the lowest-keyed of ``draws`` leaves drawn uniformly (with replacement) from the list
    of evictable leaves, every leaf when the list is no longer. A leaf's key is computed when
    it joins the list or is used, so a draw reads keys only. The list never holds a pinned
    block (a request's reused prefix ends in the one block that takes a child, dropped before
    the first eviction; its inserted blocks join at its end), and a parent left a leaf by its
    child's eviction is the next victim while its key is at most the rest of the draw's, so a
    chain's tail goes without a draw a block (waiting in registers, off the list, until a draw
    or the request's end puts it there). The draws' generator (xorshift64) is seeded by
    the sample's salt. Keys are the arm's counts in the scale of one epoch of the cells
    (:func:`_count`; the list is rescaled when an epoch begins): no logarithm a block."""
    size, n, rng = sc[SIZE], sc[HLEN], sc[DRAW]
    j, period = sc[ARM] - 1, params[PERIOD]
    lam = params[LAM0 + j]
    if hi > lo:
        _keys_to_epoch(nodes[lo], nf, params, sc, lkey, n)
    epoch = float(sc[EPOCH])
    k = lo
    while k < hi and ni[nodes[k], CACHED] == 1:
        ni[nodes[k], PIN] = t
        k += 1
    end = k
    if lo < k < hi and ni[nodes[k - 1], SLOT] >= 0:  # it takes a child: no longer a leaf
        n = _leaf_drop(ni, lkey, lnode, n, nodes[k - 1])
    # the parent left a leaf and its key, kept off the list (in registers) while it is the
    # next victim; the lowest key the last draw left
    held, hk, rest = -1, 0.0, 0.0
    for r in range(k, hi):
        if size >= capacity:
            if held >= 0 and hk <= rest:
                u = held
            else:
                if held >= 0:  # it joins the list now, in the slot it would have held
                    ni[held, SLOT] = n
                    lnode[n], lkey[n] = held, hk
                    n += 1
                    held = -1
                if n == 0:  # every cached block is pinned
                    break
                best, bk, rest = -1, np.inf, np.inf
                if n <= draws:  # without a branch on the keys (a coin flip a leaf)
                    for i in range(n):
                        x = lkey[i]
                        rest = min(rest, max(x, bk))  # the runner-up: the old best, or x
                        best = i if x < bk else best
                        bk = min(bk, x)
                else:
                    for _ in range(draws):
                        rng ^= rng << 13
                        rng ^= (rng >> 7) & 0x1FFFFFFFFFFFFFF
                        rng ^= rng << 17
                        i = ((rng >> 32) & 0xFFFFFFFF) * n >> 32
                        x = lkey[i]
                        # a leaf drawn twice counts once (were x < bk, i could not be best)
                        rest = rest if i == best else min(rest, max(x, bk))
                        best = i if x < bk else best
                        bk = min(bk, x)
                u = lnode[best]
                n = _leaf_drop(ni, lkey, lnode, n, u)
            held = -1
            ni[u, CACHED] = 0
            size -= 1
            p = parent[u]
            if p >= 0:
                ni[p, NCHILD] -= 1
                if ni[p, NCHILD] == 0 and ni[p, PIN] != t:  # p a leaf, held
                    held, hk = p, _count(p, nf, j, epoch, lam, period)
        v = nodes[r]  # a decayed key reads the cells only: no use counts here
        ni[v, CACHED] = 1
        ni[v, PIN] = t
        size += 1
        if parent[v] >= 0:
            ni[parent[v], NCHILD] += 1
        end = r + 1
    if held >= 0:
        ni[held, SLOT] = n
        lnode[n], lkey[n] = held, hk
        n += 1
    if end > lo and ni[nodes[end - 1], NCHILD] == 0:  # the request's last block: a leaf
        v = nodes[end - 1]
        if ni[v, SLOT] < 0:
            ni[v, SLOT] = n
            lnode[n] = v
            n += 1
        lkey[ni[v, SLOT]] = _count(v, nf, j, epoch, lam, period)
    sc[SIZE], sc[HLEN], sc[DRAW] = size, n, rng
    return k - lo


@nb.njit(cache=True)
def _serve(kind, key, t, lo, hi, nodes, nu, parent, depth, capacity, params, ni, nf, sc, hkey,
           hnode, hver):
    if key is not None:  # a policy's own key (numba compiles out the branches not taken)
        return _heap_request_counted(kind, key, t, lo, hi, nodes, nu, parent, depth, capacity,
                                     params, ni, nf, sc, hkey, hnode, hver)
    if kind == SIEVE:
        return _sieve_request(t, lo, hi, nodes, parent, capacity, ni, sc)
    if kind == LRU:
        return _lru_request(t, lo, hi, nodes, nu, parent, capacity, ni, sc)
    return _heap_request(kind, key, t, lo, hi, nodes, nu, parent, depth, capacity, params, ni,
                         nf, sc, hkey, hnode, hver)


@nb.njit(cache=True)
def request(kind, t, lo, hi, nodes, nu, parent, depth, capacity, params, nf, c):
    """Serve request ``t``, ``nodes[lo:hi]`` (``nu``: their next uses, read by ``OPTIMAL``),
    of a built-in policy ``kind`` in :class:`Cache` ``c``: reuse its cached prefix, insert the
    rest, evict; returns the blocks reused."""
    ni, sc, hkey, hnode, hver = c
    return _serve(kind, None, t, lo, hi, nodes, nu, parent, depth, capacity, params, ni, nf,
                  sc, hkey, hnode, hver)


@nb.njit(cache=True)
def request_keyed(key, t, lo, hi, nodes, nu, parent, depth, capacity, params, nf, c):
    """:func:`request` for a policy evicting the leaf with the lowest ``key(v, ni, depth,
    params)`` (compiled for each key function, once a process)."""
    ni, sc, hkey, hnode, hver = c
    return _serve(PRIORITY, key, t, lo, hi, nodes, nu, parent, depth, capacity, params, ni, nf,
                  sc, hkey, hnode, hver)


@nb.njit(cache=True)
def _run(kind, key, t0, t1, offsets, nodes, nu, parent, depth, capacity, params, nf, c, reused):
    ni, sc, hkey, hnode, hver = c
    if key is not None:  # a policy's own key (numba compiles out the branches not taken)
        for t in range(t0, t1):
            reused[t] = _heap_request_counted(kind, key, t, offsets[t], offsets[t + 1], nodes,
                                              nu, parent, depth, capacity, params, ni, nf, sc,
                                              hkey, hnode, hver)
    elif kind == SIEVE:  # one loop a structure: one call a request
        for t in range(t0, t1):
            reused[t] = _sieve_request(t, offsets[t], offsets[t + 1], nodes, parent, capacity,
                                       ni, sc)
    elif kind == LRU:
        for t in range(t0, t1):
            reused[t] = _lru_request(t, offsets[t], offsets[t + 1], nodes, nu, parent,
                                     capacity, ni, sc)
    else:
        for t in range(t0, t1):
            reused[t] = _heap_request(kind, key, t, offsets[t], offsets[t + 1], nodes, nu,
                                      parent, depth, capacity, params, ni, nf, sc, hkey, hnode,
                                      hver)


@nb.njit(cache=True)
def replay(kind, t0, t1, offsets, nodes, nu, parent, depth, capacity, params, nf, c,
           reused):
    """Serve requests ``t0..t1 - 1`` of a trace (``offsets``, ``nodes``) under built-in
    policy ``kind`` in :class:`Cache` ``c``, each one's reuse into ``reused``."""
    _run(kind, None, t0, t1, offsets, nodes, nu, parent, depth, capacity, params, nf, c, reused)


@nb.njit(cache=True)
def replay_keyed(key, t0, t1, offsets, nodes, nu, parent, depth, capacity, params, nf, c,
                 reused):
    """:func:`replay` under a policy's own key function."""
    _run(PRIORITY, key, t0, t1, offsets, nodes, nu, parent, depth, capacity, params, nf, c,
         reused)


# ---------------------------------------------------------------- canopy: arms on shadows
@nb.njit(cache=True, inline="always")
def unit_hash(v, salt):
    """splitmix64 of a node id (salted by the sample seed), mapped to [0, 1): the spatial
    hash that picks the sample."""
    z = np.uint64(v) + np.uint64(salt) * np.uint64(0xD1B54A32D192ED03) + np.uint64(
        0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)) * (1.0 / 9007199254740992.0)


@nb.njit(cache=True, inline="always")
def _score(stats, pairs, got, gamma):
    """Fold one sampled request's shadow reuse ``got[a]`` into the discounted statistics:
    ``stats[a]`` sums reuse, ``stats[-1]`` the weights, ``pairs[0, a, b]`` and
    ``pairs[1, a, b]`` the paired differences ``got[a] - got[b]`` and their squares. Each
    pair is computed once, for ``a < b``: ``pairs[0, b, a]`` is its exact negation (a
    rounding is symmetric in sign) and ``pairs[1, b, a]`` the same value; the diagonal
    stays 0."""
    k = len(got)
    stats[k] = gamma * stats[k] + 1.0
    for a in range(k):
        stats[a] = gamma * stats[a] + got[a]
        for b in range(a + 1, k):
            d = got[a] - got[b]
            x = gamma * pairs[0, a, b] + d
            y = gamma * pairs[1, a, b] + d * d
            pairs[0, a, b], pairs[0, b, a] = x, 0.0 - x
            pairs[1, a, b], pairs[1, b, a] = y, y


@nb.njit(cache=True, inline="always")
def _leads(stats, pairs, a, b, z, min_n):
    """Whether arm ``a``'s discounted mean reuse exceeds arm ``b``'s by ``z`` standard errors
    of the paired difference (the weight sum ``n`` understates the effective sample size, so
    the test is conservative); never on less than ``min_n`` of weight, where the variance
    estimate itself is unreliable."""
    n = stats[len(stats) - 1]
    if n < min_n:
        return False
    mean = pairs[0, a, b] / n
    var = max(pairs[1, a, b] / n - mean * mean, 0.0)
    return mean > 0.0 and mean > z * np.sqrt(var / n)


@nb.njit(cache=True)
def replay_canopy(t0, t1, offsets, nodes, parent, depth, capacity, params, cells, c, arms,
                reused):
    """Canopy's replay: update the cells, evict by the current arm; on a hashed sample of
    requests, replay every arm in its shadow cache, fold its reuse into discounted statistics
    and switch the main cache to the best arm once it leads the current one significantly.
    ``offsets``, ``nodes``: the whole trace, served from its first request on."""
    _canopy_loop(t0, t1, 0, offsets, nodes, parent, depth, capacity, params, cells, c, arms,
                 reused)


@nb.njit(cache=True)
def canopy_request(t, lo, hi, nodes, parent, depth, capacity, params, cells, c, arms):
    """One request of ``canopy`` (``nodes[lo:hi]``) in :class:`Cache` ``c`` with its cells and
    its shadows (:class:`ShadowState`); returns the blocks it reused."""
    reused = np.zeros(1, dtype=np.int64)
    _canopy_loop(t, t + 1, t, np.array([lo, hi]), nodes, parent, depth, capacity, params,
                 cells, c, arms, reused)
    return reused[0]


@nb.njit(cache=True)
def _canopy_loop(t0, t1, first, offsets, nodes, parent, depth, capacity, params, cells, c,
                 arms, reused):
    """Requests ``t0..t1 - 1`` of ``canopy``, request ``t`` being ``nodes[offsets[t - first]:
    offsets[t - first + 1]]``, its reuse stored in ``reused[t - first]``: ``first`` is 0 when
    the cache served the requests before ``t0`` from the same ``nodes`` and ``offsets`` (a
    trace's replay, a cache's first request).

    On the recency arm the main cache is LRU's queue (:func:`_lru_request`): its front is the
    unpinned block with the lowest recency key, a leaf, so it evicts what the recency key's
    heap would, at LRU's cost; a decayed arm evicts from the heap. A switch builds the other
    structure once. The requests run in :func:`_canopy_run`, without reference counting;
    what allocates (a shadow's copy of the main cache, the queue rebuilt from the heap) runs
    here, between its calls."""
    ni, sc, hkey, hnode, hver = c
    sm = arms.sm
    t = t0
    while t < t1:
        t, arm = _canopy_run(t, t1, first, offsets, nodes, parent, depth, capacity, params,
                             cells, c, arms, reused)
        if sc[ARM] == arm:  # no switch: the last request is served
            break
        # the main cache switched arms after request t - 1; the rows it wrote: of the nodes
        # of the requests so far when they are at hand, else of every node
        rows = 0
        if sm[FULL] == 1:
            rows = len(ni) if first > 0 else _rows(nodes[offsets[0]:offsets[t - first]])
        if sm[RIDES] == 1:  # the shadow of the arm left was the main cache: now a copy
            _adopt(c, arms, arm, rows)
        if sc[ARM] == 0:
            _queue_from_heap(parent, depth, ni, params, sc, hnode, hver)
        elif arm == 0:
            _heap_from_queue(depth, ni, cells, params, sc, hkey, hnode, hver)
        else:
            _heap_compact(CANOPY, None, depth, ni, cells, params, sc, hkey, hnode, hver, True)
        if sm[FULL] == 1 and sm[RIDES] == 0:  # the new arm's shadow takes the main cache
            _adopt(c, arms, sc[ARM], rows)


@nb.njit(**_BARE)
def _canopy_run(t0, t1, first, offsets, nodes, parent, depth, capacity, params, cells, c,
                arms, reused):
    """:func:`_canopy_loop`'s requests from ``t0``, up to ``t1`` or the first switch of arms
    (what follows one allocates); returns the next request and the arm the main cache evicted
    by before it. The states are unpacked out of the loop and the hot calls made from it
    directly: a tuple unpacked, or a call with every state passed, per request costs more
    than a recency request. (At full rate only an empty request is out of the sample, and it
    changes no cache: a riding shadow stays the main cache.)"""
    ni, sc, hkey, hnode, hver = c
    ac, stats, pairs, got, sm, skinds, scap, sni, ssc, shkey, shnode, shver = arms
    rate, salt = ac[0], sm[SALT]
    for t in range(t0, t1):
        lo, hi = offsets[t - first], offsets[t - first + 1]
        sampled = hi > lo and (rate >= 1.0 or unit_hash(nodes[min(lo + 1, hi - 1)], salt) < rate)
        _cells_update(lo, hi, nodes, parent, cells, sc, params, True)
        arm = sc[ARM]
        if arm == 0:
            reused[t - first] = _lru_request(t, lo, hi, nodes, nodes, parent, capacity, ni, sc)
        else:
            reused[t - first] = _heap_request(CANOPY, None, t, lo, hi, nodes, nodes, parent,
                                              depth, capacity, params, ni, cells, sc, hkey,
                                              hnode, hver)
        if sampled and _shadows_step(t, lo, hi, nodes, parent, depth, params, cells, sc, ac,
                                     stats, pairs, got, sm, skinds, scap, sni, ssc, shkey,
                                     shnode, shver, reused[t - first]):
            return t + 1, arm
    return t1, sc[ARM]


@nb.njit(cache=True)
def _rows(seen):
    """The rows up to the highest node in ``seen``: all a cache that served only those
    nodes wrote."""
    m = 0
    for v in seen:
        m = max(m, v + 1)
    return m


@nb.njit(cache=True)
def _adopt(c, arms, a, rows):
    """Make shadow ``a`` a copy of the main cache :class:`Cache` ``c`` (at full rate: the same
    capacity; a decayed arm's shadow evicts by its heap from now on, as the main cache does,
    so it replays what the main cache would): its first ``rows`` rows (the rest neither ever
    wrote), its scalars but its arm, and its heap."""
    ni, sc, hkey, hnode, hver = c
    sni, ssc = arms.ni[a], arms.sc[a]
    if a > 0:
        arms.kinds[a] = CANOPY
    sni[:rows] = ni[:rows]
    ssc[:] = sc
    ssc[ARM] = a
    h = sc[HLEN]
    arms.hkey[a][:h], arms.hnode[a][:h], arms.hver[a][:h] = hkey[:h], hnode[:h], hver[:h]


@nb.njit(cache=True)
def shadow_from_table(src, parent, depth, cells, params, sc, arms):
    """A host's part of a switch at full rate: the shadow of the main cache's new arm
    ``sc[ARM]`` takes the blocks the host holds (``src[:, CACHED]``, each with its last use),
    in the structure the main cache of the replay builds at a switch (LRU's queue in recency
    order, then the heap of its leaves for a decayed arm)."""
    a = sc[ARM]
    dst, dsc = arms.ni[a], arms.sc[a]
    if a > 0:
        arms.kinds[a] = CANOPY
    dst[:] = 0
    for column in _UNSET:
        dst[:, column] = -1
    held = np.empty(len(src), dtype=np.int64)
    m = 0
    for v in range(len(src)):
        if src[v, CACHED] == 1:
            dst[v, CACHED] = 1
            dst[v, LAST] = src[v, LAST]
            held[m] = v
            m += 1
            if parent[v] >= 0:
                dst[parent[v], NCHILD] += 1
    dsc[SIZE], dsc[HLEN], dsc[CLOCK] = m, 0, sc[CLOCK]
    _queue_of(held[:m], depth, dst, params, dsc)
    if a > 0:
        _heap_from_queue(depth, dst, cells, params, dsc, arms.hkey[a], arms.hnode[a],
                         arms.hver[a])


@nb.njit(cache=True)
def _heap_from_queue(depth, ni, nf, params, sc, hkey, hnode, hver):
    """The heap of a cache leaving the recency arm: its leaves (every block is in LRU's queue
    between requests) keyed by the new arm."""
    period = params[PERIOD]
    sc[EPOCH] = int(period * np.floor(sc[CLOCK] / period))  # the next request's epoch
    n = 0
    v = sc[TAIL]
    while v >= 0:
        if ni[v, NCHILD] == 0:
            ni[v, VER] += 1
            n = _heap_push(hkey, hnode, hver, n, _cache_key(CANOPY, None, v, depth, ni, nf,
                                                            params, sc), v, ni[v, VER])
        v = ni[v, NEXT]
    sc[HLEN] = n


@nb.njit(cache=True)
def _queue_from_heap(parent, depth, ni, params, sc, hnode, hver):
    """LRU's queue of a cache returning to the recency arm: every cached block (the heap's
    live leaves and their ancestors, marked by ``NEXT = -2`` as they are found) in recency
    order, oldest at the front."""
    held = np.empty(sc[SIZE], dtype=np.int64)
    m = 0
    for e in range(sc[HLEN]):
        v = hnode[e]
        if ni[v, CACHED] == 1 and ni[v, NCHILD] == 0 and ni[v, VER] == hver[e]:
            while v >= 0 and ni[v, NEXT] != -2:
                ni[v, NEXT] = -2
                held[m] = v
                m += 1
                v = parent[v]
    _queue_of(held[:m], depth, ni, params, sc)


@nb.njit(cache=True)
def _queue_of(held, depth, ni, params, sc):
    """LRU's queue of the blocks ``held`` (every cached block): recency order, oldest at
    the front."""
    keys = np.empty(len(held))
    for i in range(len(held)):
        keys[i] = _recency(held[i], depth, ni, params[DMAX])
    head, tail = -1, -1
    for i in np.argsort(keys):
        head, tail = _push_head(ni, head, tail, held[i])
    sc[HEAD], sc[TAIL] = head, tail


@nb.njit(cache=True)
def canopy_shadows(t, lo, hi, nodes, parent, depth, params, cells, sc, arms):
    """When request ``nodes[lo:hi]`` is in the hashed sample, replay it in every arm's shadow
    cache (:class:`ShadowState`), fold the shadows' reuse into the statistics and switch
    ``sc[ARM]`` to the best arm once it leads significantly; returns whether the arm
    switched."""
    ac, stats, pairs, got, sm, skinds, scap, sni, ssc, shkey, shnode, shver = arms
    if hi == lo or unit_hash(nodes[min(lo + 1, hi - 1)], sm[SALT]) >= ac[0]:
        return False
    return _shadows_step(t, lo, hi, nodes, parent, depth, params, cells, sc, ac, stats, pairs,
                         got, sm, skinds, scap, sni, ssc, shkey, shnode, shver, 0)


@nb.njit(cache=True, inline="always")
def _shadows_step(t, lo, hi, nodes, parent, depth, params, cells, sc, ac, stats, pairs, got,
                  sm, skinds, scap, sni, ssc, shkey, shnode, shver, main_reused):
    """:func:`canopy_shadows` on a sampled request, the shadows' state unpacked;
    ``main_reused``: the main cache's reuse, that of the shadow riding on it."""
    for a in range(len(skinds)):
        if a == sc[ARM] and sm[RIDES] == 1:
            got[a] = main_reused
        elif skinds[a] == LRU:
            got[a] = _lru_request(t, lo, hi, nodes, None, parent, scap, sni[a], ssc[a])
        elif skinds[a] == SAMPLED:
            got[a] = _sampled_request(t, lo, hi, nodes, parent, scap, params, sni[a], cells,
                                      ssc[a], shkey[a], shnode[a], int(ac[4]))
        else:
            got[a] = _heap_request(CANOPY, None, t, lo, hi, nodes, nodes, parent, depth, scap,
                                   params, sni[a], cells, ssc[a], shkey[a], shnode[a],
                                   shver[a])
    _score(stats, pairs, got, ac[1])
    best = 0  # the first arm of the highest score, without a slice a request
    for a in range(1, len(skinds)):
        if stats[a] > stats[best]:
            best = a
    if best != sc[ARM] and _leads(stats, pairs, best, sc[ARM], ac[2], ac[3]):
        sc[ARM] = best
        sm[SWITCHES] += 1
        return True
    return False


# ---------------------------------------------------------------- online: a host's cache
@nb.njit(cache=True)
def observe(kind, t, nodes, parent, params, ni, cells, sc, seq):
    """Account one request admitted by a host that keeps the cache itself: ``CANOPY``'s cells
    (``_cells_update``), then each block's use as :func:`request` accounts it (a block
    the host does not hold is (re)inserted: hit count restarts, SIEVE's visited bit clears and
    ``NEXT_USE`` takes the insertion order ``seq``). Returns the next insertion order."""
    if kind == CANOPY:
        _cells_update(0, len(nodes), nodes, parent, cells, sc, params, False)
    for v in nodes:
        if ni[v, CACHED] == 0:
            ni[v, CACHED] = 1
            ni[v, HITS] = 0
            ni[v, VISITED] = 0
            sc[SIZE] += 1
            _touch(v, t, seq, ni)
            seq += 1
        else:
            ni[v, VISITED] = 1
            _touch(v, t, ni[v, NEXT_USE], ni)
    return seq


@nb.njit(cache=True)
def _rank(kind, key, nodes, depth, ni, cells, params, sc, out):
    """The eviction key of each node in ``nodes`` for a host (lower evicts first): the replay's
    heap key (``LFU``, ``CANOPY``), recency for ``LRU``, insertion order for ``SIEVE``."""
    for i in range(len(nodes)):
        out[i] = _host_key(kind, key, nodes[i], depth, ni, cells, params, sc)


@nb.njit(cache=True, inline="always")
def _host_key(kind, key, v, depth, ni, cells, params, sc):
    """:func:`_rank`'s key of one node."""
    if kind == LRU:
        return _recency(v, depth, ni, params[DMAX])
    if kind == SIEVE:
        return float(ni[v, NEXT_USE])
    return _key(kind, key, v, depth, ni, cells, params, sc[ARM])


@nb.njit(cache=True)
def priorities(kind, nodes, depth, ni, cells, params, sc, out):
    """The eviction key of each node in ``nodes`` for a host (lower evicts first) under
    built-in policy ``kind``: the replay's heap key (``LFU``, ``CANOPY``), recency for
    ``LRU``, insertion order for ``SIEVE``."""
    _rank(kind, None, nodes, depth, ni, cells, params, sc, out)


@nb.njit(cache=True)
def priorities_keyed(key, nodes, depth, ni, cells, params, sc, out):
    """:func:`priorities` under a policy's own key function."""
    _rank(PRIORITY, key, nodes, depth, ni, cells, params, sc, out)


# ---------------------------------------------------------------- online: a host's free blocks
# A host's evictable set, kept beside an observed tree (:class:`Evictable`): per node its free
# blocks (a list through the block table, oldest release first), the blocks the host holds
# under it, the release stamp and the key of its entry; per engine block its node and list
# links; a min-heap of the free *leaves* by (key, stamp) with lazy deletion (the node table's
# ``VER``), and the node table's ``NCHILD`` counting the blocks the host holds under a node's
# children. A free node enters the heap when it becomes a leaf (freed with nothing held under
# it, or its last child block gone) and when it is re-keyed as one; an entry whose node holds
# a child block again is dropped when it surfaces (the node comes back once a leaf).
EFREE, EHELD, ESTAMP, EHEAD, ETAIL = range(5)
_EK = 5
BNODE, BPREV, BNEXT, BFREE, BSTAMP = range(5)
_BK = 5
ELEN, ESEQ, EHAND = range(3)
Evictable = namedtuple("Evictable", "ek nkey blocks hkey hstamp hnode hver es")
"""A host's evictable set: the per-node table (``EFREE`` ... ``ETAIL``) and key, the per-block
table (``BNODE`` ... ``BSTAMP``: a free block's release stamp, its place in release order),
the heap (keys, stamps, nodes, versions) and its scalars (heap length, next stamp, SIEVE's
hand: the insertion order of its last victim). The kernels take it as a plain tuple in this
order (numba reads a named one at twice the cost a call)."""


# The kernels unpack the set once; its helpers take its arrays (an array read from the tuple
# inside a helper is reference-counted at each call, which made a victim cost four times as
# much): ``ek, nkey, blocks`` and the heap ``hk, hs, hn, hv`` (keys, stamps, nodes, versions)
# with its scalars ``es``.
@nb.njit(cache=True, inline="always")
def _ev_push(hk, hs, hn, hv, es, k, stamp, v, ver):
    """Push ``(k, stamp)`` for node ``v`` onto the evictable heap."""
    i = es[ELEN]
    while i > 0:
        up = (i - 1) >> 1
        if hk[up] < k or (hk[up] == k and hs[up] <= stamp):
            break
        hk[i], hs[i], hn[i], hv[i] = hk[up], hs[up], hn[up], hv[up]
        i = up
    hk[i], hs[i], hn[i], hv[i] = k, stamp, v, ver
    es[ELEN] += 1


@nb.njit(cache=True, inline="always")
def _ev_pop(hk, hs, hn, hv, es):
    """Drop the evictable heap's root."""
    n = es[ELEN] - 1
    es[ELEN] = n
    k, stamp, v, ver = hk[n], hs[n], hn[n], hv[n]
    i = 0
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and (hk[c + 1] < hk[c] or (hk[c + 1] == hk[c] and hs[c + 1] < hs[c])):
            c += 1
        if hk[c] > k or (hk[c] == k and hs[c] >= stamp):
            break
        hk[i], hs[i], hn[i], hv[i] = hk[c], hs[c], hn[c], hv[c]
        i = c
    if n > 0:
        hk[i], hs[i], hn[i], hv[i] = k, stamp, v, ver


@nb.njit(cache=True, inline="always")
def _ev_unfree(ek, blocks, b):
    """Take free block ``b`` off its node's free list."""
    v, p, q = blocks[b, BNODE], blocks[b, BPREV], blocks[b, BNEXT]
    if p >= 0:
        blocks[p, BNEXT] = q
    else:
        ek[v, EHEAD] = q
    if q >= 0:
        blocks[q, BPREV] = p
    else:
        ek[v, ETAIL] = p
    blocks[b, BFREE] = 0
    ek[v, EFREE] -= 1


@nb.njit(cache=True, inline="always")
def _ev_drop(ek, nkey, blocks, hk, hs, hn, hv, es, b, parent, ni):
    """Forget block ``b`` (the host reused it or dropped its key); its node's parent, free
    and a leaf now, enters the heap at its key and stamp (its older entries retired). One
    exit: an early return made a kernel's loop calling it half as fast again."""
    v = blocks[b, BNODE]
    if v >= 0:
        if blocks[b, BFREE]:
            _ev_unfree(ek, blocks, b)
        ek[v, EHELD] -= 1
        p = parent[v]
        if p >= 0 and ni[p, NCHILD] > 0:
            ni[p, NCHILD] -= 1
            if ni[p, NCHILD] == 0 and ek[p, EFREE] > 0:
                ni[p, VER] += 1
                _ev_push(hk, hs, hn, hv, es, nkey[p], ek[p, ESTAMP], p, ni[p, VER])
        blocks[b, BNODE] = -1


@nb.njit(cache=True, inline="always")
def _ev_keys(kind, key, nodes, depth, ni, cells, params, sc):
    """The host's key of each of ``nodes`` (:func:`_host_key`), in a loop of its own (in a
    kernel's loop over blocks it measured ten times as costly; a node's key reads nothing a
    release or a hit writes)."""
    out = np.empty(len(nodes))
    for i in range(len(nodes)):
        out[i] = _host_key(kind, key, nodes[i], depth, ni, cells, params, sc)
    return out


@nb.njit(cache=True)
def evictable_release(kind, key, ids, nodes, parent, depth, ni, cells, params, sc, ev):
    """The host freed blocks ``ids[i]`` caching node ``nodes[i]``, in that order: each joins
    its node's free list; a node with its first free block is keyed now and stamped by this
    release (ties evict the older release first), and enters the heap if nothing is held
    under it (a request's blocks, freed deepest first: its deepest block)."""
    ek, nkey, blocks, hk, hs, hn, hv, es = ev
    keys = _ev_keys(kind, key, nodes, depth, ni, cells, params, sc)
    stamp = es[ESEQ]  # the next stamp, one a block
    for i in range(len(ids)):
        b, v = ids[i], nodes[i]
        if blocks[b, BNODE] != v:
            _ev_drop(ek, nkey, blocks, hk, hs, hn, hv, es, b, parent, ni)
            blocks[b, BNODE] = v
            ek[v, EHELD] += 1
            if parent[v] >= 0:
                ni[parent[v], NCHILD] += 1
        elif blocks[b, BFREE]:
            _ev_unfree(ek, blocks, b)  # freed twice: now the newest
        t = ek[v, ETAIL]
        blocks[b, BPREV], blocks[b, BNEXT], blocks[b, BFREE] = t, -1, 1
        blocks[b, BSTAMP] = stamp
        if t >= 0:
            blocks[t, BNEXT] = b
        else:
            ek[v, EHEAD] = b
        ek[v, ETAIL] = b
        ek[v, EFREE] += 1
        stamp += 1
        if ek[v, EFREE] == 1:
            ek[v, ESTAMP] = stamp - 1
            nkey[v] = keys[i]
            ni[v, VER] += 1  # a stale entry of an earlier free spell dies
            if ni[v, NCHILD] == 0:
                _ev_push(hk, hs, hn, hv, es, nkey[v], stamp - 1, v, ni[v, VER])
    es[ESEQ] = stamp


@nb.njit(cache=True, inline="always")
def _ev_settle(hits, drops, kind, key, nodes, parent, depth, ni, cells, params, sc, ev):
    """What happened since the set was last read: hits took blocks ``hits`` back (pinned, no
    longer evictable; a block not free, or not in the table, is left as it is: their nodes'
    heap entries die when no free block is left), then the free nodes among ``nodes`` (a
    request observed them; every node when the policy re-ordered its keys) are re-keyed, the
    leaves among them back into the heap, then the host dropped blocks ``drops`` (their keys
    are gone: forgotten, :func:`evictable_drop`)."""
    ek, nkey, blocks, hk, hs, hn, hv, es = ev
    for b in hits:
        if b < len(blocks) and blocks[b, BFREE]:
            _ev_unfree(ek, blocks, b)
    free = np.empty(len(nodes), dtype=np.int64)
    m = 0
    for v in nodes:
        if ek[v, EFREE] > 0:
            free[m] = v
            m += 1
    keys = _ev_keys(kind, key, free[:m], depth, ni, cells, params, sc)
    for i in range(m):
        v = free[i]
        nkey[v] = keys[i]
        ni[v, VER] += 1
        if ni[v, NCHILD] == 0:
            _ev_push(hk, hs, hn, hv, es, keys[i], ek[v, ESTAMP], v, ni[v, VER])
    evictable_drop(drops, parent, ni, ev)


@nb.njit(cache=True)
def evictable_settle(hits, drops, kind, key, nodes, parent, depth, ni, cells, params, sc, ev):
    """``_ev_settle``, before a release or forgetting reads the set."""
    _ev_settle(hits, drops, kind, key, nodes, parent, depth, ni, cells, params, sc, ev)


@nb.njit(cache=True)
def evictable_drop(ids, parent, ni, ev):
    """The host dropped blocks ``ids`` (their keys are gone): forget them (a block beyond the
    table was never released: nothing to forget)."""
    ek, nkey, blocks, hk, hs, hn, hv, es = ev
    for b in ids:
        if b < len(blocks):
            _ev_drop(ek, nkey, blocks, hk, hs, hn, hv, es, b, parent, ni)


@nb.njit(cache=True)
def evictable_compact(ni, ev):
    """Drop the heap's dead entries (their node has no free block, a block held under it or
    a newer entry)."""
    ek, _, _, hk, hs, hn, hv, es = ev
    h = 0
    for e in range(es[ELEN]):
        v = hn[e]
        if ek[v, EFREE] > 0 and ni[v, VER] == hv[e] and ni[v, NCHILD] == 0:
            hk[h], hs[h], hn[h], hv[h] = hk[e], hs[e], hn[e], hv[e]
            h += 1
    es[ELEN] = 0
    for e in range(h):  # re-heaped in place: pushing entry e never writes beyond slot e
        _ev_push(hk, hs, hn, hv, es, hk[e], hs[e], hn[e], hv[e])


@nb.njit(cache=True, inline="always")
def _ev_lowest_held(ek, nkey, n):
    """When every free node has blocks held under it (no free leaf), the free node of the
    lowest (key, stamp), by a pass over the ``n`` nodes (rare: a held block's ancestors are
    held too, but for blocks sharing a key); -1 if no node is free."""
    victim = -1
    for v in range(n):
        if ek[v, EFREE] > 0 and (victim < 0 or nkey[v] < nkey[victim] or (
                nkey[v] == nkey[victim] and ek[v, ESTAMP] < ek[victim, ESTAMP])):
            victim = v
    return victim


@nb.njit(cache=True, inline="always")
def _ev_sieve(ek, es, ni, n):
    """SIEVE's hand over the nodes the host holds blocks of, in insertion order from after
    its last victim, wrapping: it clears the visited bits it passes (pinned blocks' too) and
    stops at the first unvisited free leaf; -1 if none."""
    known = np.flatnonzero(ek[:n, EHELD] > 0)
    if len(known) == 0:
        return -1
    order = known[np.argsort(ni[known, NEXT_USE], kind="mergesort")]
    start = 0
    while start < len(order) and ni[order[start], NEXT_USE] <= es[EHAND]:
        start += 1
    for i in range(2 * len(order)):  # the second lap finds the bits cleared
        v = order[(start + i) % len(order)]
        if ni[v, VISITED]:
            ni[v, VISITED] = 0
        elif ek[v, EFREE] > 0 and ni[v, NCHILD] == 0:
            es[EHAND] = ni[v, NEXT_USE]
            return v
    return -1


@nb.njit(cache=True)
def evictable_pop(hand, want, n, hits, drops, kind, key, nodes, parent, depth, ni, cells, params,
                  sc, ev, out):
    """Up to ``want`` victims into ``out`` (engine blocks; returns how many), once the set is
    settled (``_ev_settle``): by SIEVE's hand over insertion order (``hand``) or the free
    leaf of the lowest (key, stamp), its entry popped and pushed back should the node keep a
    free block (``_ev_lowest_held`` when there is none); each victim's block (its node's
    oldest free block) is forgotten and its node evicted."""
    _ev_settle(hits, drops, kind, key, nodes, parent, depth, ni, cells, params, sc, ev)
    ek, nkey, blocks, hk, hs, hn, hv, es = ev
    got = 0
    while got < want:
        v = -1
        if hand:
            v = _ev_sieve(ek, es, ni, n)
        else:  # the free leaf of the lowest (key, stamp), here: in a helper, twice as slow
            while es[ELEN] > 0:
                u, ver = hn[0], hv[0]
                _ev_pop(hk, hs, hn, hv, es)
                if ek[u, EFREE] > 0 and ni[u, VER] == ver and ni[u, NCHILD] == 0:
                    if ek[u, EFREE] > 1:  # its other free blocks stay, at the same place
                        _ev_push(hk, hs, hn, hv, es, nkey[u], ek[u, ESTAMP], u, ver)
                    v = u
                    break
            if v < 0:
                v = _ev_lowest_held(ek, nkey, n)
        if v < 0:
            break
        b = ek[v, EHEAD]
        out[got] = b
        got += 1
        _ev_drop(ek, nkey, blocks, hk, hs, hn, hv, es, b, parent, ni)
        if ni[v, CACHED]:
            ni[v, CACHED] = 0
            sc[SIZE] -= 1
    return got


def evictable_nodes(n: int) -> np.ndarray:
    """An evictable set's rows of ``n`` nodes: nothing free or held, empty free lists."""
    ek = np.zeros((n, _EK), dtype=np.int64)
    ek[:, EHEAD] = ek[:, ETAIL] = -1
    return ek


def evictable_blocks(n: int) -> np.ndarray:
    """An evictable set's rows of ``n`` engine blocks: unknown, unlinked, not free."""
    blocks = np.full((n, _BK), -1, dtype=np.int64)
    blocks[:, BFREE] = 0
    return blocks


def node_table(n: int, dtype: type = np.int64, k: int | None = None) -> np.ndarray:
    """Per-node cache state for ``n`` nodes (``k``: that many tables stacked): nothing cached,
    unpinned, unlinked (``dtype``: ``int32`` halves a replay's tables where node ids and
    request indices fit it)."""
    ni = np.zeros((n, _NI) if k is None else (k, n, _NI), dtype=dtype)
    for column in _UNSET:
        ni[..., column] = -1
    return ni


def shadow_heap_size(capacity: int, longest: int) -> int:
    """Heap entries a cache of ``capacity`` blocks needs for requests of up to ``longest``
    blocks: live leaves plus the dead entries one request can leave before a compaction."""
    return 8 * capacity + 2 * longest + 16


def compact(c: Cache, kept: np.ndarray, n: int, remap: np.ndarray, *, lists: bool,
            slots: bool = False) -> None:
    """Keep rows ``kept`` (ascending) of the first ``n`` of cache ``c``'s node table as rows
    ``0..len(kept) - 1`` (``remap[v]``: node ``v``'s new id, -1 when it goes), the rest reset,
    and renumber what points at nodes: the recency queue's links (``PREV``, ``NEXT``), with
    ``lists`` SIEVE's leaf list (``LPREV``, ``LNEXT``: a cache the kernels serve under
    ``SIEVE``; elsewhere those columns are counts), the scalars naming nodes (``HEAD`` ...
    ``LTAIL``) and the heap, whose dropped nodes' entries go (a sorted array is a heap).
    ``slots``: the heap's arrays are a sampled shadow's list of leaves, each leaf's ``SLOT``
    its place there."""
    ni, sc, hkey, hnode, hver = c
    m = len(kept)
    ni[:m] = ni[kept]
    ni[m:n] = node_table(n - m, ni.dtype)
    for column in (PREV, NEXT, LPREV, LNEXT) if lists else (NEXT,) if slots else (PREV, NEXT):
        links = ni[:m, column]
        linked = links >= 0
        links[linked] = remap[links[linked]]
    for field in (HEAD, TAIL, HAND, LHEAD, LTAIL):
        if sc[field] >= 0:
            sc[field] = remap[sc[field]]
    live = remap[hnode[:sc[HLEN]]] >= 0
    keys, nodes, vers = hkey[:sc[HLEN]][live], remap[hnode[:sc[HLEN]][live]], hver[:sc[HLEN]][live]
    order = np.argsort(keys, kind="stable")
    h = len(order)
    hkey[:h], hnode[:h], hver[:h] = keys[order], nodes[order], vers[order]
    sc[HLEN] = h
    if slots:
        ni[hnode[:h], SLOT] = np.arange(h)


def cells_table(n: int, arms: int) -> np.ndarray:
    """``CANOPY``'s cell statistics of ``n`` nodes never used, with ``arms`` decayed arms."""
    cells = np.zeros((n, CELL_S0 + arms))
    cells[:, CELL_CLOCK] = -1.0
    return cells


def scalars() -> np.ndarray:
    """A cache's scalars (``SIZE``, ``HEAD``... ``SEQN``) for an empty cache."""
    sc = np.full(_SC, -1, dtype=np.int64)
    sc[[SIZE, HLEN, CLOCK, LAPS, SEQN]] = 0
    return sc


class Shadows:
    """Metadata-only shadow caches, one per arm, over the sampled requests (see
    :class:`~canopy.prefix.policies.Canopy`); they read the main cache's cells.
    At full rate and capacity (``FULL``) the shadow of the main cache's arm is a copy of the
    main cache, taken when it switched to the arm (a decayed arm's copy evicts by its heap,
    as the main cache does: kernel code ``CANOPY``, where the others sample, ``SAMPLED``).
    ``rides``: the main cache serves a trace's requests through :func:`replay_canopy` or
    :func:`canopy_request` (not a host's own cache), so at full rate that shadow rides on it
    (``RIDES``)."""

    def __init__(self, n_nodes: int, longest: int, policy, capacity: int,
                 dtype: type = np.int64, rides: bool = False) -> None:
        arms = policy.arms(capacity)
        self.capacity = arms.capacity
        self.ac = np.array([arms.rate, arms.gamma, arms.z, arms.min_evidence,
                            arms.candidates])
        full = arms.rate >= 1.0 and arms.capacity == capacity
        # a decayed arm's shadow samples its victims, but at full rate the main cache's
        # (a copy of it: empty, as the main cache starts)
        self.kinds = np.where(arms.kinds == CANOPY, SAMPLED if arms.candidates else CANOPY,
                              arms.kinds)
        if full:
            self.kinds[policy.start_arm] = arms.kinds[policy.start_arm]
        k = len(arms.kinds)
        self.stats = np.zeros(k + 1)
        self.pairs = np.zeros((2, k, k))
        self.got = np.zeros(k)
        self.sm = np.array([0, arms.seed, int(rides and full), int(full)], dtype=np.int64)
        self.ni = node_table(n_nodes, dtype, k)
        self.sc = np.stack([scalars() for _ in range(k)])
        self.sc[:, ARM] = np.arange(k)  # shadow a evicts by arm a
        # a sampled shadow's draws: xorshift64 seeded (never 0) by the sample's seed and arm
        self.sc[:, DRAW] = [(arms.seed * 0x9E3779B1 + 0x2545F491 * (a + 1)) % (2**62) | 1
                            for a in range(k)]
        heap = shadow_heap_size(arms.capacity, longest)
        self.hkey = np.zeros((k, heap), dtype=np.float64)
        self.hnode = np.zeros((k, heap), dtype=np.int64)
        self.hver = np.zeros((k, heap), dtype=np.int64)

    def args(self) -> ShadowState:
        """The shadows as the kernels take them."""
        return ShadowState(self.ac, self.stats, self.pairs, self.got, self.sm, self.kinds,
                    self.capacity, self.ni, self.sc, self.hkey, self.hnode, self.hver)
