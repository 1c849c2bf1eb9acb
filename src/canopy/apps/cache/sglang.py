"""Canopy's eviction in SGLang's radix cache, and a driver that replays a trace through it.

SGLang (``sglang.srt.mem_cache.radix_cache.RadixCache``) keeps a compressed radix tree of token
ids, evicts whole unlocked leaf *nodes* in the order of an eviction strategy's
``get_priority(node)`` (``evict_policy.py``: LRU ``last_access_time``, LFU ``(hit_count,
last_access_time)``), and has a simulated mode without memory pools
(``RadixCache.create_simulated``). Two pieces plug Canopy in:

* :class:`CanopyStrategy`: an eviction strategy whose priority is Canopy's decayed count of
  the node's deepest block (the cells of :func:`~canopy.apps.cache.radix._cells_update`, the
  same kernel and key as the replay; one fixed half-life, because SGLang's single strategy
  slot has no room for the shadow caches that choose Canopy's arm). Assign it to a cache's
  ``eviction_strategy`` and call :meth:`CanopyStrategy.observe` with each request's blocks.
* :func:`drive`: replays a :class:`~canopy.apps.cache.traces.Trace` through any cache with
  SGLang's interface, one token per block (page size 1, the token id of a block is its node id
  in the trace), as the scheduler does: match the prefix, lock it, evict what the new blocks
  need, insert the request, unlock. Returns the blocks each request reused.

SGLang itself needs its CUDA stack to install (``sglang`` 0.5.23 requires torch 2.14.1,
``flashinfer_python[cu13]``, ``cuda-python``, ``sgl-deep-ep`` ...), so these machines test the
driver and the strategy against a small stand-in with SGLang's interface and semantics
(``tests/sglang_standin.py``); with SGLang installed, pass its module to :func:`drive`.
"""

from __future__ import annotations

import math
from array import array
from typing import Any

import numpy as np

from canopy.apps.cache import radix
from canopy.apps.cache.policies import Canopy

__all__ = ["CanopyStrategy", "drive", "sglang_api"]


class _NoPool:
    """The allocator of a simulated SGLang cache: nothing to free."""

    device = "cpu"

    def free_segment(self, *args: Any, **kwargs: Any) -> None:
        pass


def sglang_api() -> Any:
    """SGLang's key and parameter types and ``simulated(policy)``, a pool-less radix cache
    (raises ImportError without SGLang)."""
    from types import SimpleNamespace

    from sglang.srt.mem_cache import base_prefix_cache as base
    from sglang.srt.mem_cache import radix_cache
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams

    def simulated(policy: str) -> Any:
        """A pool-less cache (as ``RadixCache.create_simulated``) with ``policy``."""
        return radix_cache.RadixCache(CacheInitParams(
            disable=False, req_to_token_pool=None, token_to_kv_pool_allocator=_NoPool(),
            page_size=1, eviction_policy=policy))

    return SimpleNamespace(RadixKey=radix_cache.RadixKey, simulated=simulated,
                           MatchPrefixParams=base.MatchPrefixParams,
                           InsertParams=base.InsertParams, EvictParams=base.EvictParams)


class CanopyStrategy:
    """SGLang eviction strategy backed by Canopy's cells: priority ``log S_H + lam c_last``
    of the node's deepest block (lower evicts first), ``S_H`` its use count discounted with a
    half-life of ``half_life`` capacities of traffic, with the parental prior."""

    def __init__(self, trace: Any, capacity: int, *, half_life: float = 8.0,
                 prior: float = 1.0) -> None:
        policy = Canopy(half_lives=(half_life,), prior=prior)
        self._kind, self._params = policy.kernel(trace, capacity)
        self._parent, self._depth = trace.parent, trace.depth
        self._cells = np.zeros((trace.n_nodes, radix._S0 + 1))
        self._cells[:, radix._CL] = -1.0
        self._sc = radix._scalars()
        self._sc[radix._ARM] = 1  # the decayed arm
        self._ni = radix._node_table(0)

    def observe(self, path: np.ndarray) -> None:
        """Count one request's blocks (root first), before the cache serves it."""
        radix._cells_update(0, len(path), np.asarray(path, dtype=np.int64), self._parent,
                            self._cells, self._sc, self._params)

    def get_priority(self, node: Any) -> float:
        tokens = node.key.token_ids if hasattr(node.key, "token_ids") else node.key
        if len(tokens) == 0:
            return -math.inf
        return float(radix._key(self._kind, int(tokens[-1]), self._depth, self._ni,
                                self._cells, self._params, self._sc))


def drive(api: Any, cache: Any, trace: Any, capacity: int, *,
          strategy: CanopyStrategy | None = None, per_block: bool = False) -> np.ndarray:
    """Replay ``trace`` through ``cache`` (SGLang's interface, ``api`` its types) with room
    for ``capacity`` blocks; returns the blocks each request reused.

    A request's new blocks are inserted at once (one radix node, which SGLang evicts whole),
    or with ``per_block`` one prefix longer at a time (one node a block, as chunked prefill
    with one-block chunks leaves them): then SGLang's leaf eviction is block for block the
    replay's, and its ``lru``/``lfu`` equal Canopy's (``tests/test_cache_sglang.py``)."""
    reused = np.zeros(trace.n_requests, dtype=np.int64)
    for i in range(trace.n_requests):
        path = trace.path(i)
        if strategy is not None:
            strategy.observe(path)
        key = api.RadixKey(array("q", path.tolist()))
        match = cache.match_prefix(api.MatchPrefixParams(key=key))
        hit, node = match.device_prefix_len, match.last_device_node
        reused[i] = hit
        cache.inc_lock_ref(node)
        used = cache.evictable_size() + cache.protected_size()
        if used + len(path) - hit > capacity:
            cache.evict(api.EvictParams(num_tokens=used + len(path) - hit - capacity))
        room = capacity - cache.evictable_size() - cache.protected_size()
        keep = hit + min(len(path) - hit, max(room, 0))  # what fits (all blocks locked)
        # the finished request is inserted whole even when all of it was cached (that counts
        # its hits); SGLang counts a request once, so later chunks pass what was inserted
        ends = list(range(hit + 1, keep + 1)) if per_block and keep > hit else [keep]
        inserted = 0
        for end in ends if keep > 0 else ():
            cache.insert(api.InsertParams(key=key[:end], value=None, inserted_len=inserted))
            inserted = end
        cache.dec_lock_ref(node)
    return reused
