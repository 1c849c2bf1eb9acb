"""A trace replayed through SGLang's own radix cache (``canopy cache replay --engine sglang``).

SGLang (``sglang.srt.mem_cache.radix_cache.RadixCache``) keeps a compressed radix tree of token
ids and evicts whole unlocked leaf *nodes* in the order of its eviction strategy
(``evict_policy.py``: ``lru`` ``last_access_time``, ``lfu`` ``(hit_count,
last_access_time)``; ``canopy`` :class:`~canopy.integrations.sglang.CanopyEviction`, which
learns online from the cache's inserts). :func:`drive` replays a
:class:`~canopy.prefix.traces.Trace` through any cache with SGLang's interface, one token
per block (page size 1, the token of a block is its node id in the trace), as the scheduler
does: match the prefix, lock it, evict what the new blocks need, insert the request, unlock.
:func:`sweep` does it for SGLang's real cache (without a model, as
``RadixCache.create_simulated``, its KV indices from a pool of the cache's size as a
server's are: :class:`KVPool`) under several strategies and capacities (``canopy`` in
Canopy's backend, which evicts page-exactly), with the replay's metrics, so the engine can
be set beside Canopy's own replay (``tests/test_cache_sglang.py`` checks that the two agree
block for block for ``lru`` and ``lfu``).
"""

from __future__ import annotations

import time
from array import array
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from canopy.apps.cache.replay import ReplayResult, result, scenario
from canopy.prefix.policies import LFU, LRU, EvictionPolicy, resolve_policy
from canopy.prefix.traces import Trace
from canopy.prefix.ttft import TTFTModel
from canopy.validation import check_count

__all__ = ["ENGINE_POLICIES", "KVPool", "drive", "serve_request", "sglang_api", "sweep"]

ENGINE_POLICIES = ("lru", "lfu", "canopy")
"""Strategies :func:`sweep` runs by name: SGLang's ``lru`` and ``lfu``, Canopy's ``canopy``;
a priority policy of the user's own runs too (``package.module:ClassName`` or the object)."""


class KVPool:
    """The token pool of a simulated SGLang cache (page size 1): KV indices handed out and
    freed as SGLang's ``TokenToKVPoolAllocator`` (``mem_cache/allocator/token.py``) does.
    Its free list holds ``1..size`` (index 0 is SGLang's padding slot); :meth:`alloc` takes
    from the front, :meth:`free_segment` (the tree evicting a node, or a request's
    duplicates of what the tree holds) appends to the back; ``None`` when fewer are free.
    Without a ``size`` a new index is made only when none is free, so the largest index is
    the most the cache ever held at once. ``vector`` makes the values the tree keeps (SGLang:
    an int64 tensor)."""

    device = "cpu"

    def __init__(self, size: int | None = None,
                 vector: Callable[[list[int]], Any] = list) -> None:
        self.size = None if size is None else check_count(size, "size")
        self.vector = vector
        self._made = self.size or 0
        self._free = deque(range(1, self._made + 1))

    def available_size(self) -> int:
        """Indices free (without a size: those freed and not yet handed out again)."""
        return len(self._free)

    def alloc(self, need: int) -> list[int] | None:
        """``need`` free indices, oldest free first; ``None`` when a sized pool is short."""
        short = need - len(self._free)
        if short > 0:
            if self.size is not None:
                return None
            self._free.extend(range(self._made + 1, self._made + short + 1))
            self._made += short
        return [self._free.popleft() for _ in range(need)]

    def free_segment(self, free_index: Any, *, start_pos: int = 0) -> None:
        """SGLang's call: ``free_index`` (a request's KV row segment) is free again."""
        ids = free_index.tolist() if hasattr(free_index, "tolist") else free_index
        self._free.extend(int(i) for i in ids)


def sglang_api() -> Any:
    """SGLang's key and parameter types and ``simulated(policy, config, exact=, size=)``, a
    radix cache without a model, its KV indices from a :class:`KVPool`. Canopy's strategy
    and its ``canopy`` radix-cache backend come through SGLang's plugin loader, which runs
    Canopy's ``sglang.srt.plugins`` entry point (:mod:`canopy.integrations.sglang`) as
    SGLang's server does. Raises ImportError without SGLang or without Canopy's plugin."""
    from types import SimpleNamespace

    import torch
    from sglang.srt.mem_cache import base_prefix_cache as base
    from sglang.srt.mem_cache import radix_cache, registry
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.plugins import load_plugins

    load_plugins()
    exact_cache = registry.get_radix_cache_factory("canopy")
    if exact_cache is None:
        raise ImportError("Canopy's SGLang plugin did not register (entry point "
                          "sglang.srt.plugins: canopy); is Canopy installed in SGLang's "
                          "environment?")

    def simulated(policy: str, config: dict | None = None, *, exact: bool = False,
                  size: int | None = None) -> Any:
        """A cache without a model (as ``RadixCache.create_simulated``) with ``policy``, its
        KV indices from a :class:`KVPool` of ``size``; ``exact``: Canopy's backend
        (page-exact eviction) instead of SGLang's ``RadixCache``."""
        pool = KVPool(size, vector=lambda ids: torch.tensor(ids, dtype=torch.int64))
        params = CacheInitParams(
            disable=False, req_to_token_pool=None, token_to_kv_pool_allocator=pool,
            page_size=1, eviction_policy=policy, eviction_policy_config=config)
        if exact:  # the backend's factory reads the build context's cache parameters
            return exact_cache(SimpleNamespace(params=params))
        return radix_cache.RadixCache(params)

    return SimpleNamespace(RadixKey=radix_cache.RadixKey, simulated=simulated,
                           MatchPrefixParams=base.MatchPrefixParams,
                           InsertParams=base.InsertParams, EvictParams=base.EvictParams)


