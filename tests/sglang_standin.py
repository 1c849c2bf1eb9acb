"""A stand-in for SGLang's radix cache (``sglang.srt.mem_cache.radix_cache``, v0.5.23) with
its interface and the behaviour the eviction results depend on, for machines where SGLang
cannot be installed (it needs its CUDA stack):

* a compressed radix tree: a node holds a run of tokens; a match or an insert that ends
  inside a node splits it (the new upper node inherits the hit count and locks);
* ``match_prefix`` and ``insert`` stamp every node on the path with a new access time
  (SGLang: ``time.monotonic()``; here a counter, one tick a call); ``insert`` adds one hit
  to each node on the path that ends past ``inserted_len`` (what this request inserted
  before, so a request counts once) and to the node it creates;
* ``evict(num_tokens)``: a heap of the unlocked leaf nodes by the strategy's
  ``get_priority``; pop, delete the *whole node* (all its tokens), push the parent when it
  is left childless and unlocked, until ``num_tokens`` are freed;
* ``inc_lock_ref`` / ``dec_lock_ref`` lock the path to the root; sizes count tokens;
* what :class:`canopy.integrations.sglang.PageExact` reads (``evictable_leaves``,
  ``root_node``, a node's ``value`` and ``lock_ref``, ``insert``'s result, a key's
  namespace); :class:`ExactRadixCache` mixes it in, as Canopy's radix-cache backend does.

Strategies: LRU ``last_access_time``, LFU ``(hit_count, last_access_time)``, as in SGLang's
``evict_policy.py``, looked up by name in :data:`STRATEGIES` (SGLang's registry) with the
keyword arguments of the policy's configuration. Only what
:func:`canopy.apps.cache.sglang_replay.drive` calls is provided, and the two methods
:func:`canopy.integrations.sglang.install` hooks (``insert``, ``_delete_leaf``).
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from canopy.apps.cache.sglang_replay import KVPool
from canopy.integrations.sglang import PageExact


class RadixKey:
    """Token ids in a namespace (``extra_key``, ``cache_salt``), as a node's key too."""

    def __init__(self, token_ids: Any = (), extra_key: Any = None, *, is_bigram: bool = False,
                 cache_salt: Any = None) -> None:
        self.token_ids = list(token_ids)
        self.extra_key, self.is_bigram, self.cache_salt = extra_key, is_bigram, cache_salt

    def __len__(self) -> int:
        return len(self.token_ids)

    def __iter__(self) -> Any:
        return iter(self.token_ids)

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, int):
            return self.token_ids[index]  # SGLang: a key of one token
        return RadixKey(self.token_ids[index], self.extra_key, is_bigram=self.is_bigram,
                        cache_salt=self.cache_salt)


@dataclass
class MatchPrefixParams:
    key: RadixKey


@dataclass
class InsertParams:
    key: RadixKey
    value: Any = None
    inserted_len: int = 0


@dataclass
class EvictParams:
    num_tokens: int = 0


@dataclass
class InsertResult:
    prefix_len: int
    last_device_node: Node


@dataclass
class EvictResult:
    num_tokens_evicted: int = 0


@dataclass
class MatchResult:
    device_prefix_len: int
    last_device_node: Node


@dataclass(eq=False)
class Node:
    key: RadixKey = field(default_factory=RadixKey)
    parent: Node | None = None
    children: dict = field(default_factory=dict)
    lock_ref: int = 0
    hit_count: int = 0
    last_access_time: int = 0
    value: list = field(default_factory=list)  # the KV indices of the key's tokens


class LRU:
    def get_priority(self, node: Node) -> int:
        return node.last_access_time


class LFU:
    def get_priority(self, node: Node) -> tuple[int, int]:
        return (node.hit_count, node.last_access_time)


STRATEGIES: dict[str, Any] = {"lru": LRU, "lfu": LFU}
"""SGLang's registry (``mem_cache/utils.py``): name -> factory of keyword arguments."""


