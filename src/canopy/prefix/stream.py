"""The radix block cache fed one request at a time, for servers (paper Section 4, "Serving
systems").

:class:`~canopy.prefix.RadixCache` replays a whole :class:`Trace` whose block
universe is known in advance. A server meets its blocks one request at a time, keyed by
whatever its engine hashes (token tuples, prefix-hash strings, integers), and runs for ever.
:class:`StreamingCache` runs the same per-request kernels (so the same victims, request for
request: the tests compare it with :meth:`RadixCache.run`) on node tables that grow as new
blocks appear, and bounds them: once the tables hold twice what was kept last time, nodes that
no cache holds and whose decayed counts (``canopy``'s cells) have fallen below
``history_floor`` are forgotten, with the subtrees below them. What remains is O(capacity):
the cached blocks of the main cache and the shadows, and the cells referenced within about
``log2(1 / history_floor)`` half-lives of traffic.

The offline optimum reads the future and has no streaming form; when the requests are known
in advance (a measurement that replays a planned workload), :class:`PlannedCache` serves them
one at a time with the same interface, so every policy, the optimum included, can run live.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Sequence

import numba as nb
import numpy as np

from canopy.prefix import kernels
from canopy.prefix.policies import EvictionPolicy, make_policy
from canopy.prefix.traces import from_paths

__all__ = ["OnlinePolicy", "PlannedCache", "StreamingCache", "replay_stream"]

_MAX_DEPTH = 65_535
"""Deepest block a streaming cache orders exactly by recency (``canopy``'s recency key breaks
ties by depth up to this)."""


class _Unbounded:
    """What a policy's kernel reads of a trace, for a stream of unknown length: LFU orders by
    ``(hits, last use)`` exactly for up to 2^32 requests, ``canopy``'s recency arm by ``(last
    use, depth)`` for chains up to ``_MAX_DEPTH`` blocks."""

    n_requests = 2**32 - 1
    depth = np.array([_MAX_DEPTH])


@nb.njit(cache=True)
def _close_upward(keep: np.ndarray, parent: np.ndarray) -> None:
    """Mark every ancestor of a kept node (parents have smaller ids than their children)."""
    for v in range(len(keep) - 1, -1, -1):
        if keep[v] and parent[v] >= 0:
            keep[parent[v]] = True


def _cached_prefix(index: dict[tuple[int, Hashable], int], ni: np.ndarray,
                   keys: Iterable[Hashable]) -> int:
    """Leading blocks of ``keys`` cached in node table ``ni`` (``index``: (parent, key) ->
    node)."""
    node, count = -1, 0
    for key in keys:
        node = index.get((node, key), -1)
        if node < 0 or ni[node, kernels.CACHED] == 0:
            break
        count += 1
    return count


def _remap_links(table: np.ndarray, remap: np.ndarray, columns: Sequence[int]) -> None:
    for column in columns:
        linked = table[..., column] >= 0
        table[..., column][linked] = remap[table[..., column][linked]]


def _remap_heap(hkey: np.ndarray, hnode: np.ndarray, hver: np.ndarray, sc: np.ndarray,
                remap: np.ndarray) -> None:
    """Keep the entries of nodes that survive, renumbered; a sorted array is a min-heap."""
    n = sc[kernels.HLEN]
    alive = remap[hnode[:n]] >= 0
    keys, nodes, vers = hkey[:n][alive], remap[hnode[:n][alive]], hver[:n][alive]
    order = np.argsort(keys, kind="stable")
    m = len(order)
    hkey[:m], hnode[:m], hver[:m] = keys[order], nodes[order], vers[order]
    sc[kernels.HLEN] = m


class _Tree:
    """The node tables of a prefix tree met one request at a time (node ids in order of first
    appearance, so parents have smaller ids than their children), bounded by forgetting: the
    state :class:`StreamingCache` and :class:`OnlinePolicy` share. ``prefix_keys``: a key
    names its whole prefix (a prefix hash), so it indexes a node by itself; otherwise by its
    parent node and key."""

    _serves = False  # whether the kernels serve requests (SIEVE's leaf list links nodes)

    def __init__(self, policy: EvictionPolicy | str, capacity: int,
                 history_floor: float | None, *, prefix_keys: bool) -> None:
        policy = make_policy(policy) if isinstance(policy, str) else policy
        if not isinstance(policy, EvictionPolicy):
            raise TypeError(f"policy must be a policy name or an EvictionPolicy, "
                            f"got {type(policy).__name__}")
        if policy.offline:
            raise ValueError(f"policy {policy.name!r} reads the future; replay it on a whole "
                             "trace (canopy.prefix.RadixCache)")
        if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)):
            raise TypeError(f"capacity must be an int, got {type(capacity).__name__}")
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1 block, got {capacity}")
        if history_floor is not None and not 0 < history_floor < 1:
            raise ValueError(f"history_floor must be in (0, 1) or None, got {history_floor!r}")
        self.policy = policy
        self.capacity = int(capacity)
        self.history_floor = history_floor
        self.kind, self.params = policy.kernel(_Unbounded(), self.capacity)
        keyed = self.kind == kernels.PRIORITY  # a policy's own key function
        self._how = policy.key if keyed else self.kind
        self._serve = kernels.request_keyed if keyed else kernels.request
        self._rank = kernels.priorities_keyed if keyed else kernels.priorities
        self.requests = 0
        self.forgotten = 0
        self._prefix_keys = prefix_keys
        self._index: dict[Hashable, int] = {}
        self._keys: list[Hashable] = []
        self._n = 0
        self._parent = np.full(1024, -1, dtype=np.int64)
        self._depth = np.zeros(1024, dtype=np.int64)
        self._born = np.zeros(1024, dtype=np.int64)  # stable ids: order of (re)appearance
        self._births = 0
        self._ni = kernels.node_table(1024)
        self._sc = kernels.scalars()
        self._canopy = self.kind == kernels.CANOPY
        self._cells = np.zeros((1, kernels.CELL_S0))
        self._shadows = None
        self._longest = 1
        if self._canopy:
            self._cells = np.zeros((1024, len(self.params) - kernels.LAM0 + kernels.CELL_S0))
            self._cells[:, kernels.CELL_CLOCK] = -1.0
            self._shadows = kernels.Shadows(1024, self._longest, policy, self.capacity)
            self._sc[kernels.ARM] = policy.start_arm
            self._rate = float(self._shadows.ac[0])
            self._in_sample, self._out_of_sample = (
                np.concatenate([[rate], self._shadows.ac[1:]]) for rate in (1.0, 0.0))
        self._hkey, self._hnode, self._hver = self._heap(kernels.shadow_heap_size(
            self.capacity, self._longest))
        shadow_blocks = 0 if self._shadows is None else self._shadows.capacity * len(
            self._shadows.kinds)
        self._floor_nodes = 4 * (self.capacity + shadow_blocks) + 1024
        self._limit = 2 * self._floor_nodes

    @staticmethod
    def _heap(size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return (np.zeros(size), np.zeros(size, dtype=np.int64), np.zeros(size, dtype=np.int64))

    def _state(self) -> kernels.Cache:
        return kernels.Cache(self._ni, self._sc, self._hkey, self._hnode, self._hver)

    @property
    def n_nodes(self) -> int:
        """Nodes of the prefix tree held now (cached blocks and remembered history)."""
        return self._n

    @property
    def arm(self) -> int:
        """``canopy``: the arm whose priority evicts now (index into ``policy.arm_names``)."""
        return int(self._sc[kernels.ARM])

    def _chain(self, keys: Iterable[Hashable]) -> np.ndarray:
        out: list[int] = []
        node = -1
        for key in keys:
            child = self._index.get(key if self._prefix_keys else (node, key))
            if child is None:
                child = self._add(node, key, len(out) + 1)
            out.append(child)
            node = child
        if len(out) > _MAX_DEPTH:
            raise ValueError(f"a request of {len(out)} blocks is deeper than the "
                             f"{_MAX_DEPTH} a streaming cache orders exactly")
        self._fit(len(out))
        return np.asarray(out, dtype=np.int64)

    def _add(self, parent: int, key: Hashable, depth: int) -> int:
        v = self._n
        if v == len(self._parent):
            self._grow(2 * v)
        self._index[key if self._prefix_keys else (parent, key)] = v
        self._keys.append(key)
        self._parent[v] = parent
        self._depth[v] = depth
        self._born[v] = self._births
        self._births += 1
        self._n = v + 1
        return v

    def _grow(self, n: int) -> None:
        old = len(self._parent)
        self._parent = np.concatenate([self._parent, np.full(n - old, -1, dtype=np.int64)])
        self._depth = np.concatenate([self._depth, np.zeros(n - old, dtype=np.int64)])
        self._born = np.concatenate([self._born, np.zeros(n - old, dtype=np.int64)])
        self._ni = np.concatenate([self._ni, kernels.node_table(n - old)])
        if self._canopy:
            fresh = np.zeros((n - old, self._cells.shape[1]))
            fresh[:, kernels.CELL_CLOCK] = -1.0
            self._cells = np.concatenate([self._cells, fresh])
            shadows = self._shadows
            shadows.ni = np.concatenate(
                [shadows.ni, np.stack([kernels.node_table(n - old)] * len(shadows.kinds))],
                axis=1)

    def _fit(self, length: int) -> None:
        """Heaps large enough for a request of ``length`` blocks."""
        if length <= self._longest:
            return
        self._longest = length
        size = kernels.shadow_heap_size(self.capacity, length)
        self._hkey, self._hnode, self._hver = (
            np.concatenate([a, np.zeros(size - len(a), dtype=a.dtype)])
            for a in (self._hkey, self._hnode, self._hver))
        if self._shadows is not None:
            shadows = self._shadows
            size = kernels.shadow_heap_size(shadows.capacity, length)
            k, old = shadows.hkey.shape
            shadows.hkey, shadows.hnode, shadows.hver = (
                np.concatenate([a, np.zeros((k, size - old), dtype=a.dtype)], axis=1)
                for a in (shadows.hkey, shadows.hnode, shadows.hver))

    def _shadow_args(self, path: np.ndarray) -> kernels.ShadowState:
        """The shadows' kernel arguments for request ``path``, the sample decided here: by
        the spatial hash of its first two blocks' node, as the replay's kernel does, but of
        the node's stable id (its order of appearance, which equals the replay's node id
        until a forgotten node comes back) rather than its index, which forgetting
        renumbers: a request's sample would otherwise change at every compaction. The
        kernel is told through the rate (1: sampled, 0: not)."""
        shadows = self._shadows
        sampled = len(path) > 0 and kernels.unit_hash(
            int(self._born[path[min(1, len(path) - 1)]]), int(shadows.sm[1])) < self._rate
        return shadows.args()._replace(ac=self._in_sample if sampled else self._out_of_sample)

    def _after_request(self) -> None:
        self.requests += 1
        if self.history_floor is not None and self._n >= self._limit:
            self._forget()

    def _forget(self) -> None:
        """Drop nodes no cache holds whose every decayed count is below the floor, then
        renumber what is kept (order-preserving, so parents stay below their children)."""
        n = self._n
        keep = self._ni[:n, kernels.CACHED] == 1
        if self._canopy:
            keep |= (self._shadows.ni[:, :n, kernels.CACHED] == 1).any(axis=0)
            cells = self._cells[:n]
            counts = kernels.cell_counts(cells, self._sc[kernels.CLOCK], self.params)
            keep |= (cells[:, kernels.CELL_CLOCK] >= 0) & (counts.max(axis=1) >= self.history_floor)
        _close_upward(keep, self._parent[:n])
        kept = np.flatnonzero(keep)
        remap = np.full(n, -1, dtype=np.int64)
        remap[kept] = np.arange(len(kept))
        m = len(kept)
        parent = self._parent[kept]
        self._parent[:m] = np.where(parent >= 0, remap[np.maximum(parent, 0)], -1)
        self._depth[:m] = self._depth[kept]
        self._born[:m] = self._born[kept]
        self._ni[:m] = self._ni[kept]
        self._ni[m:n] = kernels.node_table(n - m)
        tables = [(self._ni, self._sc, self._hkey, self._hnode, self._hver)]
        if self._canopy:
            self._cells[:m] = self._cells[kept]
            self._cells[m:n] = 0.0
            self._cells[m:n, kernels.CELL_CLOCK] = -1.0
            s = self._shadows
            s.ni[:, :m] = s.ni[:, kept]
            s.ni[:, m:n] = kernels.node_table(n - m)
            tables += [(s.ni[a], s.sc[a], s.hkey[a], s.hnode[a], s.hver[a])
                       for a in range(len(s.kinds))]
        serves_sieve = self._serves and self.kind == kernels.SIEVE
        sieve = (kernels.LPREV, kernels.LNEXT) if serves_sieve else ()
        for ni, sc, hkey, hnode, hver in tables:
            _remap_links(ni[:m], remap, (kernels.PREV, kernels.NEXT, *sieve))
            sieve = ()  # only the main cache runs SIEVE; the shadows' columns are counts
            for field in (kernels.HEAD, kernels.TAIL, kernels.HAND, kernels.LHEAD, kernels.LTAIL):
                if sc[field] >= 0:
                    sc[field] = remap[sc[field]]
            _remap_heap(hkey, hnode, hver, sc, remap)
        self._keys = [self._keys[v] for v in kept]
        self._index = {key if self._prefix_keys else (int(self._parent[i]), key): i
                       for i, key in enumerate(self._keys)}
        self._n = m
        self.forgotten += n - m
        self._limit = max(m + m // 4, 2 * self._floor_nodes)


class StreamingCache(_Tree):
    """A radix block cache of ``capacity`` blocks under ``policy`` (a name or an online
    :class:`~canopy.prefix.policies.EvictionPolicy`), fed one request at a time.

    :meth:`request` takes a request's block keys, root first (any hashables; a key means its
    whole prefix, as in a prefix-hash chain), and returns how many leading blocks were cached.
    ``history_floor=None`` keeps every node ever seen (exactly :class:`RadixCache`).
    """

    _serves = True

    def __init__(self, policy: EvictionPolicy | str, capacity: int, *,
                 history_floor: float | None = 0.5) -> None:
        super().__init__(policy, capacity, history_floor, prefix_keys=False)

    @property
    def size(self) -> int:
        """Blocks cached now."""
        return int(self._sc[kernels.SIZE])

    def request(self, keys: Iterable[Hashable]) -> int:
        """Serve one request (its block keys, root first): reuse the longest cached prefix,
        insert the rest, evict by the policy. Returns the number of blocks reused."""
        path = self._chain(keys)
        t = self.requests
        if self._canopy:
            reused = kernels.canopy_request(
                t, 0, len(path), path, self._parent, self._depth, self.capacity, self.params,
                self._cells, self._state(), self._shadow_args(path))
        else:
            reused = self._serve(
                self._how, t, 0, len(path), path, path, self._parent, self._depth,
                self.capacity, self.params, self._cells, self._state())
        self._after_request()
        return int(reused)

    def cached_prefix(self, keys: Iterable[Hashable]) -> int:
        """How many leading blocks of ``keys`` are cached now (nothing changes)."""
        return _cached_prefix(self._index, self._ni, keys)


class OnlinePolicy(_Tree):
    """An eviction policy for an engine that keeps its own block cache (vLLM's block pool,
    SGLang's radix cache): Canopy learns from the requests the engine admits and ranks the
    blocks the engine holds; the engine evicts. The kernels are the replay's, so an engine
    that evicts the lowest :meth:`priority` among its unpinned leaf blocks evicts what
    :class:`~canopy.prefix.RadixCache` evicts, block for block.

    ``policy``: ``lru``, ``lfu``, ``sieve``, ``canopy`` or an online
    :class:`~canopy.prefix.policies.EvictionPolicy`; ``capacity``: the engine's cache size
    in blocks (``canopy`` sizes its half-lives and shadow caches by it). Keys are any hashables
    that name a block *with its prefix* (vLLM's block hashes, Mooncake's ``hash_ids``); a key
    seen again under another parent keeps its first parent.

    The host's part:

    * :meth:`observe` each admitted request's block keys, root first, hits and misses, before
      the engine allocates for it;
    * :meth:`evicted` each observed block the engine drops (or could not cache);
    * evict by :meth:`priority` (lower first). Priorities compare across blocks until
      :attr:`epoch` changes (``canopy`` switching arm re-orders them): then re-key.
    * ``sieve`` is not a priority order but a hand over insertion order: :meth:`priority` is
      the insertion order, and the hand walks from the oldest block (from the block after its
      last victim, wrapping), calling :meth:`clear_visited` on each block it passes whose
      :meth:`visited` is set, and evicts the first unvisited evictable block.

    Memory is bounded whatever the run's length: blocks the engine holds (as reported), the
    shadows' blocks, and history whose decayed counts are above ``history_floor`` (see
    :class:`StreamingCache`); should a host miss evictions, at a compaction blocks beyond
    ``capacity`` plus the longest request count as evicted, lowest priority first.
    """

    def __init__(self, policy: EvictionPolicy | str, capacity: int, *,
                 history_floor: float = 0.5) -> None:
        if history_floor is None:
            raise ValueError("an online policy forgets; history_floor must be in (0, 1)")
        super().__init__(policy, capacity, history_floor, prefix_keys=True)
        self._seq = 0
        self._pending: tuple[tuple[Hashable, ...], int] | None = None
        self._one = np.zeros(1, dtype=np.int64)
        self._out = np.zeros(1)

    @property
    def epoch(self) -> int:
        """Bumps when existing priorities are re-ordered (``canopy`` switched arm)."""
        return 0 if self._shadows is None else int(self._shadows.sm[0])

    @property
    def size(self) -> int:
        """Blocks the engine holds, as observed and reported."""
        return int(self._sc[kernels.SIZE])

    def observe(self, keys: Sequence[Hashable], *, start: int = 0) -> None:
        """Learn from one admitted request: its block keys, root first (key ``i``'s parent is
        key ``i - 1``), the blocks it hits and the ones it misses. A key the engine does not
        hold counts as (re)inserted now. ``start > 0``: the request grew (a later prefill
        chunk, its output) and ``keys[:start]`` were observed with it already; only the blocks
        after them count.

        ``canopy``'s shadows replay a request when the next one is observed, as the replay
        runs them after serving it: the arm switches at the same request as in the replay,
        and a request that grew before the next one arrived is replayed whole."""
        if not 0 <= start <= len(keys):
            raise ValueError(f"start must be in 0..{len(keys)}, got {start}")
        if not start:
            self._replay_pending()
        path = self._chain(keys)
        self._seq = kernels.observe(self.kind, self.requests, path[start:], self._parent,
                                   self.params, self._ni, self._cells, self._sc, self._seq)
        if not self._canopy:
            if not start:
                self._after_request()
            return
        if not start:
            self._pending = (tuple(keys), self.requests)
            self._after_request()
        elif self._pending is not None and self._grows(self._pending[0], keys):
            self._pending = (tuple(keys), self._pending[1])

    @staticmethod
    def _grows(seen: Sequence[Hashable], keys: Sequence[Hashable]) -> bool:
        """Whether ``keys`` extends ``seen`` (keys name their prefixes: equal last keys mean
        equal chains)."""
        return 0 < len(seen) < len(keys) and keys[len(seen) - 1] == seen[-1]

    def _replay_pending(self) -> None:
        """Replay the last observed request in the shadows (``canopy``)."""
        if self._pending is None:
            return
        keys, t = self._pending
        self._pending = None
        path = self._chain(keys)
        kernels.canopy_shadows(t, 0, len(path), path, self._parent, self._depth, self.params,
                             self._cells, self._sc, self._shadow_args(path))

    def evicted(self, key: Hashable) -> None:
        """The engine dropped block ``key`` (unknown keys are ignored)."""
        v = self._index.get(key)
        if v is not None and self._ni[v, kernels.CACHED]:
            self._ni[v, kernels.CACHED] = 0
            self._sc[kernels.SIZE] -= 1

    def priority(self, key: Hashable) -> float:
        """Eviction priority of block ``key``, lower evicts first; ``-inf`` for a key never
        observed (or long forgotten): nothing speaks for keeping it."""
        v = self._index.get(key)
        if v is None:
            return -math.inf
        self._one[0] = v
        self._rank(self._how, self._one, self._depth, self._ni, self._cells,
                          self.params, self._sc, self._out)
        return float(self._out[0])

    def priorities(self, keys: Sequence[Hashable]) -> np.ndarray:
        """:meth:`priority` of many keys at once (one compiled call)."""
        nodes = np.fromiter((self._index.get(k, -1) for k in keys), dtype=np.int64,
                            count=len(keys))
        known = nodes >= 0
        out = np.full(len(nodes), -math.inf)
        found = np.zeros(int(known.sum()))
        self._rank(self._how, nodes[known], self._depth, self._ni, self._cells,
                          self.params, self._sc, found)
        out[known] = found
        return out

    def visited(self, key: Hashable) -> bool:
        """``sieve``: whether block ``key`` was reused since the hand last passed it."""
        v = self._index.get(key)
        return v is not None and bool(self._ni[v, kernels.VISITED])

    def clear_visited(self, key: Hashable) -> None:
        """``sieve``: the hand passes block ``key``."""
        v = self._index.get(key)
        if v is not None:
            self._ni[v, kernels.VISITED] = 0

    def _forget(self) -> None:
        held = np.flatnonzero(self._ni[:self._n, kernels.CACHED])
        excess = len(held) - (self.capacity + self._longest)
        if excess > 0:
            keys = np.zeros(len(held))
            self._rank(self._how, held, self._depth, self._ni, self._cells,
                              self.params, self._sc, keys)
            self._ni[held[np.argsort(keys, kind="stable")[:excess]], kernels.CACHED] = 0
            self._sc[kernels.SIZE] -= excess
        super()._forget()


def replay_stream(requests: Iterable[Sequence[Hashable]], policy: EvictionPolicy | str,
                  capacity: int, *, history_floor: float | None = 0.5) -> np.ndarray:
    """Blocks reused by each request of a stream (block keys per request, root first),
    holding O(capacity) state whatever the stream's length."""
    cache = StreamingCache(policy, capacity, history_floor=history_floor)
    return np.fromiter((cache.request(keys) for keys in requests), dtype=np.int64)


