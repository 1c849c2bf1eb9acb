"""Replica policies behind one interface: ``choose(request, view) -> replica`` and
``observe(request, replica, ttft_s)``.

Every rule is one branch of the compiled :func:`decide`, which reads only what a gateway has:
the blocks each replica holds of the request's prefix (from the
:class:`~canopy.fleet.index.ReplicaIndex`) and the load table
(:class:`~canopy.fleet.load.Load`). The same kernel serves the fleet simulator's compiled loop
and a live gateway's :meth:`ReplicaPolicy.choose`. The peers' rules, as their sources define
them (summary in ``docs/fleet.md``):

* ``round_robin``; ``least_load`` (fewest in-flight requests, then fewest queued prefill
  tokens); ``power_of_two`` (the less loaded of two replicas drawn at random);
* ``prefix_hash``: jump consistent hash (Lamping and Veach 2014) of the first
  :data:`HASHED_BLOCKS` blocks (the key of the last of them: keys are chained);
* ``sglang``: sglang-router's ``cache_aware``. If max - min in-flight > ``balance_abs``
  (64) and max > ``balance_rel`` (1.5) x min: the fewest in-flight. Else the best prefix
  match if its match rate > ``cache_threshold`` (0.3), else the fewest in-flight;
* ``dynamo``: NVIDIA Dynamo's KV router, lowest ``weight`` (1) x prefill blocks to compute
  + active blocks;
* ``llmd``: llm-d's scorers, highest 3 x prefix match + 1 x queue + 1 x free KV, each in
  [0, 1];
* ``canopy``: lowest estimated wait (queued prefill tokens plus a per-request overhead in
  token units) + ``theta`` x the tokens it must still prefill there. ``theta`` = 1 is the
  greedy estimate of the request's own TTFT; above 1 it keeps prefixes where they are
  (affinity), below 1 it spreads load. A hot prefix is copied to a second replica exactly
  when the holder's queue costs more than ``theta`` x recomputing it elsewhere. With
  ``learn=True`` (the default) ``theta`` is chosen per request from :data:`LEARNT_GRID`
  (``theta >= 1``: lower trade-offs are dominated in the TTFT model) by the regional
  router (:class:`canopy.regional.RegionalRouter`, certified sharing between a region of the
  prefix tree and its parent, paper Section 4) from the observed TTFT.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import numba as nb
import numpy as np

from canopy import sharing as sharing_module
from canopy.fleet import index as index_module
from canopy.fleet import load as load_module
from canopy.fleet.index import ReplicaIndex
from canopy.fleet.load import Load
from canopy.regional import kernels
from canopy.regional.router import RegionalRouter
from canopy.validation import check_count, check_nonnegative, check_number, check_positive

__all__ = ["CANOPY", "DEFAULT_GRID", "LEARNT_GRID", "NAMES", "PEERS", "ReplicaPolicy", "Request",
           "TradeoffRouter", "View", "choose_keys", "decide", "hash_key", "learn",
           "make_policy", "region_buckets", "region_path"]

ROUND_ROBIN, LEAST_LOAD, POWER_OF_TWO, PREFIX_HASH, SGLANG, DYNAMO, LLMD, CANOPY = range(8)
NAMES = {"round_robin": ROUND_ROBIN, "least_load": LEAST_LOAD, "power_of_two": POWER_OF_TWO,
         "prefix_hash": PREFIX_HASH, "sglang": SGLANG, "dynamo": DYNAMO, "llmd": LLMD,
         "canopy": CANOPY}
PEERS = ("round_robin", "least_load", "power_of_two", "prefix_hash", "sglang", "dynamo",
         "llmd")
PRODUCTION_INDEX = {"sglang": "approximate", "dynamo": "precise", "llmd": "precise",
                    "canopy": "precise"}
"""The index each rule has in production (sglang-router: its tree of what it sent where)."""
DEFAULT_GRID = (0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0, 8.0)
"""Canopy's trade-offs ``theta`` (weight of prefill to compute against queued work): the
fixed references' grid (``best_fixed``)."""
LEARNT_GRID = tuple(theta for theta in DEFAULT_GRID if theta >= 1.0)
"""The arms the learner plays: ``theta >= 1``. In the TTFT model (wait + prefill) routing to
replica ``r`` costs the request its wait there plus its prefill, and costs the fleet its
prefill once more for every request that queues behind it (FIFO: its wait delays nobody)
and the blocks it stores (each evicts one): a marginal cost ``wait + (1 + e) x prefill``
with ``e >= 0``. A ``theta`` below 1 weighs a second of prefill less than a second of wait,
which is worse for the request and for the fleet alike, so those arms are dominated a
priori and playing them is pure exploration cost."""
HASHED_BLOCKS = 4
"""Blocks of the prefix ``prefix_hash`` hashes (one would send every request that shares a
system prompt's first block to one replica)."""
REGION_BUCKETS = 16
REGION_DEPTH = 4
"""A request's region: its first block's bucket, then its ``REGION_DEPTH``-th block's."""
# state: rotating counter, random state (splitmix64)
COUNTER, RNG = 0, 1


