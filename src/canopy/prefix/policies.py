"""Eviction policies: small strategy objects swapped by name (cf. SGLang ``evict_policy.py``).

Each policy is immutable configuration; ``kernel`` returns the kernel code and parameter
vector that :class:`~canopy.prefix.RadixCache` runs. All of them evict leaves only.
"""

from __future__ import annotations

import importlib
import math
import operator
from dataclasses import dataclass
from typing import Any

import numpy as np

from canopy.prefix import kernels
from canopy.validation import check_count, check_nonnegative, check_positive

__all__ = ["LFU", "LRU", "POLICIES", "SIEVE", "Arms", "Canopy", "EvictionPolicy", "Optimal",
           "PriorityPolicy", "make_policy",
           "policy_class", "resolve_policy"]


class EvictionPolicy:
    """Base: a name, whether the policy reads the future, whether it evicts by a hand over
    insertion order (``hand``: SIEVE's visited bits, not a priority order) and its kernel
    configuration."""

    name: str = "policy"
    offline: bool = False
    hand: bool = False

    def kernel(self, trace, capacity: int) -> tuple[int, np.ndarray]:  # pragma: no cover - abstract
        raise NotImplementedError


class PriorityPolicy(EvictionPolicy):
    """A policy that evicts the unpinned leaf with the lowest key (SGLang's strategies' shape:
    a class with a priority function). Subclass it with a ``name`` and ``key``, a numba
    ``@njit`` function ``key(v, ni, depth, params)`` of a node ``v``: its cache fields
    ``ni[v, kernels.HITS]`` (uses since insertion) and ``ni[v, kernels.LAST]`` (the last request
    using it), its depth ``depth[v]`` and :meth:`params`, the parameter vector it reads
    (default: none). The replay's and the streaming cache's
    kernels run it compiled (once a process for each key function): the heap, the pinning,
    leaf-only eviction and the online ranking come with it."""

    key: Any = None

    def params(self, trace, capacity: int) -> np.ndarray:
        """The vector ``params`` the key reads (``trace``: the replayed trace)."""
        return np.zeros(1)

    def kernel(self, trace, capacity: int) -> tuple[int, np.ndarray]:
        if self.key is None:
            raise TypeError(f"{type(self).__name__} needs a key function: key = "
                            "staticmethod(a numba.njit function of (v, ni, depth, params))")
        return kernels.PRIORITY, np.asarray(self.params(trace, capacity), dtype=np.float64)


@dataclass(frozen=True)
class LRU(EvictionPolicy):
    """Least recently used, in vLLM's order: when a request finishes its blocks join the
    free queue tail first, and the queue front is evicted. Because a block's ancestors are
    always freed with it and after it, the front is always a leaf, and the order equals
    SGLang's (evict the least recently used leaf of the radix tree); the tests check both."""

    name: str = "lru"

    def kernel(self, trace, capacity: int) -> tuple[int, np.ndarray]:
        # the replay orders by its free queue; a host ranks by recency, deepest first
        return kernels.LRU, np.array([0.0, float(trace.depth.max(initial=0))])


@dataclass(frozen=True)
class LFU(EvictionPolicy):
    """Least frequently used leaf, ties by least recent use (SGLang's LFU strategy: priority
    ``(hit_count, last_access_time)``). The count restarts when a block is re-inserted."""

    name: str = "lfu"

    def kernel(self, trace, capacity: int) -> tuple[int, np.ndarray]:
        return kernels.LFU, np.array([float(trace.n_requests + 1)])


@dataclass(frozen=True)
class SIEVE(EvictionPolicy):
    """SIEVE (Zhang et al., NSDI 2024) adapted to leaf-only eviction: a FIFO in insertion
    order, a visited bit set on reuse, and a hand moving from old to new that clears visited
    bits and evicts the first unvisited block it may evict (an unpinned leaf)."""

    name: str = "sieve"
    hand: bool = True

    def kernel(self, trace, capacity: int) -> tuple[int, np.ndarray]:
        return kernels.SIEVE, np.zeros(1)


@dataclass(frozen=True)
class Optimal(EvictionPolicy):
    """Offline reference (Belady): evict the leaf whose next use is furthest in the future,
    deepest first on ties. Next use is monotone along a path (a request using a block uses
    its ancestors), so this victim is also the furthest-used unpinned block overall."""

    name: str = "optimal"
    offline: bool = True

    def kernel(self, trace, capacity: int) -> tuple[int, np.ndarray]:
        return kernels.OPTIMAL, np.array([float(trace.depth.max(initial=0) + 1)])


@dataclass(frozen=True)
class Arms:
    """Shadow configuration of :class:`Canopy` at one capacity: the sampling rate and the
    shadows' scaled capacity, the sample's hash seed, the per-sample discount, the switching
    threshold in standard errors, the evidence needed before a switch, per arm (shadow ``a``
    evicts by arm ``a``) the kernel code, and the leaves a decayed shadow draws to evict one
    (0: it keeps a heap and evicts the lowest-keyed leaf exactly)."""

    rate: float
    capacity: int
    seed: int
    gamma: float
    z: float
    min_evidence: float
    kinds: np.ndarray
    candidates: int = 0


