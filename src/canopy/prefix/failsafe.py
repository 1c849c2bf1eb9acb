"""A policy's failure never takes its engine down (paper Section 4, "Serving systems").

An engine's scheduler calls the eviction policy on its hot path: vLLM's block pool, SGLang's
radix cache and the llama.cpp prompt cache. An exception there (a user's key that raises, a
bug of Canopy's own after days of serving) would end the scheduler and every request in
flight. The hosts wrap the policy once:

* :class:`FailSafePolicy` around an :class:`~canopy.prefix.stream.OnlinePolicy` (vLLM,
  SGLang): every call is guarded; on the first exception, or once the policy's tables hold
  more than ``max_nodes`` nodes, the policy is dropped for the rest of the run and the
  wrapper answers as the engine's own order would: every priority equal (ties go by the
  engine's release order: vLLM's free-queue LRU) and ``FailSafePolicy.failed`` set (a
  host with an order of its own, SGLang's ``last_access_time``, reads it);
* :class:`FailSafeCache` around a :class:`~canopy.prefix.stream.StreamingCache` (llama.cpp,
  whose cache serves requests itself): on failure an LRU streaming cache of the same capacity
  takes over, empty.

Either logs the failure once, naming the policy (logger ``canopy.prefix.failsafe``, the
exception attached), and counts it: :attr:`fallbacks` on the wrapper and, per policy name, in
the process (:func:`fallbacks`), which the hosts report; a host in another process (vLLM's
engine core) appends each fallback, one JSON object a line, to the file that
``CANOPY_FALLBACK_LOG`` names.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any

import numpy as np

from canopy.prefix.stream import OnlinePolicy, StreamingCache
from canopy.prefix.traces import MAX_NODES
from canopy.validation import check_count

__all__ = ["DEFAULT_MAX_NODES", "FALLBACK_LOG_ENV", "FailSafeCache", "FailSafePolicy",
           "PolicyFailure", "fallbacks"]

DEFAULT_MAX_NODES = MAX_NODES
"""Nodes a policy's tables may hold unless the host configures another limit (the most
distinct blocks a trace may have)."""

FALLBACK_LOG_ENV = "CANOPY_FALLBACK_LOG"
"""A file each fallback is appended to (one JSON object a line), when set."""

logger = logging.getLogger(__name__)

_FALLBACKS: Counter[str] = Counter()


def fallbacks() -> dict[str, int]:
    """Fallbacks in this process so far, by policy name."""
    return dict(_FALLBACKS)


class PolicyFailure(RuntimeError):
    """Why a policy was dropped: the policy's tables outgrew their node limit (an exception
    the policy raised is reported as itself)."""


class _Guard:
    """The failure state both wrappers share: fail once, log once, count."""

    def __init__(self, name: str, max_nodes: int) -> None:
        self.name = name
        self.max_nodes = check_count(max_nodes, "max_nodes")
        self.failed = False
        self.fallbacks = 0
        self.reason: str | None = None

    def fail(self, error: BaseException) -> None:
        """Drop the policy for the rest of the run because of ``error`` (the first failure
        only: logged and counted once); a host calls it when the policy's answers cannot be
        served."""
        if self.failed:
            return
        self.failed = True
        self.fallbacks += 1
        self.reason = f"{type(error).__name__}: {error}"
        _FALLBACKS[self.name] += 1
        logger.error("eviction policy %r failed (%s); the engine's own order from now on",
                     self.name, self.reason, exc_info=error)
        path = os.environ.get(FALLBACK_LOG_ENV)
        if path:
            try:
                with open(path, "a", encoding="utf-8") as log:
                    log.write(json.dumps(self.counts()) + "\n")
            except OSError:
                logger.exception("cannot append to %s=%s", FALLBACK_LOG_ENV, path)

    def _check_size(self, nodes: int) -> None:
        if nodes > self.max_nodes:
            raise PolicyFailure(f"its tables hold {nodes:,} nodes, above the limit of "
                                f"{self.max_nodes:,}")

    def _call(self, default: Any, method: Callable[..., Any], *args: Any) -> Any:
        """``method(*args)``, or ``default`` once the policy failed (now or before)."""
        if self.failed:
            return default
        try:
            return method(*args)
        except Exception as error:  # any failure of the policy, whatever its type
            self.fail(error)
            return default

    def counts(self) -> dict[str, Any]:
        """What the host reports: the policy, whether it failed, why, and the fallbacks."""
        return {"policy": self.name, "failed": self.failed, "reason": self.reason,
                "fallbacks": self.fallbacks}


class FailSafePolicy(_Guard):
    """``policy`` (an :class:`~canopy.prefix.stream.OnlinePolicy`) with every call guarded
    (see the module docstring): the interface of
    :class:`~canopy.prefix.evictable.EvictionOrder` and the online policy's
    :meth:`observe` and :meth:`priority`. After a failure :attr:`epoch` moves once (a host
    re-keys its blocks, all equal now) and stays; nothing reaches the policy again."""

    def __init__(self, policy: OnlinePolicy, *, max_nodes: int = DEFAULT_MAX_NODES) -> None:
        if not isinstance(policy, OnlinePolicy):
            raise TypeError(f"policy must be an OnlinePolicy, got {type(policy).__name__}")
        super().__init__(policy.policy.name, max_nodes)
        self.policy = policy
        self.hand = policy.hand
        self._epoch = 0
        # once failed, the free blocks the policy held, in release order (the engine's own,
        # LRU), handed out in that order so that no free block is lost with the policy; while
        # it serves, the policy keeps them (its evictable set stamps each release)
        self._held: dict[int, None] | None = None

    def fail(self, error: BaseException) -> None:
        """``_Guard.fail``; the free blocks the policy held are taken over, in release
        order (none should its tables not be readable)."""
        failed = self.failed
        super().fail(error)
        if not failed:
            try:
                held = self.policy.free_blocks().tolist()
            except Exception:  # any failure of the policy: its tables are not to be trusted
                held = []
            self._held = dict.fromkeys(held)

    @property
    def epoch(self) -> int:
        """The policy's epoch; one more, for good, after a failure."""
        self._epoch = self._call(self._epoch, lambda: self.policy.epoch)
        return self._epoch + int(self.failed)

    @property
    def n_nodes(self) -> int:
        """Nodes of the policy's tables (0 once dropped)."""
        return 0 if self.failed else self.policy.n_nodes

    def observe(self, keys: Sequence[Hashable] | np.ndarray, *, start: int = 0) -> None:
        """:meth:`OnlinePolicy.observe`, guarded; fails the policy past ``max_nodes``."""
        if self.failed:
            return
        try:
            self.policy.observe(keys, start=start)
            self._check_size(self.policy.n_nodes)
        except Exception as error:  # any failure of the policy, whatever its type
            self.fail(error)

    def release(self, blocks: Sequence[int] | np.ndarray,
                keys: Sequence[Hashable] | np.ndarray) -> np.ndarray:
        """:meth:`OnlinePolicy.release`, guarded; once the policy failed every block is known
        (kept here, in release order)."""
        if not self.failed:
            try:
                return self.policy.release(blocks, keys)
            except Exception as error:  # any failure of the policy, whatever its type
                self.fail(error)
        held = self._held
        assert held is not None, "a failed policy's blocks are taken over when it fails"
        ids = np.asarray(blocks, dtype=np.int64).tolist()
        for block in ids:
            held.pop(block, None)
            held[block] = None
        return np.ones(len(ids), dtype=bool)

    def acquire(self, blocks: Sequence[int] | np.ndarray) -> None:
        """:meth:`OnlinePolicy.acquire`, guarded."""
        self._call(None, self.policy.acquire, blocks)
        self._forget(blocks)

    def drop(self, blocks: Sequence[int]) -> None:
        """:meth:`OnlinePolicy.drop`, guarded."""
        self._call(None, self.policy.drop, blocks)
        self._forget(blocks)

    def pop_victims(self, n: int) -> np.ndarray:
        """:meth:`OnlinePolicy.pop_victims`, guarded; once the policy failed, the blocks it
        held in release order."""
        victims = self._call(None, self.policy.pop_victims, n)
        if self._held is not None:
            if victims is None:
                victims = np.fromiter(itertools.islice(self._held, n), dtype=np.int64)
            self._forget(victims)
        return victims

    def _forget(self, blocks: Sequence[int] | np.ndarray) -> None:
        """Once the policy failed, ``blocks`` leave the release order."""
        if self._held is not None:
            for block in np.asarray(blocks, dtype=np.int64).tolist():
                self._held.pop(block, None)

    def evicted(self, key: Hashable) -> None:
        """:meth:`OnlinePolicy.evicted`, guarded."""
        self._call(None, self.policy.evicted, key)

    def priorities(self, keys: Sequence[Hashable]) -> np.ndarray:
        """:meth:`OnlinePolicy.priorities`, guarded; all equal once the policy failed."""
        ranked = self._call(None, self.policy.priorities, keys)
        return np.zeros(len(keys)) if ranked is None else ranked

    def priority(self, key: Hashable) -> float:
        """:meth:`OnlinePolicy.priority`, guarded."""
        return float(self.priorities([key])[0])

    def visited(self, key: Hashable) -> bool:
        """``sieve``'s bit, guarded; never set once the policy failed."""
        return self._call(False, self.policy.visited, key)

    def clear_visited(self, key: Hashable) -> None:
        """``sieve``: the hand passes ``key``, guarded."""
        self._call(None, self.policy.clear_visited, key)


