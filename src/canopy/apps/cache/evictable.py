"""A paged engine's evictable cached blocks, in the order an online policy evicts them.

A paged engine (vLLM's ``BlockPool``, SGLang's token pool) keeps KV blocks in a fixed pool.
When every request using a cached block has finished, the block is *free* but still holds its
prefix: a later request may hit it (the engine takes it back) or the engine may take it for
new tokens, evicting what it held. Which free cached block goes first is the eviction policy
(paper Section 4). :class:`EvictableBlocks` is that choice, host-agnostic:

* :meth:`release` (the engine freed a cached block), :meth:`acquire` (a hit took it back),
  :meth:`pop_victim` (the engine needs a block: the lowest priority goes);
* the order is the policy's ``priority(key)`` (lower evicts first), ties by release order;
  with no policy it is release order alone, the engine's own LRU queue (vLLM appends freed
  blocks to its queue's tail, a request's deepest block first, and evicts from the head);
* a policy that re-orders its priorities (``canopy`` switching arms) bumps ``epoch``; the
  heap is rebuilt then, lazily, and :meth:`refresh` re-keys free blocks a request observed.

Memory is O(free blocks): one entry per free block and a heap compacted at twice that.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterable
from typing import Any, Protocol

__all__ = ["EvictableBlocks", "PriorityPolicy"]


class PriorityPolicy(Protocol):
    """What :class:`EvictableBlocks` reads of an online policy."""

    epoch: int

    def priority(self, key: Hashable) -> Any:  # pragma: no cover - protocol
        """Eviction priority of a cached block's key; lower evicts first."""


class EvictableBlocks:
    """Free cached blocks (engine block ids) keyed by their prefix keys, popped in the order
    of ``policy`` (``None``: release order, the engine's LRU)."""

    def __init__(self, policy: PriorityPolicy | None = None) -> None:
        self.policy = policy
        self._key: dict[int, Hashable] = {}
        self._entry: dict[int, tuple[Any, int]] = {}  # block -> (priority, stamp)
        self._heap: list[tuple[Any, int, int]] = []
        self._stamp = 0
        self._epoch = None if policy is None else policy.epoch

    def __len__(self) -> int:
        return len(self._key)

    def __contains__(self, block: int) -> bool:
        return block in self._key

    def _priority(self, key: Hashable, stamp: int) -> Any:
        return stamp if self.policy is None else self.policy.priority(key)

    def _push(self, block: int, key: Hashable, stamp: int) -> None:
        priority = self._priority(key, stamp)
        self._entry[block] = (priority, stamp)
        heapq.heappush(self._heap, (priority, stamp, block))

    def release(self, block: int, key: Hashable) -> None:
        """The engine freed ``block``, which caches ``key``: it may be evicted from now on."""
        self._stamp += 1
        self._key[block] = key
        self._push(block, key, self._stamp)
        if len(self._heap) > 2 * len(self._key) + 64:
            self._rebuild()

    def acquire(self, block: int) -> bool:
        """A request took ``block`` back (a hit) or the engine dropped its key: no longer
        evictable. Returns whether it was."""
        self._entry.pop(block, None)
        return self._key.pop(block, None) is not None

    def refresh(self, keys: Iterable[Hashable]) -> None:
        """Re-key the free blocks among ``keys`` (a request observed them) and rebuild the
        order if the policy's epoch moved."""
        if self.policy is None:
            return
        if self.policy.epoch != self._epoch:
            self._rebuild()
            return
        wanted = set(keys)
        for block, key in self._key.items():
            if key in wanted:
                self._push(block, key, self._entry[block][1])

    def pop_victim(self) -> int | None:
        """The free block to evict (removed from the set), or ``None`` when there is none."""
        if self.policy is not None and self.policy.epoch != self._epoch:
            self._rebuild()
        while self._heap:
            priority, stamp, block = heapq.heappop(self._heap)
            if self._entry.get(block) == (priority, stamp):
                self.acquire(block)
                return block
        return None

    def _rebuild(self) -> None:
        """The heap anew from the current priorities (stale entries dropped)."""
        if self.policy is not None:
            self._epoch = self.policy.epoch
        self._entry = {block: (self._priority(self._key[block], stamp), stamp)
                       for block, (_, stamp) in self._entry.items()}
        self._heap = [(p, s, b) for b, (p, s) in self._entry.items()]
        heapq.heapify(self._heap)