@dataclass(frozen=True)
class Canopy(EvictionPolicy):
    """Canopy's adaptive eviction (paper Section 4, "Serving systems"): a bandit over cells
    with forgetting that also learns *how much to remember*.

    * **cells and cheap aggregate statistics.** Every node of the prefix tree is a cell valued
      by its discounted use count ``sum_i 2^{-(c - c_i) / (H * capacity)}`` (``c``: blocks
      referenced so far; the half-life ``H`` is in cache capacities of traffic). It is a
      statistic of the request stream, kept when the block is evicted, so a block that comes
      back resumes its history. A cell with less evidence than its parent's share,
      ``prior * (count(parent) - 1) / children(parent)``, starts from that share (optimism
      where evidence is thin: the parent aggregates every request through its subtree).
    * **arms: how much to remember.** Each half-life in ``half_lives`` is an arm, and so is
      pure recency (the ``H -> 0`` limit, LRU's order); long half-lives approach LFU. Which
      one predicts reuse best depends on the workload and the capacity, so it is learnt online:
      on a spatially hashed sample of the prefix tree (a request is sampled when the hash of
      its first two blocks' node is below ``rate = min(1, shadow_blocks / capacity)``; the
      sample keeps whole subtrees, as SHARDS / miniature simulation do, Waldspurger et al.
      2015, 2017; ``seed`` salts the hash) every arm runs in a metadata-only shadow cache of
      ``rate * capacity`` blocks that reads the same cells. A decayed arm's shadow evicts
      by sampling: the lowest-keyed of ``candidates`` leaves drawn at random (every leaf
      when it has no more; the draw seeded by ``seed`` too), as Redis and LHD do;
      ``candidates=None`` keeps a heap and evicts the lowest-keyed leaf exactly. At full
      rate the shadow of the arm the main cache evicts by is a copy of the main cache, taken
      when it switched to the arm (a decayed arm's copy evicts exactly, as the main cache
      does): the arm is scored by what the main cache itself reuses.
    * **forgetting.** Each arm's score is its shadow reuse discounted by ``1 - 1/window`` per
      sampled request, so the choice re-adapts after a shift (a cell's counts decay too).
    * **hysteresis.** The main cache evicts the lowest-priority unpinned leaf under the current
      arm and switches (re-ordering its heap once) to the arm with the best score only when
      its discounted paired lead over the current arm exceeds ``z`` standard errors, and never
      before ``min_evidence`` sampled requests (discounted) back the estimate. It starts on
      recency (``start_half_life=None``), the engines' default, so it departs from LRU only on
      evidence. All arms are replayed on the same sampled requests, so they have equal
      evidence; the optimism of the paper applies to cells (the parental prior), not to arms.

    Nothing reads the future: the sample is a hash of block identity, every statistic is of
    past requests.
    """

    name: str = "canopy"
    half_lives: tuple[float, ...] = (8.0, 32.0)
    prior: float = 1.0
    shadow_blocks: int = 256
    window: float = 1000.0
    z: float = 3.0
    min_evidence: float = 100.0
    start_half_life: float | None = None
    seed: int = 0
    candidates: int | None = 32

    def __post_init__(self) -> None:
        if not isinstance(self.half_lives, tuple):
            raise TypeError(f"half_lives must be a tuple, got {type(self.half_lives).__name__}")
        for h in self.half_lives:
            check_positive(h, "half_lives")
        if not self.half_lives or len(set(self.half_lives)) != len(self.half_lives):
            raise ValueError(f"half_lives must be distinct finite numbers > 0, "
                             f"got {self.half_lives!r}")
        for field in ("prior", "shadow_blocks", "window"):
            check_positive(getattr(self, field), field)
        for field in ("z", "min_evidence"):
            check_nonnegative(getattr(self, field), field)
        check_count(self.seed, "seed", low=0)
        if self.candidates is not None:
            check_count(self.candidates, "candidates", low=1)
        if self.start_half_life is not None and self.start_half_life not in self.half_lives:
            raise ValueError(f"start_half_life must be one of half_lives, "
                             f"got {self.start_half_life!r}")

    @property
    def arm_names(self) -> tuple[str, ...]:
        """Arm 0 is recency; arm ``j >= 1`` the decayed count with ``half_lives[j - 1]``."""
        return ("recency", *(f"half-life {h:g}" for h in self.half_lives))

    @property
    def start_arm(self) -> int:
        """The arm evicting before any evidence: recency unless ``start_half_life`` is set."""
        if self.start_half_life is None:
            return 0
        return 1 + self.half_lives.index(self.start_half_life)

    def kernel(self, trace, capacity: int) -> tuple[int, np.ndarray]:
        lams = [math.log(2.0) / (h * capacity) for h in self.half_lives]
        # the cells' epoch: a use's scale e^{lam (c - epoch start)} stays below e^512
        period = max(1.0, math.floor(512.0 / max(lams)))
        return kernels.CANOPY, np.array([
            float(self.prior), float(trace.depth.max(initial=0)), period, *lams])

    def arms(self, capacity: int) -> Arms:
        """The shadows at ``capacity``: one recency arm and one decayed arm per half-life."""
        rate = min(1.0, self.shadow_blocks / capacity)
        return Arms(rate=rate, capacity=max(1, round(rate * capacity)), seed=self.seed,
                    gamma=1.0 - 1.0 / self.window, z=float(self.z),
                    min_evidence=float(self.min_evidence),
                    kinds=np.array([kernels.LRU] + [kernels.CANOPY] * len(self.half_lives)),
                    candidates=self.candidates or 0)


