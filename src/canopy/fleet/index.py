"""Replica index: which replicas hold each block of the prefix tree.

One node per block, keyed by its block hash (an engine's hashes are chained, so a hash names
the whole prefix up to its block): the nodes, their keys and parents are the prefix cache's
own key index (:class:`~canopy.prefix.hashindex.KeyTree`, the one a
:class:`~canopy.prefix.blocks.BlockTree` keys its blocks by), with the replica set as one
more column, a ``uint64`` bitmask per node: memory grows with the blocks, not with blocks x
replicas (at most 64 replicas). Two ways to feed it:

* ``precise``: the engines' KV events, ``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared``
  (vLLM's ``distributed/kv_events.py``), each batch with a per-replica sequence number; a
  batch at or below the last seen number is a duplicate and is dropped, one beyond the next
  number leaves a gap, recorded so the host can ask the engine's replay socket for it.
* ``approximate``: what was sent where (sglang-router's tree of routing history). A node's
  bits expire ``ttl_s`` seconds after the last request that sent it anywhere, and the TTL is
  calibrated online by the cached-token counts the engines report
  (:meth:`ReplicaIndex.reported`): a report below the index's prediction shortens it, one
  above lengthens it.

A node whose mask empties is freed (its key leaves the key index; its id is reused), so the
index holds only blocks some replica holds. The node-level kernels (:func:`match_nodes`,
:func:`send_nodes`, :func:`match_keys`) are what a compiled host loop (the fleet simulator)
calls on node ids directly.
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np

from canopy.prefix import hashindex
from canopy.prefix.hashindex import KeyTree
from canopy.validation import check_count, check_positive

__all__ = ["MAX_REPLICAS", "MODES", "ReplicaIndex", "calibrate_ttl", "match_keys", "match_nodes",
           "send_keys", "send_nodes"]

MODES = ("precise", "approximate")
MAX_REPLICAS = 64
TTL_STEP = 0.05
"""Relative change of the approximate index's TTL per report that disagrees with it."""
TTL_RANGE = (1.0, 86_400.0)
_INT64 = np.dtype(np.int64)  # numpy's own descriptor of a native int64 array


@nb.njit(cache=True)
def _settle(lost, j, out):
    """Replicas in ``lost`` (bits) matched ``j`` blocks."""
    while lost:
        bit = lost & -lost
        r = 0
        while (np.uint64(1) << np.uint64(r)) != bit:
            r += 1
        out[r] = j
        lost ^= bit


@nb.njit(cache=True)
def match_nodes(mask: np.ndarray, stamp: np.ndarray, nodes: np.ndarray, now: float,
                ttl: float, out: np.ndarray) -> None:
    """``out[r]``: how many of ``nodes`` (a root-first chain) replica ``r`` holds before its
    first miss. ``stamp`` is empty for a precise index; else a node's bits count only while
    ``now - stamp <= ttl``. O(blocks + replicas)."""
    n_rep = out.size
    alive = np.uint64(0xFFFFFFFFFFFFFFFF) if n_rep == 64 else \
        (np.uint64(1) << np.uint64(n_rep)) - np.uint64(1)
    out[:] = 0
    j = 0
    for j in range(nodes.size):
        v = nodes[j]
        held = mask[v] if v >= 0 else np.uint64(0)
        if stamp.size and v >= 0 and now - stamp[v] > ttl:
            held = np.uint64(0)
        lost = alive & ~held
        if lost:
            _settle(lost, j, out)
            alive &= held
            if not alive:
                return
    _settle(alive, nodes.size, out)


@nb.njit(cache=True)
def send_nodes(mask: np.ndarray, stamp: np.ndarray, nodes: np.ndarray, replica: int,
               now: float, ttl: float) -> None:
    """Approximate index: ``nodes`` were sent to ``replica`` at ``now``. An expired node
    forgets its other replicas first."""
    bit = np.uint64(1) << np.uint64(replica)
    for v in nodes:
        if now - stamp[v] > ttl:
            mask[v] = bit
        else:
            mask[v] |= bit
        stamp[v] = now


@nb.njit(cache=True)
def send_keys(slots: np.ndarray, key: np.ndarray, parent: np.ndarray, state: np.ndarray,
              by_parent: bool, mask: np.ndarray, stamp: np.ndarray, keys: np.ndarray,
              replica: int, now: float, ttl: float, nodes: np.ndarray) -> None:
    """:func:`send_nodes` for a chain of folded block keys (a root chain), its nodes made in
    the key index's columns first (``nodes``: scratch of their size; the caller leaves room,
    :meth:`~canopy.prefix.hashindex.KeyTree.reserve`): one compiled call per send."""
    hashindex.insert_chain(slots, key, parent, state, keys, -1, by_parent, nodes)
    send_nodes(mask, stamp, nodes, replica, now, ttl)


