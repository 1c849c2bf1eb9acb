"""A paged engine's evictable cached blocks, in the order an online policy evicts them.

A paged engine (vLLM's ``BlockPool``, SGLang's token pool) keeps KV blocks in a fixed pool.
When every request using a cached block has finished, the block is *free* but still holds its
prefix: a later request may hit it (the engine takes it back) or the engine may take it for
new tokens, evicting what it held. Which free cached block goes first is the eviction policy
(paper Section 4). :class:`EvictableBlocks` is that choice, host-agnostic:

* :meth:`release` (the engine freed a cached block), :meth:`acquire` (a hit took it back),
  :meth:`pop_victim` (the engine needs a block: the lowest priority goes);
* the order is the policy's ``priority(key)`` (lower evicts first), ties by release order,
  among the free *leaves* (blocks no cached block hangs under, known from the chains the
  policy observed), as the replay and SGLang evict;
  with no policy it is release order alone, the engine's own LRU queue (vLLM appends freed
  blocks to its queue's tail, a request's deepest block first, and evicts from the head);
* a policy that re-orders its priorities (``canopy`` switching arms) bumps ``epoch``; the
  heap is rebuilt then, lazily, and :meth:`refresh` re-keys free blocks a request observed.

Memory is O(free blocks): one entry per free block and a heap compacted at twice that.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
from collections.abc import Hashable, Iterable, Sequence
from typing import Any, Protocol

import numpy as np

__all__ = ["EvictableBlocks", "EvictionOrder"]


class EvictionOrder(Protocol):
    """What :class:`EvictableBlocks` reads of an online policy
    (:class:`~canopy.prefix.stream.OnlinePolicy`): its epoch, whether it evicts by a hand
    over insertion order (``hand``; then it answers :meth:`visited` and
    :meth:`clear_visited`), its priorities, and it hears of each eviction."""

    epoch: int
    hand: bool

    def priorities(self, keys: Sequence[Hashable]) -> Sequence[Any]:  # pragma: no cover
        """Eviction priorities of blocks' keys (lower evicts first), one call for many."""

    def visited(self, key: Hashable) -> bool:  # pragma: no cover - protocol
        """``hand``: whether block ``key`` was reused since the hand last passed it."""

    def clear_visited(self, key: Hashable) -> None:  # pragma: no cover - protocol
        """``hand``: the hand passes block ``key``."""

    def evicted(self, key: Hashable) -> None:  # pragma: no cover - protocol
        """The host dropped block ``key``."""


