"""The radix block cache fed one request at a time, for servers (paper Section 4, "Serving
systems").

:class:`~canopy.prefix.RadixCache` replays a whole :class:`~canopy.prefix.traces.Trace` whose
block universe is known in advance. A server meets its blocks one request at a time, keyed by
whatever its engine hashes (token tuples, prefix-hash strings, integers), and runs for ever.
:class:`StreamingCache` runs the same per-request kernels (so the same victims, request for
request: the tests compare it with :meth:`RadixCache.run`) on a
:class:`~canopy.prefix.blocks.BlockTree` that grows as new blocks appear, and bounds it: once
it holds twice what was kept last time, nodes that no cache holds and whose decayed counts
(``canopy``'s cells) have fallen below ``history_floor`` are forgotten, with the subtrees
below them. What remains is O(capacity): the cached blocks of the main cache and the shadows,
and the cells referenced within about ``log2(1 / history_floor)`` half-lives of traffic.

The offline optimum reads the future and has no streaming form; when the requests are known
in advance (a measurement that replays a planned workload), :class:`PlannedCache` serves them
one at a time with the same interface, so every policy, the optimum included, can run live.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence

import numpy as np

from canopy.prefix.blocks import BlockTree
from canopy.prefix.hashindex import as_keys
from canopy.prefix.policies import EvictionPolicy, make_policy
from canopy.prefix.radix import RadixCache
from canopy.prefix.traces import from_paths
from canopy.validation import check_count, check_open_unit

__all__ = ["OnlinePolicy", "PlannedCache", "StreamingCache", "replay_stream"]


class _Host:
    """What :class:`StreamingCache` and :class:`OnlinePolicy` share: the policy, checked,
    and the :class:`~canopy.prefix.blocks.BlockTree` that holds the state, forgetting after
    a request once it is full. ``prefix_keys``: a key names its whole prefix (a prefix hash),
    so it indexes a node by itself; otherwise by its parent node and key. ``serves``: the
    kernels serve the requests (a cache of Canopy's own) rather than account an engine's."""

    def __init__(self, policy: EvictionPolicy | str, capacity: int,
                 history_floor: float | None, *, prefix_keys: bool, serves: bool) -> None:
        policy = make_policy(policy) if isinstance(policy, str) else policy
        if not isinstance(policy, EvictionPolicy):
            raise TypeError(f"policy must be a policy name or an EvictionPolicy, "
                            f"got {type(policy).__name__}")
        if policy.offline:
            raise ValueError(f"policy {policy.name!r} reads the future; replay it on a whole "
                             "trace (canopy.prefix.RadixCache)")
        self.policy = policy
        self.capacity = check_count(capacity, "capacity")
        self.history_floor = check_open_unit(history_floor, "history_floor", allow_none=True)
        self.tree = BlockTree(policy, self.capacity, prefix_keys=prefix_keys, serves=serves,
                              history_floor=self.history_floor)
        self.requests = 0

    @property
    def n_nodes(self) -> int:
        """Nodes of the prefix tree held now (cached blocks and remembered history)."""
        return self.tree.n

    @property
    def forgotten(self) -> int:
        """Nodes forgotten so far."""
        return self.tree.forgotten

    @property
    def arm(self) -> int:
        """``canopy``: the arm whose priority evicts now (index into ``policy.arm_names``)."""
        return self.tree.arm

    @property
    def size(self) -> int:
        """Blocks cached now (an engine's: as observed and reported)."""
        return self.tree.size

    def _after_request(self) -> None:
        self.requests += 1
        if self.tree.full():
            self._forget()

    def _forget(self) -> None:
        self.tree.forget()


class StreamingCache(_Host):
    """A radix block cache of ``capacity`` blocks under ``policy`` (a name or an online
    :class:`~canopy.prefix.policies.EvictionPolicy`), fed one request at a time.

    :meth:`request` takes a request's block keys, root first (any hashables; a key means its
    whole prefix, as in a prefix-hash chain), and returns how many leading blocks were cached.
    ``history_floor=None`` keeps every node ever seen (exactly :class:`RadixCache`).
    """

    def __init__(self, policy: EvictionPolicy | str, capacity: int, *,
                 history_floor: float | None = 0.5) -> None:
        super().__init__(policy, capacity, history_floor, prefix_keys=False, serves=True)

    def request(self, keys: Iterable[Hashable]) -> int:
        """Serve one request (its block keys, root first): reuse the longest cached prefix,
        insert the rest, evict by the policy. Returns the number of blocks reused."""
        reused = self.tree.serve(self.requests, self.tree.chain(keys))
        self._after_request()
        return reused

    def cached_prefix(self, keys: Iterable[Hashable]) -> int:
        """How many leading blocks of ``keys`` are cached now (nothing changes)."""
        return self.tree.cached_prefix(keys)


class OnlinePolicy(_Host):
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
    * a paged engine hands its free blocks to the policy's evictable set (:meth:`release`,
      :meth:`acquire`, :meth:`drop`) and takes its victims from :meth:`pop_victims`, which
      evicts them (:class:`~canopy.prefix.evictable.EvictableBlocks` does this for a host);
    * or evict by :meth:`priority` (lower first). Priorities compare across blocks until
      :attr:`epoch` changes (``canopy`` switching arm re-orders them): then re-key.
    * ``sieve`` (:attr:`hand`) is not a priority order but a hand over insertion order:
      :meth:`priority` is the insertion order, and the hand walks from the oldest block (from
      the block after its last victim, wrapping), calling :meth:`clear_visited` on each block
      it passes whose :meth:`visited` is set, and evicts the first unvisited evictable block.

    Memory is bounded whatever the run's length: blocks the engine holds (as reported), the
    shadows' blocks, and history whose decayed counts are above ``history_floor`` (see
    :class:`StreamingCache`); should a host miss evictions, at a compaction blocks beyond
    ``capacity`` plus the longest request count as evicted, lowest priority first.
    """

    def __init__(self, policy: EvictionPolicy | str, capacity: int, *,
                 history_floor: float = 0.5) -> None:
        if history_floor is None:
            raise ValueError("an online policy forgets; history_floor must be in (0, 1)")
        super().__init__(policy, capacity, history_floor, prefix_keys=True, serves=False)
        self._seq = 0
        # the request the shadows replay next: its keys, index, nodes and when they were named
        self._pending: tuple[np.ndarray, int, np.ndarray, int] | None = None

    @property
    def hand(self) -> bool:
        """Whether the policy evicts by a hand over insertion order (``sieve``), through
        :meth:`visited` and :meth:`clear_visited`, rather than by priority alone."""
        return self.policy.hand

    @property
    def epoch(self) -> int:
        """Bumps when existing priorities are re-ordered (``canopy`` switched arm)."""
        return self.tree.switches

    def observe(self, keys: Sequence[Hashable] | np.ndarray, *, start: int = 0) -> None:
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
        chain = as_keys(keys)  # once: the pending request keeps them
        t = self.requests - 1 if start and self.requests else self.requests  # grew: its own
        path, self._seq = self.tree.observe(t, chain, self._seq, start)
        if not self.tree.has_shadows:
            if not start:
                self._after_request()
            return
        if not start:
            self._pending = (chain, self.requests, path, self.tree.forgotten)
            self._after_request()
        elif self._pending is not None and self._grows(self._pending[0], chain):
            self._pending = (chain, self._pending[1], path, self.tree.forgotten)

    @staticmethod
    def _grows(seen: np.ndarray, keys: np.ndarray) -> bool:
        """Whether ``keys`` extends ``seen`` (keys name their prefixes: equal last keys mean
        equal chains)."""
        return 0 < len(seen) < len(keys) and bool(keys[len(seen) - 1] == seen[-1])

    def _replay_pending(self) -> None:
        """Replay the last observed request in the shadows (``canopy``)."""
        if self._pending is None:
            return
        keys, t, path, forgotten = self._pending
        self._pending = None
        if forgotten != self.tree.forgotten:  # renumbered since: the nodes again
            path = self.tree.chain(keys)
        self.tree.replay_shadows(t, path)

    def evicted(self, key: Hashable) -> None:
        """The engine dropped block ``key`` (unknown keys are ignored)."""
        v = self.tree.node(key)
        if v >= 0:
            self.tree.evict(v)

    def priority(self, key: Hashable) -> float:
        """Eviction priority of block ``key``, lower evicts first; ``-inf`` for a key never
        observed (or long forgotten): nothing speaks for keeping it."""
        return float(self.priorities([key])[0])

    def priorities(self, keys: Sequence[Hashable]) -> np.ndarray:
        """:meth:`priority` of many keys at once (one compiled call)."""
        nodes = self.tree.nodes(keys)
        known = nodes >= 0
        out = np.full(len(nodes), -np.inf)
        out[known] = self.tree.rank(nodes[known])
        return out

    def visited(self, key: Hashable) -> bool:
        """``sieve``: whether block ``key`` was reused since the hand last passed it."""
        v = self.tree.node(key)
        return v >= 0 and self.tree.visited(v)

    def clear_visited(self, key: Hashable) -> None:
        """``sieve``: the hand passes block ``key``."""
        v = self.tree.node(key)
        if v >= 0:
            self.tree.clear_visited(v)

    # ------------------------------------------------------------ the evictable set
    def release(self, blocks: Sequence[int] | np.ndarray,
                keys: Sequence[Hashable] | np.ndarray) -> np.ndarray:
        """The engine freed ``blocks[i]`` (ids >= 0) caching ``keys[i]``, in that order: they
        may be evicted from now on (:meth:`pop_victims`). Returns which keys the policy knows
        (observed, not forgotten); a block of an unknown key is forgotten here, for its host
        to evict first."""
        return self.tree.release(np.asarray(blocks, dtype=np.int64), keys)

    def acquire(self, blocks: Sequence[int] | np.ndarray) -> None:
        """The engine's hits took ``blocks`` back: pinned, not evictable until released."""
        self.tree.acquire(np.asarray(blocks, dtype=np.int64))

    def drop(self, blocks: Sequence[int]) -> None:
        """The engine reused ``blocks`` or dropped their keys: forgotten (not evicted)."""
        self.tree.drop(np.asarray(blocks, dtype=np.int64))

    def free_blocks(self) -> np.ndarray:
        """The free blocks the policy holds, in release order (nothing changes): what a host
        evicts in its own order should the policy be dropped."""
        return self.tree.free_blocks()

    def pop_victims(self, n: int) -> np.ndarray:
        """Up to ``n`` free blocks to evict, in the policy's order among free leaves (blocks
        no held block hangs under: the replay's victims), or by SIEVE's hand (:attr:`hand`);
        each is forgotten and its key evicted. Fewer when fewer are free."""
        return self.tree.pop_victims(n)

    def _forget(self) -> None:
        self.tree.hold_at_most(self.capacity + self.tree.longest)
        self.tree.forget()


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
        self._cache = RadixCache(trace, self.policy, capacity)
        keys: list[Hashable] = [None] * trace.n_nodes
        for i, request in enumerate(self._plan):
            for key, v in zip(request, trace.path(i).tolist(), strict=True):
                keys[v] = key
        self._cache.tree.name_nodes(keys)

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
        return self._cache.tree.cached_prefix(keys)