@nb.njit(cache=True)
def calibrate_ttl(ttl: float, predicted_blocks: int, reported_blocks: int) -> float:
    """One step of the approximate index's TTL towards the engines' reports."""
    if reported_blocks < predicted_blocks:
        ttl *= 1.0 - TTL_STEP
    elif reported_blocks > predicted_blocks:
        ttl *= 1.0 + TTL_STEP
    return min(max(ttl, TTL_RANGE[0]), TTL_RANGE[1])


@nb.njit(cache=True)
def match_keys(slots: np.ndarray, key: np.ndarray, parent: np.ndarray, mask: np.ndarray,
               stamp: np.ndarray, keys: np.ndarray, now: float, ttl: float, nodes: np.ndarray,
               out: np.ndarray) -> None:
    """:func:`match_nodes` for a chain of folded block keys, found in the key index's columns
    (``slots``, ``key``, ``parent`` of a :class:`~canopy.prefix.hashindex.KeyTree`; ``nodes``
    is scratch of their size)."""
    n = hashindex.find_chain(slots, key, parent, keys, False, nodes)
    match_nodes(mask, stamp, nodes[:n], now, ttl, out)


@nb.njit(cache=True)
def _remove(slots, key, parent, state, mask, keys, bit):
    """Nodes of ``keys`` lose ``bit``; an emptied node leaves the key index."""
    for k in keys:
        v = hashindex.find(slots, key, parent, k, -1, False)
        if v >= 0:
            mask[v] &= ~bit
            if mask[v] == np.uint64(0):
                hashindex.free_node(slots, key, parent, state, v, False)


