"""The block tree: one owner for a prefix cache's state, held by every host.

A host of a prefix cache (the replay of a whole trace, :class:`~canopy.prefix.RadixCache`; a
server's cache fed one request at a time, :class:`~canopy.prefix.StreamingCache`; an engine's
own cache ranked by :class:`~canopy.prefix.OnlinePolicy` in llama.cpp, vLLM or SGLang) keeps
the same state: the prefix tree's topology (``parent``, ``depth``; when blocks arrive one
request at a time, the index from a block's key to its node, node ids in order of first
appearance and stable birth ids), the node tables the kernels of :mod:`canopy.prefix.kernels`
read and write (the cache fields, the scalars, the heap, ``canopy``'s cells and shadows), how
they grow and how they are renumbered after forgetting. :class:`BlockTree` is that state; the
hosts call its methods and never a column of the tables.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from typing import Any

import numba as nb
import numpy as np

from canopy.prefix import hashindex, kernels
from canopy.prefix.hashindex import KeyTree
from canopy.prefix.kernels import (
    ARM,
    CACHED,
    CANOPY,
    CELL_CLOCK,
    CLOCK,
    FULL,
    LAM0,
    OPTIMAL,
    PRIORITY,
    RIDES,
    SALT,
    SIEVE,
    SIZE,
    SWITCHES,
    VISITED,
)
from canopy.prefix.policies import EvictionPolicy
from canopy.prefix.traces import Trace
from canopy.validation import check_count, check_open_unit

__all__ = ["MAX_DEPTH", "BlockTree"]

MAX_DEPTH = 65_535
"""Deepest block a growing tree orders exactly by recency (``canopy``'s recency key breaks
ties by depth up to this)."""

_START = 1024  # nodes a growing tree holds before it first grows
_NONE = np.zeros(0, dtype=np.int64)  # no blocks, no nodes


class _Unbounded:
    """What a policy's kernel reads of a trace, for a stream of unknown length: LFU orders by
    ``(hits, last use)`` exactly for up to 2^32 requests, ``canopy``'s recency arm by ``(last
    use, depth)`` for chains up to :data:`MAX_DEPTH` blocks."""

    n_requests = 2**32 - 1
    depth = np.array([MAX_DEPTH])


@nb.njit(cache=True)
def _close_upward(keep: np.ndarray, parent: np.ndarray) -> None:
    """Mark every ancestor of a kept node (parents have smaller ids than their children)."""
    for v in range(len(keep) - 1, -1, -1):
        if keep[v] and parent[v] >= 0:
            keep[parent[v]] = True


@nb.njit(cache=True)
def _chain(slots, key, parent, state, keys, by_parent, depth, born, births, out):
    """:func:`~canopy.prefix.hashindex.insert_chain` of a request's folded ``keys``; a new
    node's depth is its place in the chain, its stable id the next birth. Returns the births
    after it."""
    n0 = state[hashindex.N]
    hashindex.insert_chain(slots, key, parent, state, keys, -1, by_parent, out)
    for j in range(len(out)):
        v = out[j]
        if v >= n0:
            depth[v] = j + 1
            born[v] = births + v - n0
    return births + state[hashindex.N] - n0


@nb.njit(cache=True)
def _chain_observe(slots, key, parent, state, keys, by_parent, depth, born, births, out, start,
                   kind, t, params, ni, cells, sc, seq):
    """:func:`_chain`, then :func:`~canopy.prefix.kernels.observe` of the chain's nodes from
    ``start`` on: returns the births and the insertion order after them."""
    births = _chain(slots, key, parent, state, keys, by_parent, depth, born, births, out)
    seq = kernels.observe(kind, t, out[start:], parent, params, ni, cells, sc, seq)
    return births, seq


@nb.njit(cache=True)
def _release_keys(slots, key, parent, by_parent, folded, ids, kind, fn, depth, ni, cells, params,
                  sc, ev, known):
    """:meth:`BlockTree.release`: the nodes of keys ``folded`` (``known``: found), blocks of
    unknown keys dropped, then the rest released in order. Returns False, having done
    nothing, when a block lies beyond the set's block table (the host grows it first)."""
    blocks = ev[2]
    for b in ids:
        if b >= len(blocks):
            return False
    nodes = np.empty(len(folded), dtype=np.int64)
    hashindex.find_chain(slots, key, parent, folded, by_parent, nodes)
    m = 0
    for i in range(len(nodes)):
        known[i] = nodes[i] >= 0
        m += known[i]
    if m < len(nodes):
        kernels.evictable_drop(ids[~known], parent, ni, ev)
        ids, nodes = ids[known], nodes[known]
    kernels.evictable_release(kind, fn, ids, nodes, parent, depth, ni, cells, params, sc, ev)
    return True


