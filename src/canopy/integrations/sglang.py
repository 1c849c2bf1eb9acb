"""Canopy's eviction as an SGLang radix-cache eviction strategy, learnt online (the ``sglang``
extra; paper Section 4, "Serving systems").

SGLang evicts whole unlocked leaf nodes of its radix tree, lowest
``eviction_strategy.get_priority(node)`` first, and picks the strategy by the name given to
``--radix-eviction-policy``. One call, :func:`register` (run by SGLang itself in every
process through the ``sglang.srt.plugins`` entry point when Canopy is installed beside it),
adds ``canopy`` to SGLang's strategy registry and to the choices of
``--radix-eviction-policy``, and a radix-cache backend ``canopy``
(:func:`radix_cache_class`)::

    sglang serve --model-path ... --radix-cache-backend canopy --radix-eviction-policy canopy

The strategy learns from what SGLang's own radix cache does, with no trace: every
``insert`` (SGLang inserts a request's tokens when a prefill chunk ends and when the request
finishes, and counts each request once past ``inserted_len``, as its ``hit_count`` does) is
observed as the request's chain of page keys (a page's key hashes its tokens with its
parent's key, so it names the whole prefix) by :class:`~canopy.prefix.stream.OnlinePolicy`
(the replay's kernels: decayed cell counts with the parental prior, shadow caches that pick
how much to remember). Memory is bounded by the policy's forgetting; a node caches its own
page keys. The policy chooses the victims in one of two ways:

* in Canopy's backend (:class:`PageExact`), the cache's pages are the policy's evictable
  set, as vLLM's blocks are (:class:`~canopy.prefix.evictable.EvictableBlocks`), and SGLang
  evicts exactly the policy's victims, page by page: the replay's victims;
* in SGLang's plain ``RadixCache`` built with ``eviction_policy="canopy"`` (after
  ``register()``), SGLang's own eviction ranks its leaf nodes by ``get_priority(node)``, the
  priority of the node's first page (SGLang evicts a node whole, so the node is worth its
  most valuable page, and priorities never rise down a chain), and every leaf SGLang deletes
  is reported evicted (the hooks of :func:`install`).

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
cache evicts in SGLang's own LRU order (``last_access_time``) for the rest of the run
(:class:`~canopy.prefix.failsafe.FailSafePolicy`; ``strategy.policy.counts()``).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from canopy.prefix.evictable import EvictableBlocks
from canopy.prefix.failsafe import DEFAULT_MAX_NODES, FailSafePolicy, PolicyFailure
from canopy.prefix.policies import EvictionPolicy, resolve_policy
from canopy.prefix.stream import OnlinePolicy
from canopy.validation import check_count, check_open_unit

__all__ = ["ENV", "POLICY_NAME", "CanopyEviction", "PageExact", "install", "radix_cache_class",
           "register", "strategy_policy"]

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

    def observe(self, cache: Any, key: Any, inserted_len: int) -> list[int]:
        """One insert of ``key`` (a ``RadixKey``) into ``cache``; tokens before
        ``inserted_len`` were inserted, and observed, with the same request before.
        Returns the key's page keys."""
        policy = self.bind(cache)
        keys = _page_keys(_tokens(key), self.page_size, _root(key))
        start = min(len(keys), max(0, inserted_len) // self.page_size)
        if keys and start < len(keys):
            policy.observe(keys, start=start)
        return keys

    def evicted(self, node: Any) -> None:
        """SGLang deleted leaf ``node``: each of its pages leaves the cache."""
        if self.policy is not None:
            for key in _node_keys(node, self.page_size):
                self.policy.evicted(key)

    def get_priority(self, node: Any) -> float:
        """The priority of the node's first page, its most valuable (lower evicts first), as
        SGLang's plain ``RadixCache`` ranks nodes: evicting the node loses every page of it.
        Ranked by its last page instead, a node holding a hot prefix and a cold tail went
        first (conversation trace at 1,024 blocks: 1.51 blocks reused a request against
        1.85). Once the policy failed, ``last_access_time`` (SGLang's LRU), in either cache."""
        if self.policy is None:
            raise RuntimeError(f"the {POLICY_NAME} eviction policy learns from the inserts of "
                               "SGLang's RadixCache; this cache evicted before showing it any "
                               f"(serve with --radix-cache-backend {POLICY_NAME})")
        keys = _node_keys(node, self.page_size) if not self.policy.failed else ()
        priority = self.policy.priority(keys[0]) if keys else -math.inf
        # a policy failing in this very call ranks this node as the rest: by SGLang's LRU
        return node.last_access_time if self.policy.failed else priority


def _tokens(key: Any) -> Any:
    """A key's tokens (a ``RadixKey`` may hold more than its length)."""
    return key.token_ids[:len(key)] if hasattr(key, "token_ids") else key


def _root(key: Any) -> int:
    """The chain's seed: SGLang keeps keys of different ``extra_key`` and ``cache_salt``
    namespaces apart (a digest, not ``hash``, so that every tensor-parallel rank's process
    keys pages alike)."""
    extra, salt = getattr(key, "extra_key", None), getattr(key, "cache_salt", None)
    space = repr(extra if salt is None else (extra, salt)).encode()
    return int.from_bytes(hashlib.blake2b(space, digest_size=8).digest(), "little",
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
    """The strategy the hooks feed: a :class:`CanopyEviction`, unless the cache evicts with
    :class:`PageExact` (which feeds its policy itself)."""
    strategy = getattr(cache, "eviction_strategy", None)
    if isinstance(strategy, CanopyEviction) and not isinstance(cache, PageExact):
        return strategy
    return None


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
    inserts and deleted leaves to a :class:`CanopyEviction` it evicts with; other strategies,
    and caches that evict with :class:`PageExact`, are untouched."""
    _wrap(cache_class, "insert", _on_insert)
    _wrap(cache_class, "_delete_leaf", _on_delete)


if TYPE_CHECKING:
    class _RadixCacheInterface:
        """What :class:`PageExact` needs of the class it is mixed into: SGLang's
        ``RadixCache``."""

        disable: bool
        page_size: int
        root_node: Any
        evictable_leaves: Any
        eviction_strategy: Any

        def insert(self, params: Any) -> Any: ...
        def inc_lock_ref(self, node: Any) -> Any: ...
        def dec_lock_ref(self, node: Any, *args: Any, **kwargs: Any) -> Any: ...
        def reset(self) -> None: ...
        def evict(self, params: Any) -> Any: ...
        def match_prefix(self, params: Any) -> Any: ...
else:
    _RadixCacheInterface = object


class PageExact(_RadixCacheInterface):
    """Canopy's radix-cache backend, mixed in before a class with SGLang's ``RadixCache``
    interface: when a :class:`CanopyEviction` strategy evicts, the victims are its policy's,
    page by page, and SGLang deletes exactly them.

    The cache's pages (their KV page indices: the engine's blocks) are the evictable set of
    the strategy's online policy (:class:`~canopy.prefix.evictable.EvictableBlocks`, the
    protocol vLLM's pool runs too): a page joins it when ``insert`` makes its node, is pinned
    while a lock holds its node and released when the last lock goes (``inc_lock_ref``,
    ``dec_lock_ref``: deepest first, as an engine frees a request's blocks), and leaves it
    when ``reset`` empties the tree. :meth:`evict` takes as many pages as are needed from
    :meth:`~canopy.prefix.evictable.EvictableBlocks.pop_victims` (the policy's order among
    the free leaf pages: the replay's victims), each the last page of an unlocked leaf node
    or of its parent once every page under the parent went. SGLang evicts whole nodes; this
    cache has SGLang cut a node whose tail alone goes, then evict exactly the chosen nodes,
    both through public calls (``_canopy_split``, ``_canopy_delete``): its own
    ``evict`` frees the pool's pages, updates its sizes and leaves, and reports its KV events
    and metrics. No private SGLang method is called.

    Without a Canopy strategy (``--radix-eviction-policy lru`` with this backend), once the
    policy failed (:class:`~canopy.prefix.failsafe.FailSafePolicy`), or should a victim not
    be an unlocked leaf's last page (the set and the tree disagree: the policy is then
    failed, logged once and counted), the cache evicts as SGLang's ``RadixCache`` does, in
    its strategy's order: after a failure ``last_access_time``, SGLang's LRU."""

    match_params: Any = None
    """The class of ``match_prefix``'s parameters (SGLang's ``MatchPrefixParams``)."""

    def _canopy_set(self) -> EvictableBlocks | None:
        """The evictable set when Canopy's policy evicts here (made with the policy), else
        ``None``."""
        strategy = self.eviction_strategy
        if self.disable or not isinstance(strategy, CanopyEviction):
            return None
        policy = strategy.bind(self)
        if policy.failed:
            return None
        blocks = getattr(self, "_canopy_blocks", None)
        if blocks is None or blocks.policy is not policy:
            blocks = self._canopy_blocks = EvictableBlocks(policy)
        return blocks

    def insert(self, params: Any) -> Any:
        """SGLang's ``insert``, observed by the policy first; the pages of the node it makes
        join the evictable set, free."""
        blocks = self._canopy_set()
        if blocks is None:
            return super().insert(params)
        strategy = self.eviction_strategy
        keys = strategy.observe(self, params.key, int(getattr(params, "inserted_len", 0) or 0))
        result = super().insert(params)
        node, page = result.last_device_node, self.page_size
        if strategy.policy.failed or result.prefix_len >= len(params.key) // page * page:
            return result  # no node made
        pages, start = _pages(node, page), result.prefix_len // page
        if len(keys) - start == len(pages):  # the node's keys, known already
            setattr(node, _KEYS, (len(node.key), keys[start:]))
        blocks.release_all(pages[::-1], _node_keys(node, page)[::-1])
        return result

    def inc_lock_ref(self, node: Any) -> Any:
        """SGLang's ``inc_lock_ref``; the pages of the nodes it locks first are pinned."""
        blocks = self._canopy_set()
        if blocks is None:
            return super().inc_lock_ref(node)
        locked = self._canopy_path(node, 0)
        result = super().inc_lock_ref(node)
        for n in locked:
            for page in _pages(n, self.page_size):
                blocks.acquire(page)
        return result

    def dec_lock_ref(self, node: Any, *args: Any, **kwargs: Any) -> Any:
        """SGLang's ``dec_lock_ref``; the pages of the nodes it unlocks are released, deepest
        first."""
        blocks = self._canopy_set()
        if blocks is None:
            return super().dec_lock_ref(node, *args, **kwargs)
        unlocked = self._canopy_path(node, 1)
        result = super().dec_lock_ref(node, *args, **kwargs)
        for n in unlocked:
            pages = _pages(n, self.page_size)
            blocks.release_all(pages[::-1], _node_keys(n, self.page_size)[::-1])
        return result

    def _canopy_path(self, node: Any, lock_ref: int) -> list:
        """The nodes from ``node`` up to the root (excluded) whose lock count is
        ``lock_ref``."""
        out = []
        while node is not None and node is not self.root_node:
            if node.lock_ref == lock_ref:
                out.append(node)
            node = node.parent
        return out

    def reset(self) -> None:
        """SGLang's ``reset``: every page leaves the evictable set."""
        blocks = getattr(self, "_canopy_blocks", None)
        if blocks is not None and not self.eviction_strategy.policy.failed:
            stack, pages = list(self.root_node.children.values()), []
            while stack:
                node = stack.pop()
                pages += _pages(node, self.page_size)
                stack.extend(node.children.values())
            blocks.drop_all(pages)
        super().reset()

    def evict(self, params: Any) -> Any:
        """Free ``params.num_tokens`` tokens (rounded up to pages): the policy's victims, the
        rest in SGLang's own order should the policy fail on the way."""
        blocks = self._canopy_set()
        if blocks is None:
            return super().evict(params)
        policy = self.eviction_strategy.policy
        result = self._canopy_delete(self._canopy_victims(blocks, params.num_tokens), params)
        rest = params.num_tokens - result.num_tokens_evicted
        if rest > 0 and policy.failed:
            more = super().evict(dataclasses.replace(params, num_tokens=rest))
            result = dataclasses.replace(result, num_tokens_evicted=(
                result.num_tokens_evicted + more.num_tokens_evicted))
        return result

    def _canopy_victims(self, blocks: EvictableBlocks, num_tokens: int) -> list:
        """The nodes to delete for ``num_tokens`` tokens of the policy's victims, a node of
        which only a tail goes cut first; a victim that is no unlocked leaf's last page
        fails the policy."""
        page = self.page_size
        want = -(-num_tokens // page)
        tails = {_page(leaf, -1, page): leaf for leaf in self.evictable_leaves}
        cut: dict[Any, int] = {}  # node -> pages taken from its end
        policy = self.eviction_strategy.policy
        while want > 0 and not policy.failed:
            victims = blocks.pop_victims(want)
            if not victims or policy.failed:
                break
            for victim in victims:
                node = tails.pop(victim, None)
                if node is None:
                    policy.fail(PolicyFailure(
                        f"its victim, page {victim}, is not the last page of an unlocked "
                        "leaf of SGLang's radix tree"))
                    break
                want -= 1
                taken = cut[node] = cut.get(node, 0) + 1
                left = len(node.value) // page - taken
                parent = node.parent
                if left:
                    tails[_page(node, left - 1, page)] = node
                elif parent is not self.root_node and parent.lock_ref == 0 and all(
                        cut.get(c, 0) * page == len(c.value) for c in parent.children.values()):
                    tails[_page(parent, -1, page)] = parent
        for node, taken in cut.items():
            if taken * page < len(node.value):
                self._canopy_split(node, len(node.key) - taken * page)
        return list(cut)

    def _canopy_split(self, node: Any, keep: int) -> None:
        """Cut ``node`` after its first ``keep`` tokens, ``node`` keeping the rest: SGLang's
        ``match_prefix`` splits a node where a lookup ends inside it (documented so), so the
        lookup of the path to ``node`` up to there cuts it (and stamps the path's access
        times, as any lookup does)."""
        parts = []
        n = node
        while n is not self.root_node:
            parts.append(n.key)
            n = n.parent
        parts.reverse()
        first = parts[0]
        bigram = bool(first.is_bigram)  # a bigram key's tokens overlap its neighbour's by one
        tokens = first.token_ids[:0]
        for i, part in enumerate(parts):
            raw = part.token_ids[:len(part) + bigram]
            tokens += raw[1:] if bigram and i else raw
        length = sum(map(len, parts)) - len(node.key) + keep
        key = type(first)(tokens, first.extra_key, is_bigram=bigram,
                          cache_salt=first.cache_salt)[:length]
        self.match_prefix(self.match_params(key=key))

    def _canopy_delete(self, nodes: list, params: Any) -> Any:
        """Evict exactly ``nodes`` (each a leaf, or one once the nodes under it went) with
        SGLang's own ``evict``, its strategy ranking them first for the call."""
        strategy = self.eviction_strategy
        self.eviction_strategy = _Chosen(nodes)
        try:
            return super().evict(dataclasses.replace(
                params, num_tokens=sum(len(node.value) for node in nodes)))
        finally:
            self.eviction_strategy = strategy


class _Chosen:
    """An eviction strategy ranking ``nodes`` before every other node (SGLang pops the
    lowest ``get_priority`` first)."""

    def __init__(self, nodes: list) -> None:
        self.nodes = set(nodes)

    def get_priority(self, node: Any) -> int:
        return 0 if node in self.nodes else 1


def _pages(node: Any, page_size: int) -> list[int]:
    """The KV pages (engine blocks) of ``node``'s tokens, in order."""
    values = node.value
    ids = values.tolist() if hasattr(values, "tolist") else list(values)
    return [int(v) // page_size for v in ids[::page_size]]


def _page(node: Any, i: int, page_size: int) -> int:
    """The KV page of ``node``'s ``i``-th page (from its end when negative)."""
    return int(node.value[(i % (len(node.value) // page_size)) * page_size]) // page_size


@functools.cache
def radix_cache_class() -> type:
    """SGLang's ``RadixCache`` evicting page-exactly in the order of Canopy's policy
    (:class:`PageExact`): the ``canopy`` radix-cache backend (needs SGLang)."""
    from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
    from sglang.srt.mem_cache.radix_cache import RadixCache

    class CanopyRadixCache(PageExact, RadixCache):
        """SGLang's radix cache, evicting the victims of Canopy's policy page-exactly."""

        match_params = MatchPrefixParams

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
        if name == POLICY_NAME:  # Canopy's own keeps the bare factory, which takes `policy`
            continue
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