class FailSafeCache(_Guard):
    """``cache`` (a :class:`~canopy.prefix.stream.StreamingCache`) with :meth:`request` and
    :meth:`cached_prefix` guarded (see the module docstring); once it fails, an LRU
    streaming cache of the same capacity serves, starting empty."""

    def __init__(self, cache: StreamingCache, *, max_nodes: int = DEFAULT_MAX_NODES) -> None:
        if not isinstance(cache, StreamingCache):
            raise TypeError(f"cache must be a StreamingCache, got {type(cache).__name__}")
        super().__init__(cache.policy.name, max_nodes)
        self.cache = cache
        self._fresh: StreamingCache | None = None

    @property
    def policy(self) -> Any:
        """The serving cache's policy (LRU after a failure)."""
        return self.cache.policy

    @property
    def size(self) -> int:
        """Blocks cached now."""
        return self.cache.size

    @property
    def n_nodes(self) -> int:
        """Nodes of the serving cache's tables."""
        return self.cache.n_nodes

    def request(self, keys: Iterable[Hashable]) -> int:
        """:meth:`StreamingCache.request`; from a failure on (this request included), the
        LRU cache serves."""
        keys = list(keys)

        def request() -> int:
            reused = self.cache.request(keys)
            self._check_size(self.cache.n_nodes)
            return reused

        reused = self._call(None, request)
        return self._lru().request(keys) if reused is None else reused

    def cached_prefix(self, keys: Iterable[Hashable]) -> int:
        """:meth:`StreamingCache.cached_prefix`, guarded."""
        keys = list(keys)
        cached = self._call(None, self.cache.cached_prefix, keys)
        return self._lru().cached_prefix(keys) if cached is None else cached

    def _lru(self) -> StreamingCache:
        """The LRU cache that serves once the policy failed (made then, empty)."""
        if self._fresh is None:
            self._fresh = self.cache = StreamingCache(
                "lru", self.cache.capacity, history_floor=self.cache.history_floor)
        return self.cache