class RadixCache:
    page_size = 1
    disable = False

    def __init__(self, eviction_policy: str = "lru", config: dict | None = None,
                 size: int | None = None) -> None:
        self.token_to_kv_pool_allocator = KVPool(size)
        self.eviction_strategy = STRATEGIES[eviction_policy](**(config or {}))
        self.root = Node(lock_ref=1)
        self._clock = itertools.count(1)
        self._evictable = 0
        self._protected = 0

    def evictable_size(self) -> int:
        return self._evictable

    def protected_size(self) -> int:
        return self._protected

    @property
    def root_node(self) -> Node:
        return self.root

    def path_device_indices(self, node: Node) -> list[int]:
        parts = []
        while node is not self.root:
            parts.append(node.value)
            node = node.parent
        return [i for part in reversed(parts) for i in part]

    @property
    def evictable_leaves(self) -> list[Node]:
        return [n for n in self._nodes() if self._evictable_leaf(n)]

    def _split(self, node: Node, at: int) -> Node:
        upper = Node(key=node.key[:at], parent=node.parent, lock_ref=node.lock_ref,
                     hit_count=node.hit_count, last_access_time=node.last_access_time,
                     value=node.value[:at])
        upper.parent.children[upper.key[0]] = upper
        node.key, node.value = node.key[at:], node.value[at:]
        node.parent = upper
        upper.children[node.key[0]] = node
        return upper

    def _walk(self, tokens: list, now: int, counted_from: float) -> tuple[int, Node]:
        node, done = self.root, 0
        node.last_access_time = now
        while done < len(tokens) and tokens[done] in node.children:
            child = node.children[tokens[done]]
            child.last_access_time = now
            common = 0
            for a, b in zip(child.key, tokens[done:], strict=False):
                if a != b:
                    break
                common += 1
            if common < len(child.key):
                child = self._split(child, common)
            if done + common > counted_from:
                child.hit_count += 1
            node, done = child, done + common
            if common < len(child.key):
                break
        return done, node

    def match_prefix(self, params: MatchPrefixParams) -> MatchResult:
        done, node = self._walk(params.key.token_ids, next(self._clock), float("inf"))
        return MatchResult(done, node)

    def insert(self, params: InsertParams) -> InsertResult:
        tokens = params.key.token_ids
        now = next(self._clock)
        done, node = self._walk(tokens, now, params.inserted_len)
        if done < len(tokens):
            value = tokens if params.value is None else params.value  # SGLang: tokens
            leaf = Node(key=params.key[done:], parent=node, last_access_time=now,
                        hit_count=int(len(tokens) > params.inserted_len),
                        value=list(value[done:len(tokens)]))
            node.children[tokens[done]] = leaf
            self._evictable += len(leaf.key)
            node = leaf
        return InsertResult(done, node)

    def _evictable_leaf(self, node: Node) -> bool:
        return node is not self.root and node.lock_ref == 0 and not node.children

    def evict(self, params: EvictParams) -> EvictResult:
        leaves = [n for n in self._nodes() if self._evictable_leaf(n)]
        tie = itertools.count()
        heap = [(self.eviction_strategy.get_priority(n), n.last_access_time, next(tie), n)
                for n in leaves]
        heapq.heapify(heap)
        freed = 0
        while freed < params.num_tokens and heap:
            *_, node = heapq.heappop(heap)
            self.token_to_kv_pool_allocator.free_segment(node.value, start_pos=0)
            self._delete_leaf(node)
            freed += len(node.key)
            if self._evictable_leaf(node.parent):
                parent = node.parent
                heapq.heappush(heap, (self.eviction_strategy.get_priority(parent),
                                      parent.last_access_time, next(tie), parent))
        return EvictResult(freed)

    def _delete_leaf(self, node: Node) -> None:
        del node.parent.children[node.key[0]]
        self._evictable -= len(node.key)

    def _nodes(self) -> list[Node]:
        out, stack = [], [self.root]
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out

    def inc_lock_ref(self, node: Node) -> None:
        while node is not self.root:
            if node.lock_ref == 0:
                self._evictable -= len(node.key)
                self._protected += len(node.key)
            node.lock_ref += 1
            node = node.parent

    def dec_lock_ref(self, node: Node) -> None:
        while node is not self.root:
            if node.lock_ref == 1:
                self._evictable += len(node.key)
                self._protected -= len(node.key)
            node.lock_ref -= 1
            node = node.parent


class ExactRadixCache(PageExact, RadixCache):
    """The stand-in evicting page-exactly, as Canopy's backend does."""

    match_params = MatchPrefixParams


def simulated(policy: str = "lru", config: dict | None = None, *,
              exact: bool = False, size: int | None = None) -> RadixCache:
    return (ExactRadixCache if exact else RadixCache)(policy, config, size)


api = SimpleNamespace(RadixKey=RadixKey, MatchPrefixParams=MatchPrefixParams,
                      InsertParams=InsertParams, EvictParams=EvictParams,
                      simulated=simulated)