class PlannedCache:
    """The radix cache of a known request stream (``plan``: each request's block keys, root
    first), served one request at a time in plan order with :class:`StreamingCache`'s
    interface; any policy, the offline optimum included. Requests without a full block are
    not in the plan and reuse nothing; a request that departs from the plan raises
    :class:`ValueError`."""

    def __init__(self, policy: EvictionPolicy | str, capacity: int,
                 plan: Sequence[Sequence[Hashable]]) -> None:
        self.policy = make_policy(policy) if isinstance(policy, str) else policy
        self._plan = [tuple(keys) for keys in plan if len(keys)]
        if not self._plan:
            raise ValueError("the plan has no request with a full block")
        trace = from_paths(self._plan)
        self._cache = kernels.RadixCache(trace, self.policy, capacity)
        self._index = {(int(trace.parent[v]), key): int(v)
                       for i, keys in enumerate(self._plan)
                       for key, v in zip(keys, trace.path(i).tolist(), strict=True)}

    @property
    def size(self) -> int:
        return self._cache.size

    def request(self, keys: Iterable[Hashable]) -> int:
        keys = tuple(keys)
        if not keys:
            return 0
        t = self._cache.next_request_
        if t >= len(self._plan) or keys != self._plan[t]:
            raise ValueError(f"request {t} does not follow the plan")
        return self._cache.step()

    def cached_prefix(self, keys: Iterable[Hashable]) -> int:
        """How many leading blocks of ``keys`` are cached now (nothing changes)."""
        return _cached_prefix(self._index, self._cache.table, keys)
