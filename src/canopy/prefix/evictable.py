"""A paged engine's evictable cached blocks, in the order an online policy evicts them.

A paged engine (vLLM's ``BlockPool``, SGLang's token pool) keeps KV blocks in a fixed pool.
When every request using a cached block has finished, the block is *free* but still holds its
prefix: a later request may hit it (the engine takes it back) or the engine may take it for
new tokens, evicting what it held. Which free cached block goes first is the eviction policy
(paper Section 4). :class:`EvictableBlocks` is the engine's side of that choice:

* :meth:`~EvictableBlocks.release_all` (the engine freed cached blocks),
  ``acquire`` / ``acquire_all`` (hits took blocks back), :meth:`~EvictableBlocks.drop` (its
  key is gone), :meth:`~EvictableBlocks.pop_victims` (the engine needs blocks);
* the victims are the policy's (:class:`~canopy.prefix.stream.OnlinePolicy`): its evictable
  set, compiled arrays beside its node table, hands them out among the free *leaves*, lowest
  priority first, or by SIEVE's hand (one compiled call per release, per allocation and per
  request observed). What stays here is what the policy cannot key: blocks whose keys it has
  not observed (or forgot) go first, in release order, until a request observes their keys;
* with no policy the order is release order alone, the engine's own LRU queue (vLLM appends
  freed blocks to its queue's tail, a request's deepest block first, and evicts from the
  head).

Memory is O(blocks): the policy's tables and, here, the unkeyed free blocks.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Protocol

import numpy as np

__all__ = ["EvictableBlocks", "EvictionOrder"]

Blocks = Sequence[int] | np.ndarray
"""Engine block ids: a sequence or an int64 array."""

Keys = Sequence[Hashable] | np.ndarray
"""Blocks' keys: hashable values, or an int64 array of folded keys."""


class EvictionOrder(Protocol):
    """What :class:`EvictableBlocks` asks of an online policy
    (:class:`~canopy.prefix.stream.OnlinePolicy`), which keeps the evictable set."""

    def observe(self, keys: Keys) -> None:  # pragma: no cover - protocol
        """Learn from one admitted request's block keys, root first."""

    def release(self, blocks: Blocks,
                keys: Keys) -> np.ndarray:  # pragma: no cover - protocol
        """Blocks freed, in order; returns which keys the policy knows."""

    def acquire(self, blocks: Blocks) -> None:  # pragma: no cover - protocol
        """Hits took ``blocks`` back."""

    def drop(self, blocks: Sequence[int]) -> None:  # pragma: no cover - protocol
        """``blocks`` are gone."""

    def pop_victims(self, n: int) -> np.ndarray:  # pragma: no cover - protocol
        """Up to ``n`` blocks to evict."""


class EvictableBlocks:
    """Free cached blocks (engine block ids, non-negative) with their keys, popped in the
    order of ``policy`` (``None``: release order, the engine's LRU). The map from an engine
    block to the policy's key is all that is kept here; hits are handed to the policy with
    the next call that reads the set.

    ``acquire(block)``: a request took ``block`` back (a hit): pinned, not evictable
    until released (a list's ``append``: an engine calls it once a hit block);
    ``acquire_all(blocks)``: of each of ``blocks`` (a list's ``extend``; a block that is not
    free is left as it is)."""

    def __init__(self, policy: EvictionOrder | None = None) -> None:
        self.policy = policy
        self._free: dict[int, Hashable] = {}  # release order: unkeyed blocks (all, no policy)
        self._waiting: dict[Hashable, list[int]] = {}  # unkeyed blocks by key
        self._acquired: list[int] = []  # hits not yet handed to the policy
        self.acquire: Callable[[int], None] = self._acquired.append
        self.acquire_all: Callable[[Iterable[int]], None] = self._acquired.extend

    def release(self, block: int, key: Hashable) -> None:
        """The engine freed ``block``, which caches ``key``: it may be evicted from now on."""
        self.release_all([block], [key])

    def release_all(self, blocks: Blocks, keys: Keys) -> None:
        """:meth:`release` of ``blocks[i]`` caching ``keys[i]``, in that order (one call to
        the policy)."""
        self._flush()
        if self.policy is None:
            self._unkeyed(blocks, keys)
            return
        self._forget(blocks)
        known = self.policy.release(blocks, keys)
        if not known.all():
            miss = np.flatnonzero(~known).tolist()
            self._unkeyed([blocks[i] for i in miss], [keys[i] for i in miss])

    def _unkeyed(self, blocks: Blocks, keys: Keys) -> None:
        """Blocks the order cannot key, to the tail of the release order."""
        self._forget(blocks)
        for block, key in zip(np.asarray(blocks, dtype=np.int64).tolist(), keys, strict=True):
            self._free[block] = key
            if self.policy is not None:
                self._waiting.setdefault(key, []).append(block)

    def _forget(self, blocks: Blocks) -> None:
        """Blocks leave the release order (nothing when it is empty)."""
        if not self._free:
            return
        for block in blocks:
            key = self._free.pop(block, None)
            if key is not None and self.policy is not None:
                same = self._waiting[key]
                same.remove(block)
                if not same:
                    del self._waiting[key]

    def drop(self, block: int) -> None:
        """The engine reused ``block`` or dropped its key: forget it."""
        self.drop_all([block])

    def drop_all(self, blocks: Sequence[int]) -> None:
        """:meth:`drop` of each of ``blocks``."""
        self._flush()
        self._forget(blocks)
        if self.policy is not None:
            self.policy.drop(blocks)

    def observe(self, keys: Keys) -> None:
        """A request was admitted with block keys ``keys``, root first: the policy observes
        it (and re-keys its free blocks); free blocks of keys it did not know join its set."""
        if self.policy is None:
            return
        self._flush()
        self.policy.observe(keys)
        if self._waiting:
            blocks = [b for key in keys for b in self._waiting.get(key, ())]
            if blocks:
                chosen = [self._free[b] for b in blocks]
                self._forget(blocks)
                self.release_all(blocks, chosen)

    def pop_victims(self, n: int) -> list[int]:
        """Up to ``n`` free blocks to evict (removed from the set, reported to the policy):
        unkeyed blocks first, in release order, then the policy's victims."""
        self._flush()
        if not self._free and self.policy is not None:
            return self.policy.pop_victims(n).tolist()
        out = list(itertools.islice(self._free, n))
        self._forget(out)
        if self.policy is not None and len(out) < n:
            out += self.policy.pop_victims(n - len(out)).tolist()
        return out

    def pop_victim(self) -> int | None:
        """The free block to evict, or ``None`` when there is none."""
        victims = self.pop_victims(1)
        return victims[0] if victims else None

    def _flush(self) -> None:
        """Hand the hits since the last call to the policy (and the release order)."""
        if not self._acquired:
            return
        blocks = np.array(self._acquired, dtype=np.int64)
        self._acquired.clear()  # the same list: :attr:`acquire` appends to it
        self._forget(blocks)
        if self.policy is not None:
            self.policy.acquire(blocks)
