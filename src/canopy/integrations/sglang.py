"""Canopy's eviction as an SGLang radix-cache eviction strategy, learnt online (the ``sglang``
extra; paper Section 4, "Serving systems").

SGLang evicts whole unlocked leaf nodes of its radix tree, lowest
``eviction_strategy.get_priority(node)`` first, and picks the strategy by the name given to
``--radix-eviction-policy``. One call, :func:`register` (run by SGLang itself in every
process through the ``sglang.srt.plugins`` entry point when Canopy is installed beside it),
adds ``canopy`` to SGLang's strategy registry and to the choices of
``--radix-eviction-policy``, and a radix-cache backend ``canopy`` (SGLang's ``RadixCache``,
whose inserts the strategy watches, evicting page-exactly: :func:`evict_exactly`)::

    sglang serve --model-path ... --radix-cache-backend canopy --radix-eviction-policy canopy

or, in code, ``register()`` and then a ``RadixCache`` built with ``eviction_policy="canopy"``.

The strategy learns from what SGLang's own radix cache does, with no trace: every
``insert`` (SGLang inserts a request's tokens when a prefill chunk ends and when the request
finishes, and counts each request once past ``inserted_len``, as its ``hit_count`` does) is
observed as the request's chain of page keys (a page's key hashes its tokens with its
parent's key, so it names the whole prefix), every leaf SGLang deletes is reported evicted, and
``get_priority(node)`` is the priority of the node's first page under
:class:`~canopy.prefix.stream.OnlinePolicy` (the replay's kernels: decayed cell counts
with the parental prior, shadow caches that pick how much to remember): SGLang evicts a node
whole, so the node is worth its most valuable page, and priorities never rise down a chain
(a page is used whenever a page below it is). Memory is bounded by
the policy's forgetting; a node caches its own page keys.

A policy of the user's own (a :class:`~canopy.prefix.policies.PriorityPolicy` subclass,
or any online priority policy) runs the same way: ``register(MyPolicy)`` (or the spec
``"package.module:MyPolicy"``, or the specs in ``CANOPY_SGLANG_POLICIES``, comma-separated,
which the entry point registers in every SGLang process) adds it under its ``name``; or pass
``{"policy": "package.module:MyPolicy"}`` in the ``canopy`` strategy's configuration.

Configuration (``--radix-eviction-policy-config``, JSON): ``policy`` (``canopy``, ``lru``
and ``lfu`` for parity checks, or ``package.module:ClassName``; default ``canopy``),
``capacity_blocks`` (the cache's size in pages; default: the KV pool's size, which a cache
without a pool must be given) and ``history_floor`` (the decayed count below which the policy
forgets a block SGLang no longer holds, bounding its memory; default 0.5) and ``max_nodes``
(the policy's node limit). Should the policy raise, or its tables outgrow ``max_nodes``, the
strategy ranks by SGLang's own LRU order (``last_access_time``) for the rest of the run
(:class:`~canopy.prefix.failsafe.FailSafePolicy`; ``strategy.policy.counts()``).
"""

from __future__ import annotations

import functools
import hashlib
import heapq
import itertools
import math
import os
import time
from collections.abc import Callable
from typing import Any

from canopy.prefix.failsafe import DEFAULT_MAX_NODES, FailSafePolicy
from canopy.prefix.policies import EvictionPolicy, resolve_policy
from canopy.prefix.stream import OnlinePolicy
from canopy.validation import check_count, check_open_unit

__all__ = ["ENV", "POLICY_NAME", "CanopyEviction", "evict_exactly", "install",
           "radix_cache_class", "register", "strategy_policy"]

POLICY_NAME = "canopy"
"""The name ``--radix-eviction-policy`` takes."""

ENV = "CANOPY_SGLANG_POLICIES"
"""Policy specs (comma-separated) that :func:`register` adds in every SGLang process."""

_KEYS = "_canopy_page_keys"  # a node's own page keys, with the token count they were made for