@nb.njit(cache=True)
def _next_random(state: np.ndarray) -> np.uint64:
    """splitmix64 (Steele, Lea and Flood 2014) on ``state[RNG]``."""
    z = np.uint64(state[RNG]) + np.uint64(0x9E3779B97F4A7C15)
    state[RNG] = np.int64(z)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@nb.njit(cache=True)
def _jump_hash(key: np.uint64, buckets: int) -> int:
    """Jump consistent hash (Lamping and Veach 2014)."""
    b, j = -1, 0
    while j < buckets:
        b = j
        key = key * np.uint64(2862933555777941757) + np.uint64(1)
        j = int((b + 1) * (float(1 << 31) / float((key >> np.uint64(33)) + np.uint64(1))))
    return b


@nb.njit(cache=True)
def _argmin(values: np.ndarray, start: int) -> int:
    """Index of the smallest value; ties go to the first from ``start`` on, cyclically."""
    n = values.size
    best = start % n
    for k in range(1, n):
        r = (start + k) % n
        if values[r] < values[best]:
            best = r
    return best


@nb.njit(cache=True)
def decide(code: int, params: np.ndarray, state: np.ndarray, matched: np.ndarray,
           req_blocks: int, req_tokens: int, block_tokens: int, hash_key: int,
           load: np.ndarray, scratch: np.ndarray) -> int:
    """The replica for one request under rule ``code`` (see the module's docstring).
    ``matched[r]``: blocks of the request's prefix replica ``r`` holds; ``load``: the load
    table; ``hash_key``: the key of the request's :data:`HASHED_BLOCKS`-th block (or its
    last); ``scratch``: a float array of one slot per replica."""
    n = matched.size
    state[COUNTER] += 1
    start = state[COUNTER]
    inflight = load[load_module.INFLIGHT]
    if code == ROUND_ROBIN:
        return (start - 1) % n
    if code == LEAST_LOAD:
        for r in range(n):
            scratch[r] = inflight[r] + load[load_module.QUEUED_TOKENS, r] / 1e12
        return _argmin(scratch, start)
    if code == POWER_OF_TWO:
        a = np.int64(_next_random(state) >> np.uint64(1)) % n
        b = np.int64(_next_random(state) >> np.uint64(1)) % max(n - 1, 1)
        if n > 1 and b >= a:
            b += 1
        return a if inflight[a] <= inflight[b] else b
    if code == PREFIX_HASH:
        return _jump_hash(np.uint64(hash_key), n)
    best_match = 0
    for r in range(n):
        if matched[r] > best_match:
            best_match = matched[r]
    if code == SGLANG:
        low, high = inflight.min(), inflight.max()
        if not (high - low > params[1] and high > params[2] * low):
            rate = min(best_match * block_tokens, req_tokens) / max(req_tokens, 1)
            if rate > params[0]:
                for r in range(n):  # the best match; ties to the less loaded
                    scratch[r] = inflight[r] if matched[r] == best_match else np.inf
                return _argmin(scratch, start)
        return _argmin(inflight, start)
    if code == DYNAMO:
        for r in range(n):
            scratch[r] = params[0] * (req_blocks - matched[r]) + \
                load[load_module.ACTIVE_BLOCKS, r]
        return _argmin(scratch, start)
    if code == LLMD:
        queued = load[load_module.QUEUED]
        q_low, q_high = queued.min(), queued.max()
        for r in range(n):
            prefix = matched[r] / max(req_blocks, 1)
            queue = 1.0 if q_high == q_low else (q_high - queued[r]) / (q_high - q_low)
            kv = 1.0 - load[load_module.KV_USE, r]
            scratch[r] = -(params[0] * prefix + params[1] * queue + params[2] * kv)
        return _argmin(scratch, start)
    # CANOPY: params = (theta, overhead in tokens)
    for r in range(n):
        cached = min(matched[r] * block_tokens, req_tokens)
        scratch[r] = load[load_module.QUEUED_TOKENS, r] + params[1] * \
            load[load_module.QUEUED, r] + params[0] * (req_tokens - cached)
    return _argmin(scratch, start)