class ReplicaIndex:
    """Which of ``n_replicas`` (<= 64) replicas hold each block, keyed by block hash.

    The blocks are the nodes of a :class:`~canopy.prefix.hashindex.KeyTree` (the prefix
    cache's own key index: each node's folded key and parent, the table that finds it), with
    the replica set as one more column, a ``uint64`` mask per node (and, approximate, the
    time it was last sent). Keys are folded by :func:`canopy.prefix.hashindex.fold` (an int
    modulo 2^63; an engine's digest by its first eight bytes).
    """

    def __init__(self, n_replicas: int, *, mode: str = "precise", ttl_s: float = 180.0,
                 capacity: int = 1024) -> None:
        check_count(n_replicas, "n_replicas")
        if n_replicas > MAX_REPLICAS:
            raise ValueError(f"n_replicas must be <= {MAX_REPLICAS}, got {n_replicas}")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {sorted(MODES)}, got {mode!r}")
        self.n_replicas, self.mode = n_replicas, mode
        self.ttl_s = math.inf if mode == "precise" else check_positive(ttl_s, "ttl_s")
        check_count(capacity, "capacity")
        self.tree = KeyTree(capacity)
        self.mask = np.zeros(capacity, dtype=np.uint64)
        self.stamp = np.zeros(capacity if mode == "approximate" else 0, dtype=np.float32)
        self.last_seq = np.full(n_replicas, -1, dtype=np.int64)
        self.gaps: list[tuple[int, int, int]] = []
        self._scratch = np.empty(64, dtype=np.int64)
        self.version = 0
        """Bumped by every change of what :meth:`match` reads (blocks, stamps, the TTL)."""

    # -- state -------------------------------------------------------------------------
    @property
    def n_blocks(self) -> int:
        """Blocks some replica holds (or, approximate, was sent and not yet freed)."""
        return self.tree.size

    @property
    def parent(self) -> np.ndarray:
        """Each node's parent node (-1: a root or a free node)."""
        return self.tree.parent

    @property
    def nbytes(self) -> int:
        """Memory of the index's tables."""
        return self.tree.nbytes + self.mask.nbytes + self.stamp.nbytes

    def _room(self, blocks: int) -> None:
        """Room for ``blocks`` new nodes: the columns doubled until they fit."""
        room = len(self.mask)
        while room - self.tree.size < blocks:
            room *= 2
        if room > len(self.mask):
            more = room - len(self.mask)
            self.tree.grow(room)
            self.mask = np.concatenate([self.mask, np.zeros(more, dtype=np.uint64)])
            if self.stamp.size:
                self.stamp = np.concatenate([self.stamp, np.zeros(more, dtype=np.float32)])
        self.tree.reserve(blocks)

    def _keys_of(self, keys: object) -> np.ndarray:
        if type(keys) is np.ndarray and keys.dtype is _INT64 and keys.ndim == 1:
            return keys  # as the kernels take them (a gateway's keys: no checks to make)
        arr = np.asarray(keys)
        if arr.ndim != 1:
            raise ValueError(f"block keys must be a 1-d sequence, got shape {arr.shape}")
        return hashindex.as_keys(arr)

    def _check(self, replica: int) -> None:
        if not 0 <= replica < self.n_replicas:
            raise ValueError(f"replica must be in 0..{self.n_replicas - 1}, got {replica}")

    def _bit(self, replica: int) -> np.uint64:
        self._check(replica)
        return np.uint64(1 << replica)  # one numpy scalar (replica < 64)

    def _add(self, replica: int, keys: np.ndarray, parent: int) -> None:
        """The nodes of ``keys`` (a chain under node ``parent``), ``replica``'s bit set."""
        bit = self._bit(replica)
        self._room(keys.size)
        self.mask[self.tree.chain(keys, parent)] |= bit
        self.version += 1

    # -- precise: the engines' KV events -----------------------------------------------
    def sequence(self, replica: int, seq: int) -> bool:
        """Check a batch's sequence number: False for a duplicate (drop the batch); a gap is
        recorded in ``gaps`` as ``(replica, first missing, received)``."""
        self._check(replica)
        last = int(self.last_seq[replica])
        if seq <= last:
            return False
        if last >= 0 and seq > last + 1:
            self.gaps.append((replica, last + 1, seq))
        self.last_seq[replica] = seq
        return True

    def stored(self, replica: int, keys: object, parent: int | None = None) -> None:
        """``BlockStored``: ``replica`` now holds ``keys`` (a chain, root first, under the
        block ``parent`` or at the root)."""
        arr = self._keys_of(keys)
        parent_node = -1 if parent is None else self.tree.get(parent)
        self._add(replica, arr, parent_node)

    def removed(self, replica: int, keys: object) -> None:
        """``BlockRemoved``: ``replica`` dropped ``keys``."""
        tree = self.tree
        _remove(tree.slots, tree.key, tree.parent, tree.state, self.mask,
                self._keys_of(keys), self._bit(replica))
        self.version += 1

    def cleared(self, replica: int) -> None:
        """``AllBlocksCleared`` (or a replica that left): ``replica`` holds nothing."""
        bit = self._bit(replica)
        live = np.flatnonzero(self.mask & bit)
        self.mask[live] &= ~bit
        self.tree.free(live[self.mask[live] == 0])  # emptied: out of the key index
        self.version += 1

    # -- approximate: what was sent where ----------------------------------------------
    def sent(self, replica: int, keys: object, now: float) -> None:
        """A request whose blocks are ``keys`` was sent to ``replica`` at ``now`` (s)."""
        if self.mode != "approximate":
            raise ValueError("sent() feeds an approximate index; a precise one takes events")
        arr = self._keys_of(keys)
        self._check(replica)
        self._room(arr.size)
        tree = self.tree
        send_keys(tree.slots, tree.key, tree.parent, tree.state, tree.by_parent, self.mask,
                  self.stamp, arr, replica, now, self.ttl_s, self.scratch(arr.size)[:arr.size])
        self.version += 1

    def reported(self, predicted_blocks: int, cached_blocks: int) -> None:
        """An engine reported ``cached_blocks`` cached where the index predicted
        ``predicted_blocks``: calibrate the TTL."""
        if self.mode == "approximate":
            self.ttl_s = float(calibrate_ttl(self.ttl_s, predicted_blocks, cached_blocks))
            self.version += 1

    def expire(self, now: float) -> int:
        """Free every node not sent anywhere within the TTL; returns how many."""
        if self.mode != "approximate":
            return 0
        used = self.mask != 0
        stale = np.flatnonzero(used & (now - self.stamp > self.ttl_s))
        self.mask[stale] = 0
        self.tree.free(stale)
        self.version += 1
        return int(stale.size)

    # -- queries -----------------------------------------------------------------------
    def match(self, keys: object, now: float = 0.0, out: np.ndarray | None = None
              ) -> np.ndarray:
        """Blocks of the chain ``keys`` each replica holds before its first miss."""
        arr = self._keys_of(keys)
        if out is None:
            out = np.zeros(self.n_replicas, dtype=np.int64)
        tree = self.tree
        match_keys(tree.slots, tree.key, tree.parent, self.mask, self.stamp, arr, now,
                   self.ttl_s, self.scratch(arr.size), out)
        return out

    def scratch(self, blocks: int) -> np.ndarray:
        """Node scratch for a chain of ``blocks`` keys (:func:`match_keys`' ``nodes``)."""
        if self._scratch.size < blocks:
            self._scratch = np.empty(2 * blocks, dtype=np.int64)
        return self._scratch

    def holders(self, key: int) -> list[int]:
        """Replicas holding the block ``key``."""
        v = self.tree.get(key)
        bits = int(self.mask[v]) if v >= 0 else 0
        return [r for r in range(self.n_replicas) if bits >> r & 1]