POLICIES: dict[str, type[EvictionPolicy]] = {
    "lru": LRU, "lfu": LFU, "sieve": SIEVE, "canopy": Canopy, "optimal": Optimal}
"""Policy classes by name."""


def policy_class(spec: str) -> type[EvictionPolicy]:
    """The class a policy spec names: a name of :data:`POLICIES` or ``package.module:Class``,
    a user's :class:`EvictionPolicy` subclass (the module must be importable: installed or on
    ``PYTHONPATH``). Raises ``ValueError`` with one line naming the problem."""
    if not isinstance(spec, str):
        raise TypeError(f"a policy spec is a str, got {type(spec).__name__}")
    if spec in POLICIES:
        return POLICIES[spec]
    module_name, colon, attribute = spec.partition(":")
    if not colon:
        raise ValueError(f"unknown policy {spec!r}; known: {', '.join(POLICIES)}, or "
                         "package.module:ClassName for a policy of your own")
    if not module_name or not attribute:
        raise ValueError(f"policy {spec!r}: write package.module:ClassName")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ValueError(f"policy {spec!r}: cannot import {module_name!r} ({error}); is it "
                         "installed or on PYTHONPATH?") from None
    except Exception as error:  # the user's module itself fails: name it, in one line
        raise ValueError(f"policy {spec!r}: importing {module_name!r} failed: "
                         f"{type(error).__name__}: {error}") from None
    try:
        cls = operator.attrgetter(attribute)(module)
    except AttributeError:
        raise ValueError(f"policy {spec!r}: module {module_name!r} has no {attribute!r}"
                         ) from None
    if not (isinstance(cls, type) and issubclass(cls, EvictionPolicy)):
        raise ValueError(f"policy {spec!r} is not a policy class (a subclass of "
                         "canopy.prefix.policies.PriorityPolicy or EvictionPolicy)")
    return cls


def make_policy(name: str, **config: float) -> EvictionPolicy:
    """A policy by name (``lru``, ``lfu``, ``sieve``, ``canopy``, ``optimal``) or spec
    (``package.module:Class``, see :func:`policy_class`), made with ``config``."""
    return policy_class(name)(**config)


def resolve_policy(spec: str | EvictionPolicy | type[EvictionPolicy], *,
                   online: bool = False, ranked: bool = False) -> EvictionPolicy:
    """The policy every host takes: a policy object, a policy class (made with no arguments)
    or a spec (:func:`policy_class`). ``online``: the host serves requests as they come, so
    a policy that reads the future (``optimal``) is refused. ``ranked``: the host evicts by
    priority alone (SGLang's strategies), so a policy with a ``hand`` (``sieve``) is
    refused. Errors are one line."""
    if isinstance(spec, EvictionPolicy):
        policy = spec
    else:
        cls = policy_class(spec.strip()) if isinstance(spec, str) else spec
        if not (isinstance(cls, type) and issubclass(cls, EvictionPolicy)):
            raise TypeError(f"a policy is a name, package.module:ClassName, an EvictionPolicy "
                            f"subclass or instance, got {spec!r}")
        try:
            policy = cls()
        except TypeError as error:
            raise ValueError(f"policy {cls.__name__} cannot be made with no arguments: "
                             f"{error}") from None
    if policy.name in POLICIES and not isinstance(policy, POLICIES[policy.name]):
        raise ValueError(f"policy {type(policy).__name__} is named {policy.name!r}, a built-in "
                         "policy's name; give it a name of its own")
    if isinstance(policy, PriorityPolicy) and policy.key is None:
        raise ValueError(f"policy {type(policy).__name__} has no key function: key = "
                         "staticmethod(a numba.njit function of (v, ni, depth, params))")
    if online and policy.offline:
        raise ValueError(f"policy {policy.name!r} reads the future; a host serving requests "
                         "as they come cannot run it")
    if ranked and policy.hand:
        raise ValueError(f"policy {policy.name!r} is a hand over insertion order, not a "
                         "priority; this host ranks blocks by priority")
    return policy