@nb.njit(cache=True)
def hash_key(keys: np.ndarray) -> int:
    """The key ``prefix_hash`` hashes: the :data:`HASHED_BLOCKS`-th block's (0: no blocks)."""
    return keys[min(HASHED_BLOCKS, keys.size) - 1] if keys.size else 0


@nb.njit(cache=True)
def choose_keys(code: int, params: np.ndarray, state: np.ndarray, slots: np.ndarray,
                key: np.ndarray, parent: np.ndarray, mask: np.ndarray, stamp: np.ndarray,
                keys: np.ndarray, now: float, ttl: float, nodes: np.ndarray,
                matched: np.ndarray, req_tokens: int, block_tokens: int, load: np.ndarray,
                scratch: np.ndarray, stats: np.ndarray, chain: np.ndarray, kind: int,
                rule: np.ndarray, explore: float, z: np.ndarray, est: np.ndarray,
                arm_scores: np.ndarray, grid: np.ndarray) -> tuple[int, int]:
    """A gateway's whole choice in one compiled call: the blocks of ``keys`` each replica
    holds into ``matched`` (:func:`~canopy.fleet.index.match_keys` on the index's columns,
    ``nodes`` its scratch), then, when ``grid`` is not empty, the trade-off: the arm of the
    best index (:func:`canopy.regional.kernels.scores` at the region's ``chain``, the first
    best as ``np.argmax``) sets ``params[0]``; then :func:`decide`. ``(replica, arm)``; the
    arm is -1 without a grid."""
    index_module.match_keys(slots, key, parent, mask, stamp, keys, now, ttl, nodes, matched)
    arm = -1
    if grid.size:
        kernels.scores(stats, chain, kind, rule, explore, z, est, arm_scores)
        arm = int(np.argmax(arm_scores))
        params[0] = grid[arm]
    replica = decide(code, params, state, matched, keys.size, req_tokens, block_tokens,
                     hash_key(keys), load, scratch)
    return replica, arm


@nb.njit(cache=True)
def learn(stats: np.ndarray, chain: np.ndarray, arm: int, ttft: float, rule: np.ndarray,
          cost_max: np.ndarray) -> None:
    """The regional router's update with reward ``-ttft`` (quality 0, cost ``ttft``,
    ``lam`` 1: ``RegionalRouter.update``), in a compiled loop."""
    kernels.push(stats, chain, arm, -ttft)
    if ttft > cost_max[0]:
        cost_max[0] = ttft
        rule[sharing_module.RANGE] = 1.0 + ttft