@nb.njit(cache=True)
def _leading_cached(nodes, lead, ni):
    """How many of the first ``lead`` ``nodes`` are cached before the first that is not."""
    for j in range(lead):
        if ni[nodes[j], CACHED] == 0:
            return j
    return lead


def _joined(parts: list[np.ndarray]) -> np.ndarray:
    """Engine blocks handed over in ``parts``, as one array."""
    return _NONE if not parts else parts[0] if len(parts) == 1 else np.concatenate(parts)


class BlockTree:
    """A prefix cache's state under ``policy`` with room for ``capacity`` blocks.

    With ``trace``, the tree is the trace's whole block universe (node ids are the trace's,
    the tables sized once, ``int32`` where ids fit). Without, it grows as blocks are met one
    request at a time (:meth:`chain`): a key names its node with its parent node, or by
    itself with ``prefix_keys`` (a prefix hash names its whole prefix), in the compact key
    index of :class:`~canopy.prefix.hashindex.KeyTree` (keys folded to 63 bits by
    :func:`~canopy.prefix.hashindex.fold`), which owns the ``parent`` column. ``serves``: the
    kernels serve requests on it (:meth:`serve`; SIEVE then links its leaves through the
    node table), rather than a host's own cache being accounted (:meth:`observe`).
    ``history_floor``: a growing tree forgets, once it holds twice what was kept last time,
    the nodes no cache holds whose decayed counts fell below it (:meth:`forget`)."""

    def __init__(self, policy: EvictionPolicy, capacity: int, *, trace: Trace | None = None,
                 prefix_keys: bool = False, serves: bool = True,
                 history_floor: float | None = None) -> None:
        self.policy = policy
        self.capacity = check_count(capacity, "capacity")
        self.history_floor = check_open_unit(history_floor, "history_floor", allow_none=True)
        self.kind, self.params = policy.kernel(_Unbounded() if trace is None else trace,
                                               capacity)
        self._how: Any = policy.key if self.kind == PRIORITY else self.kind
        self._serves = serves
        self.forgotten = 0
        if trace is None:
            n, longest, dtype = _START, 1, np.int64
            self._index = KeyTree(n, by_parent=not prefix_keys)
            self.depth = np.zeros(n, dtype=np.int64)
        else:
            n, longest = trace.n_nodes, int(np.diff(trace.offsets).max(initial=0))
            dtype = np.int32 if max(n, trace.n_requests) < 2**31 - 1 else np.int64
            self._index = KeyTree(by_parent=not prefix_keys, parent=trace.parent)
            self.depth = trace.depth
        self._trace = trace
        self._nu = (kernels.next_use(trace.offsets, trace.nodes, n)
                    if trace is not None and self.kind == OPTIMAL else None)
        self._born = np.arange(n, dtype=np.int64)  # stable ids: order of (re)appearance
        self._births = self.n
        self._longest = longest
        self._ni = kernels.node_table(n, dtype)
        self._sc = kernels.scalars()
        self._canopy = self.kind == CANOPY
        self._cells = (kernels.cells_table(n, len(self.params) - LAM0) if self._canopy
                       else np.zeros((1, kernels.CELL_S0)))  # only ``canopy`` reads cells
        self._shadows = None
        if self._canopy:
            self._shadows = kernels.Shadows(n, longest, policy, capacity, dtype,
                                            rides=trace is not None)
            self._sc[ARM] = policy.start_arm
            self._rate = float(self._shadows.ac[0])
            self._in_sample, self._out_of_sample = (
                np.concatenate([[r], self._shadows.ac[1:]]) for r in (1.0, 0.0))
        size = kernels.shadow_heap_size(capacity, longest)  # compacted when full
        self._hkey, self._hnode, self._hver = (np.zeros(size), np.zeros(size, dtype=np.int64),
                                               np.zeros(size, dtype=np.int64))
        shadow_blocks = 0 if self._shadows is None else self._shadows.capacity * len(
            self._shadows.kinds)
        self._floor_nodes = 4 * (capacity + shadow_blocks) + _START
        self._limit = 2 * self._floor_nodes
        self._ev: kernels.Evictable | None = None  # a host's free blocks, once it frees one
        self._evt: tuple[np.ndarray, ...] = ()  # the same as the kernels take it (a plain tuple)
        self._ev_epoch = 0
        self._due: np.ndarray | None = None  # a request's nodes to re-key (:meth:`rekey`)
        self._hits: list[np.ndarray] = []  # engine blocks hits took back (:meth:`acquire`)
        self._drops: list[np.ndarray] = []  # engine blocks whose keys went (:meth:`drop`)

    # ------------------------------------------------------------ what hosts read
    @property
    def parent(self) -> np.ndarray:
        """Each node's parent node (-1: a root), owned by the key index."""
        return self._index.parent

    @property
    def n(self) -> int:
        """Nodes of the tree (ids ``0..n - 1``)."""
        return self._index.n

    @property
    def size(self) -> int:
        """Blocks cached now."""
        return int(self._sc[SIZE])

    @property
    def arm(self) -> int:
        """``canopy``: the arm whose priority evicts now (index into ``policy.arm_names``)."""
        return int(self._sc[ARM])

    @property
    def switches(self) -> int:
        """``canopy``: how many times the evicting arm changed (0 for other policies)."""
        return 0 if self._shadows is None else int(self._shadows.sm[SWITCHES])

    @property
    def has_shadows(self) -> bool:
        """Whether the policy learns its arm in shadow caches (``canopy``)."""
        return self._shadows is not None

    @property
    def rides(self) -> bool:
        """``canopy``: whether the shadow of the main cache's arm is the main cache itself,
        not replayed (a trace's replay at full sampling rate and capacity)."""
        return self._shadows is not None and bool(self._shadows.sm[RIDES])

    @property
    def salt(self) -> int:
        """``canopy``: the salt of the shadows' sample hash."""
        return int(self._shadows.sm[SALT])

    @property
    def table(self) -> np.ndarray:
        """The node table (one row of cache fields a node); read-only for callers."""
        return self._ni

    def cached(self) -> np.ndarray:
        """Node ids cached now, ascending."""
        return np.flatnonzero(self._ni[:self.n, CACHED])

    def is_cached(self, v: int) -> bool:
        """Whether node ``v`` is cached."""
        return bool(self._ni[v, CACHED])

    def visited(self, v: int) -> bool:
        """``sieve``: whether node ``v`` was reused since the hand last passed it."""
        return bool(self._ni[v, VISITED])

    def clear_visited(self, v: int) -> None:
        """``sieve``: the hand passes node ``v``."""
        self._ni[v, VISITED] = 0

    def evict(self, v: int) -> None:
        """The host dropped node ``v`` (nothing when it was not cached)."""
        if self._ni[v, CACHED]:
            self._ni[v, CACHED] = 0
            self._sc[SIZE] -= 1

    # ------------------------------------------------------------ keys and nodes
    def node(self, key: Hashable, parent: int = -1) -> int:
        """The node of ``key`` (under node ``parent`` unless keys name their prefix); -1 for
        a key never met (or forgotten)."""
        return self._index.get(key, parent)

    def name_nodes(self, keys: Sequence[Hashable]) -> None:
        """Key node ``v`` by ``keys[v]`` (a tree made from a trace of known keys)."""
        self._index.name(keys)

    def cached_prefix(self, keys: Iterable[Hashable]) -> int:
        """Leading blocks of ``keys`` cached now (nothing changes)."""
        nodes, lead = self._index.find(keys)
        return int(_leading_cached(nodes, lead, self._ni))

    def chain(self, keys: Iterable[Hashable]) -> np.ndarray:
        """The nodes of a request's block keys, root first; keys met for the first time
        become nodes (the tables grow). One compiled call for the whole chain."""
        folded = self._room(keys)
        index = self._index
        out = np.empty(len(folded), dtype=np.int64)
        self._births = int(_chain(index.slots, index.key, index.parent, index.state, folded,
                                  index.by_parent, self.depth, self._born, self._births, out))
        self._fit(len(out))
        return out

    def _room(self, keys: Iterable[Hashable]) -> np.ndarray:
        """A request's keys, folded, with room in the tables for each to become a node."""
        folded = hashindex.as_keys(keys)
        if len(folded) > MAX_DEPTH:
            raise ValueError(f"a request of {len(folded)} blocks is deeper than the "
                             f"{MAX_DEPTH} a streaming cache orders exactly")
        index = self._index
        if index.spare < len(folded):
            self._grow(max(2 * len(self.parent), self.n + len(folded)))
        index.reserve(len(folded))
        return folded

    def _grow(self, n: int) -> None:
        old = len(self.parent)
        self._index.grow(n)
        self.depth = np.concatenate([self.depth, np.zeros(n - old, dtype=np.int64)])
        self._born = np.concatenate([self._born, np.zeros(n - old, dtype=np.int64)])
        self._ni = np.concatenate([self._ni, kernels.node_table(n - old)])
        if self._ev is not None:
            self._set_ev(self._ev._replace(
                ek=np.concatenate([self._ev.ek, kernels.evictable_nodes(n - old)]),
                nkey=np.concatenate([self._ev.nkey, np.zeros(n - old)])))
        if self._canopy:
            shadows = self._shadows
            self._cells = np.concatenate(
                [self._cells, kernels.cells_table(n - old, self._cells.shape[1] -
                                                  kernels.CELL_S0)])
            shadows.ni = np.concatenate(
                [shadows.ni, kernels.node_table(n - old, k=len(shadows.kinds))], axis=1)

    def _fit(self, length: int) -> None:
        """Heaps large enough for a request of ``length`` blocks."""
        if length <= self._longest:
            return
        self._longest = length
        size = kernels.shadow_heap_size(self.capacity, length)
        self._hkey, self._hnode, self._hver = (
            np.concatenate([a, np.zeros(size - len(a), dtype=a.dtype)])
            for a in (self._hkey, self._hnode, self._hver))
        if self._shadows is not None:
            shadows = self._shadows
            size = kernels.shadow_heap_size(shadows.capacity, length)
            k, old = shadows.hkey.shape
            shadows.hkey, shadows.hnode, shadows.hver = (
                np.concatenate([a, np.zeros((k, size - old), dtype=a.dtype)], axis=1)
                for a in (shadows.hkey, shadows.hnode, shadows.hver))

    # ------------------------------------------------------------ the kernels
    def _state(self) -> kernels.Cache:
        return kernels.Cache(self._ni, self._sc, self._hkey, self._hnode, self._hver)

    def kernel_args(self) -> tuple[np.ndarray, np.ndarray, kernels.Cache,
                                   kernels.ShadowState | None]:
        """``(params, cells, cache, shadows)`` as :func:`~canopy.prefix.kernels.canopy_request`
        takes them, for a host that serves a trace's tree from its own compiled loop (the
        fleet simulator's replicas)."""
        shadows = None if self._shadows is None else self._shadows.args()
        return self.params, self._cells, self._state(), shadows

    def _shadow_args(self, path: np.ndarray) -> kernels.ShadowState:
        """The shadows' kernel arguments for request ``path``, the sample decided here: by
        the spatial hash of its first two blocks' node, as the replay's kernel does, but of
        the node's stable id (its order of appearance, which equals the replay's node id
        until a forgotten node comes back) rather than its index, which forgetting
        renumbers: a request's sample would otherwise change at every compaction. The
        kernel is told through the rate (1: sampled, 0: not)."""
        return self._shadows.args()._replace(
            ac=self._in_sample if self._sampled(path) else self._out_of_sample)

    def _sampled(self, path: np.ndarray) -> bool:
        """Whether request ``path`` is in the shadows' sample (:meth:`_shadow_args`)."""
        return len(path) > 0 and kernels.unit_hash(
            int(self._born[path[min(1, len(path) - 1)]]), self.salt) < self._rate

    def serve(self, t: int, path: np.ndarray) -> int:
        """Serve request ``t``, the nodes ``path`` of a growing tree: reuse its cached
        prefix, insert the rest, evict by the policy; returns the blocks reused."""
        if self._canopy:
            reused = kernels.canopy_request(
                t, 0, len(path), path, self.parent, self.depth, self.capacity, self.params,
                self._cells, self._state(), self._shadow_args(path))
        elif self.kind == PRIORITY:
            reused = kernels.request_keyed(
                self._how, t, 0, len(path), path, path, self.parent, self.depth,
                self.capacity, self.params, self._cells, self._state())
        else:
            reused = kernels.request(
                self.kind, t, 0, len(path), path, path, self.parent, self.depth,
                self.capacity, self.params, self._cells, self._state())
        return int(reused)

    def run(self, t0: int, t1: int, reused: np.ndarray) -> None:
        """Serve requests ``t0..t1 - 1`` of the tree's trace, their reuse into ``reused``."""
        trace = self._trace
        if self._canopy:
            kernels.replay_canopy(t0, t1, trace.offsets, trace.nodes, self.parent,
                                  self.depth, self.capacity, self.params, self._cells,
                                  self._state(), self._shadows.args(), reused)
            return
        # each block's next use, what the optimum knows (read by it only, never out of bounds)
        nu = trace.nodes if self._nu is None else self._nu
        run = kernels.replay_keyed if self.kind == PRIORITY else kernels.replay
        run(self._how, t0, t1, trace.offsets, trace.nodes, nu, self.parent, self.depth,
            self.capacity, self.params, self._cells, self._state(), reused)

    def observe(self, t: int, keys: Iterable[Hashable], seq: int,
                start: int = 0) -> tuple[np.ndarray, int]:
        """Account request ``t``, its block keys ``keys`` (root first) admitted by a host
        that keeps the cache itself: their nodes (:meth:`chain`), then the use of those from
        ``start`` on (:func:`~canopy.prefix.kernels.observe`), one compiled call; the
        request's free nodes are re-keyed (:meth:`rekey`). Returns the request's nodes and
        the next insertion order."""
        folded = self._room(keys)
        index = self._index
        out = np.empty(len(folded), dtype=np.int64)
        births, seq = _chain_observe(index.slots, index.key, index.parent, index.state, folded,
                                     index.by_parent, self.depth, self._born, self._births,
                                     out, start, self.kind, t, self.params, self._ni,
                                     self._cells, self._sc, seq)
        self._births = int(births)
        self._fit(len(out))
        self.rekey(out)
        return out, int(seq)

    def replay_shadows(self, t: int, path: np.ndarray) -> None:
        """``canopy``: replay request ``t`` (nodes ``path``) in the shadows, switching arm
        when the evidence says so (a request out of the sample leaves them as they are: no
        call); at full rate, a switch gives the new arm's shadow the blocks the host holds,
        as the replay's main cache is that shadow."""
        shadows = self._shadows
        if shadows is None or not self._sampled(path):
            return
        args = shadows.args()._replace(ac=self._in_sample)
        if kernels.canopy_shadows(t, 0, len(path), path, self.parent, self.depth, self.params,
                                  self._cells, self._sc, args) and shadows.sm[FULL]:
            kernels.shadow_from_table(self._ni[:self.n], self.parent, self.depth, self._cells,
                                      self.params, self._sc, args)

    def rank(self, nodes: np.ndarray) -> np.ndarray:
        """Eviction keys of ``nodes`` (lower evicts first), one compiled call."""
        out = np.zeros(len(nodes))
        if self.kind == PRIORITY:
            kernels.priorities_keyed(self._how, nodes, self.depth, self._ni, self._cells,
                                     self.params, self._sc, out)
        else:
            kernels.priorities(self.kind, nodes, self.depth, self._ni, self._cells,
                               self.params, self._sc, out)
        return out

    # ------------------------------------------------------------ forgetting
    def full(self) -> bool:
        """Whether a growing tree with a history floor holds enough to forget."""
        return self.history_floor is not None and self.n >= self._limit

    def hold_at_most(self, blocks: int) -> None:
        """Count the lowest-ranked cached blocks beyond ``blocks`` as evicted (a host that
        missed reporting evictions)."""
        self._settle()
        held = self.cached()
        excess = len(held) - blocks
        if excess > 0:
            self._ni[held[np.argsort(self.rank(held), kind="stable")[:excess]], CACHED] = 0
            self._sc[SIZE] -= excess

    @property
    def longest(self) -> int:
        """The longest request met, in blocks."""
        return self._longest

    def forget(self) -> None:
        """Drop nodes no cache holds whose every decayed count is below the history floor,
        then renumber what is kept (order-preserving, so parents stay below their
        children)."""
        self._settle()  # its nodes before they are renumbered
        n = self.n
        keep = self._ni[:n, CACHED] == 1
        if self._ev is not None:
            keep |= self._ev.ek[:n, kernels.EHELD] > 0  # a host's blocks keep their nodes
        if self._canopy:
            keep |= (self._shadows.ni[:, :n, CACHED] == 1).any(axis=0)
            cells = self._cells[:n]
            counts = kernels.cell_counts(cells, self._sc[CLOCK], self.params)
            keep |= (cells[:, CELL_CLOCK] >= 0) & (counts.max(axis=1) >= self.history_floor)
        _close_upward(keep, self.parent[:n])
        kept = np.flatnonzero(keep)
        remap = np.full(n, -1, dtype=np.int64)
        remap[kept] = np.arange(len(kept))
        m = len(kept)
        self._index.compact(kept, remap)
        self.depth[:m] = self.depth[kept]
        self._born[:m] = self._born[kept]
        kernels.compact(self._state(), kept, n, remap,
                        lists=self._serves and self.kind == SIEVE)
        if self._canopy:
            self._cells[:m] = self._cells[kept]
            self._cells[m:n] = kernels.cells_table(n - m, self._cells.shape[1] -
                                                   kernels.CELL_S0)
            s = self._shadows
            for a in range(len(s.kinds)):  # LRU, heaps or sampled leaves, never SIEVE
                kernels.compact(kernels.Cache(s.ni[a], s.sc[a], s.hkey[a], s.hnode[a],
                                              s.hver[a]), kept, n, remap, lists=False,
                                slots=s.kinds[a] == kernels.SAMPLED)
        if self._ev is not None:
            self._ev_compact(kept, n, remap)
        self.forgotten += n - m
        self._limit = max(m + m // 4, 2 * self._floor_nodes)

    # ------------------------------------------------------------ a host's free blocks
    def nodes(self, keys: Iterable[Hashable]) -> np.ndarray:
        """The nodes of ``keys`` in a tree whose keys name their prefix (-1: a key never met
        or forgotten)."""
        return self._index.find(keys)[0]

    def _evictable(self, blocks: int) -> kernels.Evictable:
        """The evictable set, made on first use and grown to engine block ids below
        ``blocks``."""
        ev = self._ev
        if ev is None:
            size = kernels.shadow_heap_size(self.capacity, self._longest)
            ints = [np.zeros(size, dtype=np.int64) for _ in range(3)]
            ev = kernels.Evictable(kernels.evictable_nodes(len(self.parent)),
                                   np.zeros(len(self.parent)), kernels.evictable_blocks(blocks),
                                   np.zeros(size), *ints,
                                   np.array([0, 0, -1], dtype=np.int64))
            self._ev_epoch = self.switches
        elif blocks > len(ev.blocks):
            more = max(blocks, 2 * len(ev.blocks)) - len(ev.blocks)
            ev = ev._replace(blocks=np.concatenate([ev.blocks, kernels.evictable_blocks(more)]))
        self._set_ev(ev)
        return ev

    def _set_ev(self, ev: kernels.Evictable) -> None:
        self._ev, self._evt = ev, tuple(ev)

    def _ev_room(self, entries: int) -> tuple[np.ndarray, ...]:
        """The evictable set as the kernels take it, its heap with room for ``entries`` more
        (dead entries dropped first, then doubled): a plain tuple, which a compiled call
        reads in half the time of the named one."""
        ev = self._ev
        assert ev is not None, "room is asked for only once a block was freed"
        if ev.es[kernels.ELEN] + entries > len(ev.hkey):
            kernels.evictable_compact(self._ni, self._evt)
            need = ev.es[kernels.ELEN] + entries
            if 2 * need > len(ev.hkey):
                grow = 2 * need - len(ev.hkey)
                self._set_ev(ev._replace(**{
                    f: np.concatenate([getattr(ev, f), np.zeros(grow, dtype=getattr(ev, f).dtype)])
                    for f in ("hkey", "hstamp", "hnode", "hver")}))
        return self._evt

    def release(self, blocks: np.ndarray, keys: Iterable[Hashable] | np.ndarray) -> np.ndarray:
        """A host freed engine blocks ``blocks`` (non-negative ids) caching ``keys`` (a tree
        whose keys name their prefix), in that order: evictable from now on
        (:func:`~canopy.prefix.kernels.evictable_release`); blocks of keys never met (or
        forgotten) are forgotten here. Returns which keys are known; one compiled call."""
        folded = hashindex.as_keys(keys)
        if self._ev is None:
            self._evictable(int(blocks.max(initial=-1)) + 1)
        self._settle()
        index = self._index
        known = np.empty(len(blocks), dtype=np.bool_)
        while not _release_keys(index.slots, index.key, index.parent, index.by_parent, folded,
                                blocks, self.kind, self._ev_key(), self.depth, self._ni,
                                self._cells, self.params, self._sc,
                                self._ev_room(2 * len(blocks)), known):
            # a block beyond the table: grown, then released (a block may make its node and
            # an old parent leave: two heap entries a block)
            self._evictable(int(blocks.max(initial=-1)) + 1)
        return known

    def free_blocks(self) -> np.ndarray:
        """The host's free blocks the set holds, in release order (hits and drops not yet
        handed to the set left out); nothing changes."""
        if self._ev is None:
            return _NONE
        blocks = self._ev.blocks
        free = np.flatnonzero(blocks[:, kernels.BFREE])
        if self._hits or self._drops:
            free = free[~np.isin(free, np.concatenate(self._hits + self._drops))]
        return free[np.argsort(blocks[free, kernels.BSTAMP], kind="stable")]

    def acquire(self, blocks: np.ndarray) -> None:
        """A host's hits took ``blocks`` back (pinned), handed to the set when it is next
        read."""
        if self._ev is not None and len(blocks):
            self._hits.append(blocks)

    def drop(self, blocks: np.ndarray) -> None:
        """A host dropped ``blocks``' keys: forgotten when the set is next read (after the
        hits and the re-keying before them)."""
        if self._ev is not None and len(blocks):
            self._drops.append(blocks)

    def rekey(self, path: np.ndarray) -> None:
        """A request observed nodes ``path``: its free nodes re-keyed, or every free node
        when the policy re-ordered its keys (``canopy`` switched arm). Done when the set is
        next read (a release, a drop, victims, forgetting), after the request's hits took
        their blocks back (:meth:`acquire`): a node it pinned needs no entry (every victim
        is the same; the heap holds fewer dead entries)."""
        if self._ev is None:
            return
        self._settle()
        self._due = path

    def _pending(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The hits, the drops and the nodes to re-key since the set was last read (every
        node, the heap emptied, when the policy re-ordered its keys), taken."""
        hits, drops = _joined(self._hits), _joined(self._drops)
        self._hits, self._drops = [], []
        path, self._due = self._due, None
        if path is None:
            return hits, drops, _NONE
        if self.switches != self._ev_epoch:
            self._ev_epoch = self.switches
            self._ev.es[kernels.ELEN] = 0  # every entry made anew
            path = np.arange(self.n)
        return hits, drops, path

    def _settle(self) -> None:
        """Hand the set what happened since it was last read (:meth:`_pending`)."""
        if self._ev is None or (not self._hits and not self._drops and self._due is None):
            return
        hits, drops, path = self._pending()
        ev = self._ev_room(len(path) + len(drops))  # a dropped block's parent may be a leaf
        kernels.evictable_settle(hits, drops, self.kind, self._ev_key(), path, self.parent,
                                 self.depth, self._ni, self._cells, self.params, self._sc, ev)

    def pop_victims(self, want: int) -> np.ndarray:
        """Up to ``want`` engine blocks to evict, in the policy's order among free leaves
        (SIEVE: its hand), each forgotten and its node evicted: one compiled call, which
        settles the set first."""
        if self._ev is None or want <= 0:
            return np.zeros(0, dtype=np.int64)
        hits, drops, path = self._pending()
        # re-keyed leaves; each dropped block's parent and each victim's
        ev = self._ev_room(len(path) + len(drops) + want)
        out = np.empty(want, dtype=np.int64)
        got = kernels.evictable_pop(self.policy.hand, want, self.n, hits, drops, self.kind,
                                    self._ev_key(), path, self.parent, self.depth, self._ni,
                                    self._cells, self.params, self._sc, ev, out)
        return out[:got]

    def _ev_key(self) -> Any:
        return self._how if self.kind == PRIORITY else None

    def _ev_compact(self, kept: np.ndarray, n: int, remap: np.ndarray) -> None:
        """Renumber the evictable set after forgetting (every node a host holds a block of
        is kept; the heap keeps its live entries, sorted: a sorted array is a heap)."""
        ev = self._ev
        assert ev is not None, "only a set that exists is renumbered"
        m = len(kept)
        ev.ek[:m] = ev.ek[kept]
        ev.ek[m:n] = kernels.evictable_nodes(n - m)
        ev.nkey[:m] = ev.nkey[kept]
        owned = ev.blocks[:, kernels.BNODE]
        known = owned >= 0
        owned[known] = remap[owned[known]]
        h = ev.es[kernels.ELEN]
        nodes = ev.hnode[:h]
        live = (remap[nodes] >= 0)
        live[live] = ev.ek[remap[nodes[live]], kernels.EFREE] > 0
        keys, stamps = ev.hkey[:h][live], ev.hstamp[:h][live]
        order = np.lexsort((stamps, keys))
        k = len(order)
        vers = ev.hver[:h][live][order]
        ev.hnode[:k] = remap[nodes[live]][order]
        ev.hkey[:k], ev.hstamp[:k], ev.hver[:k] = keys[order], stamps[order], vers
        ev.es[kernels.ELEN] = k