def drive(api: Any, cache: Any, trace: Trace, capacity: int, *,
          per_block: bool = False) -> np.ndarray:
    """Replay ``trace`` through ``cache`` (SGLang's interface, ``api`` its types) with room
    for ``capacity`` blocks; returns the blocks each request reused.

    A request's new blocks are inserted at once (one radix node, which SGLang evicts whole),
    or with ``per_block`` one prefix longer at a time (one node a block, as chunked prefill
    with one-block chunks leaves them): then SGLang's leaf eviction is block for block the
    replay's, and its ``lru``/``lfu`` equal Canopy's (``tests/test_cache_sglang.py``)."""
    return np.fromiter((serve_request(api, cache, trace.path(i).tolist(), capacity,
                                      per_block=per_block)
                        for i in range(trace.n_requests)), dtype=np.int64,
                       count=trace.n_requests)


def serve_request(api: Any, cache: Any, path: Sequence[int], capacity: int, *,
                  per_block: bool = False) -> int:
    """One request of :func:`drive`, its blocks ``path`` (one token a block) as SGLang's
    scheduler serves it: match the prefix, lock it, evict what the new blocks need, take
    their KV indices from the cache's pool (:class:`KVPool`), insert the request with them
    (freeing those of tokens the tree already held, as SGLang's ``_insert_cache`` does),
    unlock. Returns the blocks reused."""
    key = api.RadixKey(array("q", path))
    match = cache.match_prefix(api.MatchPrefixParams(key=key))
    hit, node = match.device_prefix_len, match.last_device_node
    cache.inc_lock_ref(node)
    used = cache.evictable_size() + cache.protected_size()
    if used + len(path) - hit > capacity:
        cache.evict(api.EvictParams(num_tokens=used + len(path) - hit - capacity))
    room = capacity - cache.evictable_size() - cache.protected_size()
    keep = hit + min(len(path) - hit, max(room, 0))  # what fits (all blocks locked)
    pool = cache.token_to_kv_pool_allocator
    new = pool.alloc(keep - hit)
    if new is None:
        raise RuntimeError(f"SGLang's tree holds {used} of {capacity} blocks, its pool has "
                           f"{pool.available_size()} free: the two disagree")
    values = pool.vector(list(map(int, cache.path_device_indices(node)))[:hit] + new)
    # the finished request is inserted whole even when all of it was cached (that counts
    # its hits); SGLang counts a request once, so later chunks pass what was inserted
    ends = list(range(hit + 1, keep + 1)) if per_block and keep > hit else [keep]
    inserted, owned = 0, hit  # owned: the row's indices the tree holds (the locked prefix)
    for end in ends if keep > 0 else ():
        done = cache.insert(api.InsertParams(key=key[:end], value=values[:end],
                                             inserted_len=inserted)).prefix_len
        if done > owned:  # the tree held these tokens already: the request's copies go
            pool.free_segment(values[owned:done], start_pos=owned)
        inserted = owned = end
    cache.dec_lock_ref(node)
    return int(hit)


def sweep(trace: Trace, *, policies: Sequence[str | EvictionPolicy], capacities: Sequence[int],
          scenario_name: str = "stationary", before: Trace | None = None,
          ttft: TTFTModel | None = None, api: Any = None) -> list[ReplayResult]:
    """Every strategy at every capacity, each a fresh SGLang radix cache (``api``: default
    :func:`sglang_api`) fed the scenario's requests: as they are served, SGLang's ``lru`` and
    ``lfu`` (by name) in its ``RadixCache``; ``canopy`` and a user's priority policy (a spec
    or object: online, ranked by priority, :func:`~canopy.prefix.policies.resolve_policy`) as
    Canopy's strategy in
    Canopy's backend (``--radix-cache-backend canopy``: the same cache, evicting
    page-exactly)."""
    if not policies or not capacities:
        raise ValueError("the sglang engine runs the policies lru, lfu, canopy or your own "
                         "priority policy, at one capacity at least")
    chosen = []
    for policy in policies:
        try:
            strategy = resolve_policy(policy, online=True, ranked=True)
        except ValueError as error:
            raise ValueError(f"the sglang engine runs the policies "
                             f"{', '.join(ENGINE_POLICIES)} or your own priority policy: "
                             f"{error}") from None
        sglangs_own = type(strategy) in (LRU, LFU)  # by name: SGLang's own strategies
        chosen.append((strategy.name, None if sglangs_own else strategy))
    api = sglang_api() if api is None else api
    joined, start = scenario(trace, scenario_name, before=before)
    results = []
    for capacity in capacities:
        for name, strategy in chosen:
            config = None if strategy is None else {"policy": strategy,
                                                    "capacity_blocks": int(capacity)}
            cache = api.simulated(name if strategy is None else "canopy", config,
                                  exact=strategy is not None, size=int(capacity))
            began, began_cpu = time.perf_counter(), time.thread_time()
            reused = drive(api, cache, joined, capacity)
            results.append(result(joined, name, capacity, reused, start=start, ttft=ttft,
                                  cpu_s=time.thread_time() - began_cpu,
                                  wall_s=time.perf_counter() - began))
    return results