def region_buckets(first_key: int, deep_key: int, buckets: int = REGION_BUCKETS
                   ) -> tuple[int, int]:
    """A request's region buckets from its first block's key and its ``REGION_DEPTH``-th."""
    mix = 0x9E3779B97F4A7C15
    return ((first_key * mix) >> 20) % buckets, ((deep_key * mix) >> 20) % buckets


def region_path(keys: np.ndarray) -> str:
    """The prefix-tree region of a request (``"b1/b2"``; ``""`` with no blocks)."""
    if keys.size == 0:
        return ""
    a, b = region_buckets(int(keys[0]), int(keys[min(REGION_DEPTH, keys.size) - 1]))
    return f"{a}/{b}"


class TradeoffRouter(RegionalRouter):
    """The regional router over Canopy's trade-offs: arms are the ``theta`` grid, the reward
    is minus the observed TTFT (s). It lends its tables to compiled hosts."""

    def __init__(self, grid: tuple[float, ...], *, sharing: str = "test", delta: float = 0.01,
                 explore: float = 1.0, seed: int = 0) -> None:
        super().__init__([f"{theta:g}" for theta in grid], lam=1.0, sharing=sharing,
                         delta=delta, explore=explore, seed=seed)
        self.grid = np.asarray(grid, dtype=float)

    def node(self, region: str) -> int:
        """Node of ``region`` (created with its prefixes); grows the tables."""
        return self._node(region)

    def tables(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(stats, chains, rule, cost_max)``, updated in place by :func:`learn`; call
        :meth:`settle` after a compiled run."""
        self._cost_box = np.array([self._cost_max])
        return self._stats, self._chains, self._rule, self._cost_box

    def settle(self) -> None:
        """Take back the largest cost a compiled run saw."""
        self._cost_max = float(self._cost_box[0])

    def arm(self, region: str) -> int:
        scores = self.scores(region)
        return int(np.argmax(scores))

    def played(self) -> dict[str, float]:
        """The ``theta`` each region's arm of the highest index is now, by region path (the
        root as ``"/"``): what ``arm`` plays there (UCB's index; no draw is made)."""
        k = len(self.models)
        z, est, out = np.zeros(k), np.empty((k, 3)), np.empty(k)
        played = {}
        for node, path in enumerate(self.regions.paths):
            kernels.scores(self._stats, self._chains[node], self._kind, self._rule,
                           self.explore, z, est, out)
            played[path or "/"] = float(self.grid[int(np.argmax(out))])
        return played

    def scoring(self, node: int) -> tuple[np.ndarray, np.ndarray, int, np.ndarray, np.ndarray]:
        """What :func:`choose_keys` reads to score the arms at region ``node`` (from
        :meth:`node`): ``(stats, chain, kind, rule, z)``, ``z`` drawn as
        ``RegionalRouter.scores`` draws it (Thompson sampling's normals;
        zeros for UCB)."""
        return self._stats, self._chains[node], self._kind, self._rule, self._draw()


@dataclass(frozen=True)
class Request:
    """One request as a gateway sees it: its blocks' keys (root first), prompt tokens and
    an id to match :meth:`ReplicaPolicy.observe` with."""

    keys: np.ndarray
    tokens: int
    rid: int = 0

    def __post_init__(self) -> None:
        keys = np.asarray(self.keys, dtype=np.int64)
        if keys.ndim != 1:
            raise ValueError(f"keys must be a 1-d sequence of block keys, got shape {keys.shape}")
        object.__setattr__(self, "keys", keys)
        check_count(self.tokens, "tokens", low=0)


@dataclass
class View:
    """What a policy may read: the replica index, the load table, the time (s), the
    engines' tokens per block."""

    index: ReplicaIndex
    load: Load
    now: float = 0.0
    block_tokens: int = 16
    _matched: np.ndarray | None = field(default=None, repr=False)
    _keys: np.ndarray | None = field(default=None, repr=False)  # what _matched is for,
    _of: tuple[object, ...] = field(default=(), repr=False)  # when, in which index

    def matched(self, keys: np.ndarray) -> np.ndarray:
        """Blocks of ``keys`` each replica holds now (one buffer, overwritten by the next
        request; the same request asked again at the same time, the index unchanged, is
        not matched again)."""
        index = self.index
        of = (self.now, index, index.version)
        if keys is self._keys and of == self._of:
            return self._matched  # type: ignore[return-value]
        index.match(keys, self.now, self.buffer())
        self._keys, self._of = keys, of
        return self._matched  # type: ignore[return-value]

    def buffer(self) -> np.ndarray:
        """The buffer :meth:`matched` fills (one slot per replica)."""
        if self._matched is None or self._matched.size != self.index.n_replicas:
            self._matched = np.zeros(self.index.n_replicas, dtype=np.int64)
        return self._matched

    def matching(self, keys: np.ndarray) -> None:
        """:meth:`buffer` now holds the match of ``keys`` (made by a compiled caller)."""
        self._keys, self._of = keys, (self.now, self.index, self.index.version)


class ReplicaPolicy:
    """A replica policy by name (``NAMES``); see :func:`make_policy`."""

    PENDING = 65_536
    """Requests awaiting their TTFT that a learning policy remembers (oldest dropped)."""

    def __init__(self, name: str, *, params: tuple[float, ...] = (), seed: int = 0,
                 router: TradeoffRouter | None = None) -> None:
        if name not in NAMES:
            raise ValueError(f"unknown replica policy {name!r}; known: {', '.join(NAMES)}")
        self.name, self.code = name, NAMES[name]
        self.params = np.zeros(4)
        self.params[:len(params)] = params
        self.state = np.zeros(2, dtype=np.int64)
        self.state[RNG] = (seed * 0x9E3779B97F4A7C15) % 2 ** 64 >> 1
        self.router = router
        self.report: Callable[[str, str, float, float], None] | None = None
        """Where observations go instead of ``router.update`` (a gateway's store: several
        gateways learn one trade-off; :meth:`~canopy.regional.RoutingService.observe`)."""
        self.index_mode = PRODUCTION_INDEX.get(name, "precise")
        self._pending: OrderedDict[int, tuple[str, int]] = OrderedDict()
        self._scratch = np.zeros(1)
        self._est, self._arm_scores = np.empty((0, 3)), np.empty(0)
        self._idle = (np.zeros((1, 1, 3)), np.full(1, -1, dtype=np.int64), 0, np.zeros(4),
                      np.zeros(1))  # what the compiled choice is handed without a router
        self._regions: dict[tuple[int, int], tuple[str, int]] = {}
        self._regions_of: object = None

    @property
    def learns(self) -> bool:
        return self.router is not None

    def choose(self, request: Request, view: View) -> int:
        """The replica to send ``request`` to."""
        return self.choose_keys(request.keys, request.tokens, request.rid, view)

    def choose_keys(self, keys: np.ndarray, tokens: int, rid: int, view: View) -> int:
        """:meth:`choose` for a request given by its parts, already checked (``keys`` an
        int64 array, ``tokens`` >= 0): a gateway's hot path, one compiled call
        (:func:`choose_keys`); ``view.matched(keys)`` then reads the match it made."""
        index = view.index
        matched = view.buffer()
        if self._scratch.size != matched.size:
            self._scratch = np.zeros(matched.size)
        router = self.router
        if router is None:
            stats, chain, kind, rule, z = self._idle
            grid = _NO_GRID
        else:
            region, node = self._region(keys)
            stats, chain, kind, rule, z = router.scoring(node)
            grid = router.grid
            if self._est.shape[0] != grid.size:
                self._est, self._arm_scores = np.empty((grid.size, 3)), np.empty(grid.size)
        tree = index.tree
        replica, arm = choose_keys(self.code, self.params, self.state, tree.slots, tree.key,
                                   tree.parent, index.mask, index.stamp, keys, view.now,
                                   index.ttl_s, index.scratch(keys.size), matched, tokens,
                                   view.block_tokens, view.load.table, self._scratch, stats,
                                   chain, kind, rule, self._explore(), z, self._est,
                                   self._arm_scores, grid)
        view.matching(keys)
        if router is not None:
            self._pending[rid] = (region, arm)
            if len(self._pending) > self.PENDING:
                self._pending.popitem(last=False)
        return int(replica)

    def _explore(self) -> float:
        return 0.0 if self.router is None else self.router.explore

    def _region(self, keys: np.ndarray) -> tuple[str, int]:
        """``(region path, its node in the router)`` of a request, the node made once per
        region (:data:`REGION_BUCKETS` squared at most), again when the router's region
        tree is replaced."""
        router = self.router
        assert router is not None
        if self._regions_of is not router.regions:
            self._regions.clear()
            self._regions_of = router.regions
        if keys.size == 0:
            buckets: tuple[int, int] = (-1, -1)
        else:
            buckets = region_buckets(int(keys[0]), int(keys[min(REGION_DEPTH, keys.size) - 1]))
        found = self._regions.get(buckets)
        if found is None:
            region = region_path(keys)
            found = self._regions[buckets] = (region, router.node(region))
        return found

    def observe(self, request: Request, replica: int, ttft_s: float) -> None:
        """The first token of ``request`` came back from ``replica`` after ``ttft_s``."""
        check_nonnegative(ttft_s, "ttft_s")
        if self.router is None:
            return
        pending = self._pending.pop(request.rid, None)
        if pending is not None:
            region, arm = pending
            update = self.router.update if self.report is None else self.report
            update(region, self.router.models[arm], 0.0, ttft_s)


_NO_GRID = np.zeros(0)


def make_policy(name: str, *, seed: int = 0, cache_threshold: float = 0.3,
                balance_abs: float = 64.0, balance_rel: float = 1.5,
                dynamo_weight: float = 1.0, llmd_weights: tuple[float, float, float] = (3, 1, 1),
                theta: float | None = None, grid: tuple[float, ...] = LEARNT_GRID,
                overhead_tokens: float = 200.0, sharing: str = "test",
                explore: float = 1.0) -> ReplicaPolicy:
    """The policy ``name`` with its peers' defaults (each settable). ``canopy``: learns
    ``theta`` over ``grid`` (:data:`LEARNT_GRID`) unless ``theta`` fixes it;
    ``overhead_tokens`` is the fixed per-request prefill overhead in tokens (overhead / time
    per token of the TTFT model) on an engine that serves one request at a time; 0 on one
    that batches (vLLM: a step pays the overhead once for every request it holds)."""
    if name not in NAMES:
        raise ValueError(f"unknown replica policy {name!r}; known: {', '.join(NAMES)}")
    if name == "sglang":
        params = (check_number(cache_threshold, "cache_threshold", low=0.0, high=1.0),
                  check_nonnegative(balance_abs, "balance_abs"),
                  check_positive(balance_rel, "balance_rel"))
        return ReplicaPolicy(name, params=params, seed=seed)
    if name == "dynamo":
        return ReplicaPolicy(name, params=(check_nonnegative(dynamo_weight,
                                                             "dynamo_weight"),), seed=seed)
    if name == "llmd":
        return ReplicaPolicy(name, params=tuple(check_nonnegative(w, "llmd_weights")
                                                for w in llmd_weights), seed=seed)
    if name == "canopy":
        overhead = check_nonnegative(overhead_tokens, "overhead_tokens")
        if theta is not None:
            return ReplicaPolicy(name, params=(check_nonnegative(theta, "theta"), overhead),
                                 seed=seed)
        check_count(len(grid), "len(grid)")
        router = TradeoffRouter(tuple(check_nonnegative(t, "grid") for t in grid),
                                sharing=sharing, explore=explore, seed=seed)
        return ReplicaPolicy(name, params=(1.0, overhead), seed=seed, router=router)
    return ReplicaPolicy(name, seed=seed)
