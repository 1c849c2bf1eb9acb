"""Eviction policies: small strategy objects swapped by name (cf. SGLang ``evict_policy.py``).

Each policy is immutable configuration; :meth:`kernel` returns the kernel code and parameter
vector that :class:`~canopy.apps.cache.radix.RadixCache` runs. All of them evict leaves only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from canopy.apps.cache import radix

__all__ = ["LFU", "LRU", "POLICIES", "SIEVE", "Canopy", "EvictionPolicy", "Optimal",
           "make_policy"]


class EvictionPolicy:
    """Base: a name, whether the policy reads the future, and its kernel configuration."""

    name: str = "policy"
    offline: bool = False

    def kernel(self, trace, capacity: int) -> tuple[int, np.ndarray]:  # pragma: no cover - abstract
        raise NotImplementedError


@dataclass(frozen=True)
class LRU(EvictionPolicy):
    """Least recently used, in vLLM's order: when a request finishes its blocks join the
    free queue tail first, and the queue front is evicted. Because a block's ancestors are
    always freed with it and after it, the front is always a leaf, and the order equals
    SGLang's (evict the least recently used leaf of the radix tree); the tests check both."""

    name: str = "lru"

    def kernel(self, trace, capacity: int) -> tuple[int, np.ndarray]:
        return radix.LRU, np.zeros(1)


@dataclass(frozen=True)
class LFU(EvictionPolicy):
    """Least frequently used leaf, ties by least recent use (SGLang's LFU strategy: priority
    ``(hit_count, last_access_time)``). The count restarts when a block is re-inserted."""

    name: str = "lfu"

    def kernel(self, trace, capacity: int) -> tuple[int, np.ndarray]:
        return radix.LFU, np.array([float(trace.n_requests + 1)])


@dataclass(frozen=True)
class SIEVE(EvictionPolicy):
    """SIEVE (Zhang et al., NSDI 2024) adapted to leaf-only eviction: a FIFO in insertion
    order, a visited bit set on reuse, and a hand moving from old to new that clears visited
    bits and evicts the first unvisited block it may evict (an unpinned leaf)."""

    name: str = "sieve"

    def kernel(self, trace, capacity: int) -> tuple[int, np.ndarray]:
        return radix.SIEVE, np.zeros(1)


@dataclass(frozen=True)
class Optimal(EvictionPolicy):
    """Offline reference (Belady): evict the leaf whose next use is furthest in the future,
    deepest first on ties. Next use is monotone along a path (a request using a block uses
    its ancestors), so this victim is also the furthest-used unpinned block overall."""

    name: str = "optimal"
    offline: bool = True

    def kernel(self, trace, capacity: int) -> tuple[int, np.ndarray]:
        return radix.OPTIMAL, np.array([float(trace.depth.max(initial=0) + 1)])


@dataclass(frozen=True)
class Canopy(EvictionPolicy):
    """Canopy's adaptive eviction (paper Section 4, "Serving systems"): every node of the
    prefix tree is a cell whose value is its expected future reuse, estimated online.

    * forgetting: a block's evidence is its discounted use count
      ``sum_i 2^{-(c - c_i) / (half_life * capacity)}``, where ``c`` counts blocks inserted so
      far; the half-life is measured in cache turnovers, so it scales with the capacity and
      the miss rate by itself (kept in the log domain: keys never need rescaling);
    * subtree aggregate statistics and optimism where evidence is thin: a block with no use of
      its own yet starts from its parent cell's share, ``prior * count(parent) /
      children(parent)``; the parent's count aggregates every request through its subtree, so a
      fresh block of a live conversation inherits that conversation's activity, while a fresh
      child of a block shared by thousands of prefixes inherits almost nothing;
    * the lowest discounted count among unpinned leaves is evicted. Nothing reads the future.
    """

    name: str = "canopy"
    half_life: float = 2.0
    prior: float = 1.0

    def __post_init__(self) -> None:
        for field in ("half_life", "prior"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                    math.isfinite(value) and value > 0):
                raise ValueError(f"{field} must be a finite number > 0, got {value!r}")

    def kernel(self, trace, capacity: int) -> tuple[int, np.ndarray]:
        return radix.CANOPY, np.array([math.log(2.0) / (self.half_life * capacity),
                                       float(self.prior)])


POLICIES: dict[str, type[EvictionPolicy]] = {
    "lru": LRU, "lfu": LFU, "sieve": SIEVE, "canopy": Canopy, "optimal": Optimal}
"""Policy classes by name."""


def make_policy(name: str, **config: float) -> EvictionPolicy:
    """A policy by name (``lru``, ``lfu``, ``sieve``, ``canopy``, ``optimal``)."""
    try:
        cls = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}") from None
    return cls(**config)