def strategy_policy(policy: str | EvictionPolicy | type[EvictionPolicy]) -> EvictionPolicy:
    """``policy`` (a name, ``package.module:ClassName``, a policy class or object) as an
    SGLang strategy can run it: online and ranking by priority (``sieve``'s hand is not a
    priority; :func:`~canopy.prefix.policies.resolve_policy`). Errors are one line."""
    return resolve_policy(policy, online=True, ranked=True)


class CanopyEviction:
    """SGLang eviction strategy backed by :class:`~canopy.prefix.stream.OnlinePolicy`
    (``policy``: ``canopy``, ``lru``, ``lfu``, or a priority policy of the user's own:
    :func:`strategy_policy`); built by SGLang's registry with the keyword arguments of
    ``--radix-eviction-policy-config``. The policy's state is made when the cache first
    inserts (then its page size and pool are known)."""

    def __init__(self, policy: str | EvictionPolicy | type[EvictionPolicy] = POLICY_NAME,
                 capacity_blocks: int | None = None, history_floor: float = 0.5,
                 max_nodes: int = DEFAULT_MAX_NODES) -> None:
        self.chosen = strategy_policy(policy)
        if capacity_blocks is not None:
            check_count(capacity_blocks, "capacity_blocks")
        check_open_unit(history_floor, "history_floor")
        self.policy_name = self.chosen.name
        self.capacity_blocks = capacity_blocks
        self.history_floor = history_floor
        self.max_nodes = check_count(max_nodes, "max_nodes")
        self.policy: FailSafePolicy | None = None
        self.page_size = 1

    def bind(self, cache: Any) -> FailSafePolicy:
        """The policy, made on first use for ``cache`` (its page size; its pool's size when
        no ``capacity_blocks`` was configured)."""
        if self.policy is None:
            self.page_size = int(getattr(cache, "page_size", 1) or 1)
            capacity = self.capacity_blocks
            if capacity is None:
                pool = getattr(cache, "token_to_kv_pool_allocator", None)
                size = getattr(pool, "size", None)
                if not size:
                    raise ValueError("the canopy eviction policy needs the cache's size: set "
                                     "capacity_blocks in --radix-eviction-policy-config")
                capacity = max(1, int(size) // self.page_size)
            self.policy = FailSafePolicy(OnlinePolicy(self.chosen, capacity,
                                                      history_floor=self.history_floor),
                                         max_nodes=self.max_nodes)
        return self.policy

    def observe(self, cache: Any, key: Any, inserted_len: int) -> None:
        """One insert of ``key`` (a ``RadixKey``) into ``cache``; tokens before
        ``inserted_len`` were inserted, and observed, with the same request before."""
        policy = self.bind(cache)
        keys = _page_keys(_tokens(key), self.page_size, _root(key))
        start = min(len(keys), max(0, inserted_len) // self.page_size)
        if keys and start < len(keys):
            policy.observe(keys, start=start)

    def evicted(self, node: Any) -> None:
        """SGLang deleted leaf ``node``: each of its pages leaves the cache."""
        if self.policy is not None:
            for key in _node_keys(node, self.page_size):
                self.policy.evicted(key)

    def get_priority(self, node: Any) -> float:
        """The priority of the node's first page, its most valuable (lower evicts first):
        evicting the node loses every page of it. Ranked by its last page instead, a node
        holding a hot prefix and a cold tail went first (conversation trace at 1,024 blocks:
        1.51 blocks reused a request against 1.85)."""
        if self.policy is None:
            raise RuntimeError(f"the {POLICY_NAME} eviction policy learns from the inserts of "
                               "SGLang's RadixCache; this cache evicted before showing it any "
                               f"(serve with --radix-cache-backend {POLICY_NAME})")
        keys = _node_keys(node, self.page_size)
        priority = self.policy.priority(keys[0]) if keys else -math.inf
        return node.last_access_time if self.policy.failed else priority  # SGLang's LRU


def _tokens(key: Any) -> Any:
    return key.token_ids if hasattr(key, "token_ids") else key


def _root(key: Any) -> int:
    """The chain's seed: SGLang keeps keys of different ``extra_key`` namespaces apart (a
    digest, not ``hash``, so that every tensor-parallel rank's process keys pages alike)."""
    extra = repr(getattr(key, "extra_key", None)).encode()
    return int.from_bytes(hashlib.blake2b(extra, digest_size=8).digest(), "little",
                          signed=True)


def _page_keys(tokens: Any, page_size: int, prev: int) -> list[int]:
    """Chain keys of the whole pages of ``tokens`` after a page keyed ``prev``."""
    out = []
    for i in range(0, len(tokens) - page_size + 1, page_size):
        prev = hash((prev, tuple(tokens[i:i + page_size])))
        out.append(prev)
    return out


def _node_keys(node: Any, page_size: int) -> list[int]:
    """The page keys of ``node``'s own tokens (SGLang page-aligns them: one page at least),
    cached on the node; SGLang splits a node by cutting its key, so a cache made for another
    length is made again from the parent's last key."""
    todo = []
    while node.parent is not None and getattr(node, _KEYS, (0,))[0] != len(node.key):
        todo.append(node)
        node = node.parent
    if not todo:
        return [] if node.parent is None else getattr(node, _KEYS)[1]
    prev = _root(todo[-1].key) if node.parent is None else getattr(node, _KEYS)[1][-1]
    for n in reversed(todo):
        keys = _page_keys(_tokens(n.key), page_size, prev)
        setattr(n, _KEYS, (len(n.key), keys))
        prev = keys[-1]
    return getattr(todo[0], _KEYS)[1]


def _strategy(cache: Any) -> CanopyEviction | None:
    strategy = getattr(cache, "eviction_strategy", None)
    return strategy if isinstance(strategy, CanopyEviction) else None


def _wrap(cls: type, name: str, before: Callable[..., None]) -> None:
    """Run ``before(self, *args)`` ahead of ``cls.name`` (once per class)."""
    original = getattr(cls, name)
    if getattr(original, "_canopy_hook", False):
        return

    @functools.wraps(original)
    def hooked(self: Any, *args: Any, **kwargs: Any) -> Any:
        strategy = _strategy(self)
        if strategy is not None:
            before(strategy, self, *args, **kwargs)
        return original(self, *args, **kwargs)

    hooked._canopy_hook = True  # type: ignore[attr-defined]
    setattr(cls, name, hooked)


def _on_insert(strategy: CanopyEviction, cache: Any, params: Any) -> None:
    if not getattr(cache, "disable", False):
        strategy.observe(cache, params.key, int(getattr(params, "inserted_len", 0) or 0))


def _on_delete(strategy: CanopyEviction, cache: Any, node: Any) -> None:
    strategy.evicted(node)


def install(cache_class: type) -> None:
    """Let ``cache_class`` (SGLang's ``RadixCache`` or one with its interface) show its
    inserts and deleted leaves to a :class:`CanopyEviction` it evicts with; other strategies
    are untouched."""
    _wrap(cache_class, "insert", _on_insert)
    _wrap(cache_class, "_delete_leaf", _on_delete)


def evict_exactly(cache: Any, num_tokens: int,
                  removed: Callable[[Any], None] | None = None) -> int:
    """Free ``num_tokens`` tokens (rounded up to pages) of SGLang radix cache ``cache``'s
    unlocked leaves, lowest ``get_priority`` first, as ``RadixCache.evict`` does, but
    page-exactly: a victim holding more pages than are still needed is split (SGLang's
    ``_split_node``) and only its tail goes, its head staying cached. SGLang frees the whole
    node, losing blocks no request needed gone; Canopy's replay and its shadows evict a chain
    deepest block first, and so does this. ``removed(node)`` follows each deletion (SGLang's
    KV events). Returns the tokens freed."""
    tie = itertools.count()
    strategy = cache.eviction_strategy

    def entry(node: Any) -> tuple:
        return strategy.get_priority(node), node.last_access_time, next(tie), node

    heap = [entry(node) for node in cache.evictable_leaves]
    heapq.heapify(heap)
    page, freed = cache.page_size, 0
    while freed < num_tokens and heap:
        node = heapq.heappop(heap)[-1]
        keep = len(node.key) - -(-(num_tokens - freed) // page) * page
        if keep > 0:
            cache._split_node(node.key, node, keep)
        cache.token_to_kv_pool_allocator.free_segment(node.value, start_pos=0)
        freed += len(node.key)
        cache._delete_leaf(node)
        if removed is not None:
            removed(node)
        parent = node.parent
        if parent is not cache.root_node and not parent.children and parent.lock_ref == 0:
            heapq.heappush(heap, entry(parent))
    return freed


@functools.cache
def radix_cache_class() -> type:
    """SGLang's ``RadixCache`` evicting with :func:`evict_exactly`: the ``canopy``
    radix-cache backend (needs SGLang)."""
    from sglang.srt.mem_cache.base_prefix_cache import EvictResult
    from sglang.srt.mem_cache.radix_cache import RadixCache

    class CanopyRadixCache(RadixCache):
        """SGLang's radix cache, evicting page-exactly."""

        def evict(self, params: Any) -> Any:
            if self.disable:
                return EvictResult()
            began = time.perf_counter()
            freed = evict_exactly(self, params.num_tokens, self.kv_events.record_remove)
            self.update_eviction_metrics(freed, began)
            return EvictResult(num_tokens_evicted=freed)

    return CanopyRadixCache


def register(*policies: str | EvictionPolicy | type[EvictionPolicy]) -> list[str]:
    """Make ``canopy``, each of ``policies`` (a policy class or object, or a spec
    ``package.module:ClassName``; registered under its ``name``, lower case as SGLang reads
    it) and each spec in ``CANOPY_SGLANG_POLICIES`` SGLang eviction policies: its strategy
    registry, the choices of ``--radix-eviction-policy``, the radix cache's hooks, and a
    radix-cache backend ``canopy`` (:func:`radix_cache_class`: SGLang's ``RadixCache``,
    evicting page-exactly; its default tree in 0.5.23, ``UnifiedRadixCache``, is not
    hooked). A name SGLang already uses for a strategy of its own is refused. Idempotent;
    returns the names registered."""
    from sglang.srt.arg_groups.choices import (
        RADIX_EVICTION_POLICY_CHOICES,
        add_radix_eviction_policy_choices,
    )
    from sglang.srt.mem_cache import registry, utils
    from sglang.srt.mem_cache.radix_cache import RadixCache

    factories = utils._EVICTION_POLICY_FACTORIES
    factories[POLICY_NAME] = CanopyEviction
    names = [POLICY_NAME]
    specs = [s.strip() for s in os.environ.get(ENV, "").split(",") if s.strip()]
    for policy in (*policies, *specs):
        chosen = strategy_policy(policy)
        name = chosen.name.lower()
        taken = factories.get(name)
        ours = taken is CanopyEviction or (isinstance(taken, functools.partial)
                                           and taken.func is CanopyEviction)
        if taken is not None and not ours:
            raise ValueError(f"policy name {name!r} is taken by SGLang's strategy "
                             f"{getattr(taken, '__name__', taken)!r}; give "
                             f"{type(chosen).__name__} another name")
        factories[name] = functools.partial(CanopyEviction, chosen)
        names.append(name)
    names = list(dict.fromkeys(names))
    add_radix_eviction_policy_choices([n for n in names
                                       if n not in RADIX_EVICTION_POLICY_CHOICES])
    if registry.get_radix_cache_factory(POLICY_NAME) is None:
        registry.register_radix_cache_backend(
            POLICY_NAME, lambda ctx: radix_cache_class()(ctx.params))
    install(RadixCache)
    return names