class EvictableBlocks:
    """Free cached blocks (engine block ids) keyed by their prefix keys, popped in the order
    of ``policy`` (``None``: release order, the engine's LRU). A policy with a ``hand``
    (``sieve``) is served by SIEVE's hand: it walks the free blocks in insertion order (its
    priorities) from after its last victim, wrapping, clears the visited blocks it passes and
    evicts the first unvisited one."""

    def __init__(self, policy: EvictionOrder | None = None) -> None:
        self.policy = policy
        self._key: dict[int, Hashable] = {}  # every block known: free or pinned
        self._blocks_of: dict[Hashable, set[int]] = {}
        self._entry: dict[int, tuple[Any, int]] = {}  # free block -> (priority, stamp)
        self._heap: list[tuple[Any, int, int]] = []
        self._stamp = 0
        self._epoch = None if policy is None else policy.epoch
        self._sieve = policy is not None and policy.hand
        self._hand: Any = None  # sieve: the priority of the last victim
        self._pending: list[Hashable] = []  # keys observed, their free blocks to re-key
        self._parent: dict[Hashable, Hashable] = {}  # from the observed chains
        self._children: dict[Hashable, int] = {}  # known blocks under a key

    def __len__(self) -> int:
        """Free (evictable) blocks."""
        return len(self._entry)

    def __contains__(self, block: int) -> bool:
        return block in self._entry

    def _priorities(self, keys: Sequence[Hashable], stamps: Sequence[int]) -> Sequence[Any]:
        if self.policy is None:
            return stamps
        return np.asarray(self.policy.priorities(keys)).tolist()

    def _push(self, block: int, priority: Any, stamp: int) -> None:
        self._entry[block] = (priority, stamp)
        heapq.heappush(self._heap, (priority, stamp, block))

    def release(self, block: int, key: Hashable) -> None:
        """The engine freed ``block``, which caches ``key``: it may be evicted from now on."""
        self.release_all([block], [key])

    def release_all(self, blocks: Sequence[int], keys: Sequence[Hashable]) -> None:
        """:meth:`release` of ``blocks[i]`` caching ``keys[i]``, in that order, the policy's
        priorities asked once for all."""
        self._flush()
        stamps = range(self._stamp + 1, self._stamp + 1 + len(blocks))
        self._stamp += len(blocks)
        ranked = self._priorities(keys, stamps)
        for block, key, priority, stamp in zip(blocks, keys, ranked, stamps, strict=True):
            if self._key.get(block) != key:
                self.drop(block)
                self._key[block] = key
                self._blocks_of.setdefault(key, set()).add(block)
                parent = self._parent.get(key)
                if parent is not None:
                    self._children[parent] = self._children.get(parent, 0) + 1
            self._push(block, priority, stamp)
            if len(self._heap) > 2 * len(self._entry) + 64:
                self._rebuild()

    def acquire(self, block: int) -> bool:
        """A request took ``block`` back (a hit): pinned, not evictable until released.
        Returns whether it was free."""
        return self._entry.pop(block, None) is not None

    def drop(self, block: int) -> None:
        """The engine reused ``block`` or dropped its key: forget it."""
        self._entry.pop(block, None)
        key = self._key.pop(block, None)
        if key is not None:
            same = self._blocks_of[key]
            same.discard(block)
            if not same:
                del self._blocks_of[key]
            parent = self._parent.get(key)
            if parent is not None and self._children.get(parent, 0) > 0:
                self._children[parent] -= 1

    def observe(self, keys: Sequence[Hashable]) -> None:
        """A request was admitted with block keys ``keys``, root first: the policy observes
        it and the free blocks among them are re-keyed (:meth:`refresh`)."""
        if self.policy is None:
            return
        self._flush()  # what earlier requests left pending, ranked before the policy moves
        self.policy.observe(keys)
        self.refresh(keys)

    def refresh(self, keys: Iterable[Hashable]) -> None:
        """Re-key the free blocks among ``keys`` (a request observed them, root first; call
        after the policy's ``observe``, or call :meth:`observe`); rebuild the order if the
        policy's epoch moved. The re-keying waits for the next release, victim or request:
        most of those blocks are the request's hits, which the engine takes back first."""
        if self.policy is None:
            return
        keys = list(keys)
        if len(self._parent) > 4 * len(self._key) + 4096:  # bounded: known blocks' only
            self._parent = {k: p for k, p in self._parent.items() if k in self._blocks_of}
        for parent, key in itertools.pairwise(keys):
            self._parent.setdefault(key, parent)
        if self.policy.epoch != self._epoch:
            self._rebuild()
            return
        self._pending.extend(keys)

    def _flush(self) -> None:
        """Re-key the free blocks among the keys :meth:`refresh` left pending (the policy has
        not moved since: every call that precedes a change of the policy flushes first)."""
        if not self._pending:
            return
        keys, self._pending = self._pending, []
        free = [(block, key) for key in keys for block in self._blocks_of.get(key, ())
                if block in self._entry]
        if free:
            ranked = self._priorities([key for _, key in free], [0] * len(free))
            for (block, _), priority in zip(free, ranked, strict=True):
                self._push(block, priority, self._entry[block][1])

    def pop_victim(self) -> int | None:
        """The free block to evict (removed from the set, reported to the policy), or
        ``None`` when there is none."""
        self._flush()
        if self.policy is not None and self.policy.epoch != self._epoch:
            self._rebuild()
        block = self._sieve_victim() if self._sieve else self._lowest()
        if block is not None:
            key = self._key[block]
            self.drop(block)
            if self.policy is not None:
                self.policy.evicted(key)
        return block

    def _lowest(self) -> int | None:
        """The lowest-priority free leaf (a block no cached block hangs under, as the replay
        and SGLang evict): a policy whose priority rises from a block to its parent (most
        recently used first) would otherwise cut a chain in the middle. Entries of blocks
        with cached children go back to the heap; should every free block have some (the
        host dropped a block without telling), the lowest goes."""
        held: list[tuple[Any, int, int]] = []
        victim = None
        while self._heap:
            entry = heapq.heappop(self._heap)
            priority, stamp, block = entry
            if self._entry.get(block) != (priority, stamp):
                continue
            if self.policy is not None and self._children.get(self._key[block]):
                held.append(entry)
                continue
            victim = block
            break
        if victim is None and held:
            victim = held.pop(0)[2]
        for entry in held:
            heapq.heappush(self._heap, entry)
        return victim

    def _sieve_victim(self) -> int | None:
        """SIEVE's hand over every known block, pinned ones included (it clears their
        visited bits as it passes, as the replay's hand does), evicting only free leaves."""
        if not self._entry:
            return None
        policy: Any = self.policy
        blocks = list(self._key)
        order = sorted(zip(self._priorities([self._key[b] for b in blocks], blocks), blocks,
                           strict=True))
        start = 0 if self._hand is None else bisect.bisect_right(order, (self._hand, math.inf))
        for i in range(2 * len(order)):  # the second lap finds the bits cleared
            priority, block = order[(start + i) % len(order)]
            key = self._key[block]
            if policy.visited(key):
                policy.clear_visited(key)
            elif block in self._entry and not self._children.get(key):
                self._hand = priority
                return block
        return None  # pragma: no cover - the second lap always finds one

    def _rebuild(self) -> None:
        """The heap anew from the current priorities (stale entries dropped)."""
        if self.policy is not None:
            self._epoch = self.policy.epoch
        self._pending = []  # every free block is re-keyed here
        blocks = list(self._entry)
        stamps = [self._entry[block][1] for block in blocks]
        ranked = self._priorities([self._key[block] for block in blocks], stamps)
        self._entry = dict(zip(blocks, zip(ranked, stamps, strict=True), strict=True))
        self._heap = [(p, s, b) for b, (p, s) in self._entry.items()]
        heapq.heapify(self._heap)
