"""The streaming cache: the replay's victims request for request, bounded history, string
block ids."""

from __future__ import annotations

import json

import numba as nb
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from canopy.prefix import Canopy, RadixCache, from_paths, make_policy
from canopy.prefix import kernels as radix
from canopy.prefix.policies import PriorityPolicy
from canopy.prefix.stream import OnlinePolicy, PlannedCache, StreamingCache, replay_stream
from canopy.prefix.traces import iter_mooncake, load_mooncake, resolve
from conftest import require_data

ONLINE = ("lru", "lfu", "sieve", "canopy")


def _conversations(rng: np.random.Generator, n: int, tag: object = 0) -> list[list]:
    """Chat-like traffic: a few system prompts, conversations that grow and come back."""
    talks: list[list] = []
    out = []
    for _ in range(n):
        if talks and rng.random() < 0.7:
            talk = talks[int(rng.zipf(1.3)) % len(talks)]
            talk.extend(rng.integers(0, 10**9, size=int(rng.integers(1, 4))).tolist())
        else:
            words = rng.integers(0, 10**9, size=int(rng.integers(1, 4))).tolist()
            talk = [("system", int(rng.integers(0, 4))), *words]
            talks.append(talk)
        out.append([(tag, k) for k in talk])
    return out


def _replayed(paths: list[list], policy, capacity: int) -> np.ndarray:
    trace = from_paths(paths)
    return RadixCache(trace, policy, capacity).run()


@settings(max_examples=40, deadline=None)
@given(paths=st.lists(st.lists(st.integers(0, 2), max_size=5), min_size=1, max_size=30),
       capacity=st.integers(1, 8), policy=st.sampled_from(ONLINE))
def test_streaming_equals_the_replay_on_random_traces(paths, capacity, policy):
    assert np.array_equal(replay_stream(paths, policy, capacity, history_floor=None),
                          _replayed(paths, make_policy(policy), capacity))


@pytest.mark.parametrize("policy", ONLINE)
def test_forgetting_bounds_the_tables_and_keeps_the_reuse(policy):
    """Forgotten nodes are uncached; lru, lfu and sieve keep no history, so their victims are
    the full replay's. canopy's forgotten cells had decayed below the floor: when one comes
    back it restarts from its parent's share, which moves a few victims (here 4 of 6,000
    requests reuse differently, -0.05% blocks) while the node tables stop growing."""
    paths = _conversations(np.random.default_rng(0), 6000)
    full = _replayed(paths, make_policy(policy), 64)
    cache = StreamingCache(policy, 64)
    reused = np.array([cache.request(p) for p in paths])
    if policy == "canopy":
        assert np.mean(reused != full) < 0.005
        assert reused.mean() == pytest.approx(full.mean(), rel=0.005)
    else:
        assert np.array_equal(reused, full)
    assert cache.forgotten > 0
    assert cache.n_nodes < from_paths(paths).n_nodes / 3


def test_canopy_switching_and_forgetting_keeps_the_invariants():
    rng = np.random.default_rng(3)
    policy = Canopy(z=0.0, min_evidence=0.0, window=4.0, shadow_blocks=8)
    cache = StreamingCache(policy, 12, history_floor=0.9)
    for path in _conversations(rng, 3000):
        expected = cache.cached_prefix(path)
        assert cache.request(path) == expected
        assert cache.size <= 12
    assert cache.forgotten > 0


def test_memory_is_bounded_on_a_stream_of_disjoint_copies():
    """Ten disjoint copies of a workload (each one a popularity shift): the node tables stop
    growing after the second copy, and each copy reuses as much as the first one after a
    shift; without a floor they grow with every copy."""
    base = _conversations(np.random.default_rng(5), 3000)
    cache = StreamingCache("canopy", 256)
    per_copy, peaks = [], []
    for copy in range(10):
        peak, reused = 0, []
        for path in base:
            reused.append(cache.request([(copy, k) for k in path]))
            peak = max(peak, cache.n_nodes)
        per_copy.append(np.mean(reused))
        peaks.append(peak)
    assert max(peaks[2:]) <= 1.1 * max(peaks[:2])
    assert np.allclose(per_copy[2:], per_copy[1], rtol=0.02)
    unbounded = StreamingCache("canopy", 256, history_floor=None)
    for copy in range(4):
        for path in base:
            unbounded.request([(copy, k) for k in path])
    assert unbounded.n_nodes > 1.5 * max(peaks)


def test_streaming_equals_the_replay_on_the_conversation_trace():
    require_data("mooncake", "conversation_trace.jsonl")
    trace = resolve("conversation").head(3000)
    paths = [trace.path(i).tolist() for i in range(trace.n_requests)]
    for policy in ONLINE:
        for capacity in (64, 1024):
            expected = RadixCache(trace, make_policy(policy), capacity).run()
            assert np.array_equal(replay_stream(paths, policy, capacity, history_floor=None),
                                  expected), policy


def test_forgetting_keeps_canopys_shadow_sample_on_the_conversation_trace():
    """canopy's shadows sample requests by a hash of a node's stable id; forgetting renumbers
    the node tables, and a sample keyed by the table index changed at every compaction (at
    1,024 blocks the whole trace then reused 1.42 blocks a request against the replay's
    1.89, leaving recency thousands of requests late). With the stable id, bounded history
    keeps the replay's reuse."""
    require_data("mooncake", "conversation_trace.jsonl")
    trace = resolve("conversation")
    full = RadixCache(trace, make_policy("canopy"), 1024).run()
    cache = StreamingCache("canopy", 1024)
    reused = np.array([cache.request(trace.path(i).tolist()) for i in range(trace.n_requests)])
    assert cache.forgotten > 0 and cache.n_nodes < trace.n_nodes / 3
    assert reused.mean() == pytest.approx(full.mean(), rel=0.01)


def test_bad_configuration_is_named():
    with pytest.raises(ValueError, match="reads the future"):
        StreamingCache("optimal", 8)
    with pytest.raises(ValueError, match="history_floor"):
        StreamingCache("lru", 8, history_floor=1.5)
    with pytest.raises(ValueError, match="capacity"):
        StreamingCache("lru", 0)


def test_mooncake_block_ids_may_be_strings(tmp_path):
    rows = [{"timestamp": 0, "input_length": 1024, "hash_ids": ["a1", "b2"]},
            {"timestamp": 1, "input_length": 1536, "hash_ids": ["a1", "b2", "c3"]},
            {"timestamp": 2, "input_length": 512, "hash_ids": [7]}]
    file = tmp_path / "gateway.jsonl"
    file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    trace = load_mooncake(file)
    assert trace.n_requests == 3 and trace.n_nodes == 4
    assert [h for _, _, h in iter_mooncake(file)][1] == ["a1", "b2", "c3"]
    assert RadixCache(trace, make_policy("lru"), 8).run().tolist() == [0, 2, 0]
    file.write_text(json.dumps({"timestamp": 0, "input_length": 1, "hash_ids": [1.5]}) + "\n")
    with pytest.raises(ValueError, match=r"gateway.jsonl:1: hash_ids must be a list of "
                                         r"integers >= 0 or of non-empty strings"):
        load_mooncake(file)


@pytest.mark.parametrize("policy", [*ONLINE, "optimal"])
def test_a_planned_cache_serves_the_replay_one_request_at_a_time(policy):
    paths = _conversations(np.random.default_rng(2), 800)
    cache = PlannedCache(policy, 32, paths)
    reused = [cache.request(p) for p in paths]
    assert reused == _replayed(paths, make_policy(policy), 32).tolist()
    assert cache.cached_prefix(paths[-1]) == len(paths[-1]) and cache.size <= 32
    with pytest.raises(ValueError, match="does not follow the plan"):
        cache.request(paths[0])


class _Host:
    """An engine's own cache that evicts by an :class:`OnlinePolicy`: the replay's rules
    (a request pins its blocks, the victim is an unpinned leaf, the cache stays
    ancestor-closed), written plainly over the host's block set. ``sieve`` walks a hand over
    the blocks in insertion order; the others evict the lowest priority."""

    def __init__(self, online: OnlinePolicy, capacity: int, *, report: bool = True) -> None:
        self.online, self.capacity, self.report = online, capacity, report
        self.cached: set = set()
        self.parent: dict = {}
        self.children: dict = {}
        self.hand = None  # sieve: priority of the block the hand rests on

    def _victim(self, pinned: set):
        def evictable(u):
            return self.children[u] == 0 and u not in pinned

        if self.online.policy.name != "sieve":
            leaves = [u for u in self.cached if evictable(u)]
            if not leaves:
                return None
            keys = self.online.priorities(leaves)
            return leaves[int(np.argmin(keys))]
        order = sorted(self.cached, key=self.online.priority)
        keys = [self.online.priority(u) for u in order]
        start = next((i for i, k in enumerate(keys) if self.hand is not None and k >= self.hand),
                     0)
        for step in range(2 * len(order)):
            i = (start + step) % len(order)
            u = order[i]
            if evictable(u) and not self.online.visited(u):
                self.hand = keys[i + 1] if i + 1 < len(order) else None
                return u
            self.online.clear_visited(u)
        return None

    def request(self, path: list) -> int:
        hit = next((j for j, v in enumerate(path) if v not in self.cached), len(path))
        self.online.observe(path)
        pinned = set(path)
        kept = hit
        for j in range(hit, len(path)):
            if len(self.cached) >= self.capacity:
                u = self._victim(pinned)
                if u is None:
                    break
                self.cached.remove(u)
                if self.parent[u] is not None:
                    self.children[self.parent[u]] -= 1
                if self.report:
                    self.online.evicted(u)
            v = path[j]
            self.cached.add(v)
            self.parent[v] = path[j - 1] if j else None
            self.children[v] = 0
            if j:
                self.children[path[j - 1]] += 1
            kept = j + 1
        for v in path[kept:]:
            if self.report:
                self.online.evicted(v)
        return hit


def _host_replay(trace, policy, capacity, **kw) -> np.ndarray:
    host = _Host(OnlinePolicy(policy, capacity), capacity, **kw)
    return np.array([host.request(trace.path(i).tolist()) for i in range(trace.n_requests)])


@pytest.mark.parametrize("policy", ["lru", "lfu", "sieve"])
def test_a_host_evicting_by_online_priority_reuses_the_replays_blocks(policy):
    """Node ids name a block with its prefix, as an engine's block hashes do."""
    trace = from_paths(_conversations(np.random.default_rng(4), 1500))
    for capacity in (8, 48):
        expected = RadixCache(trace, make_policy(policy), capacity).run()
        assert np.array_equal(_host_replay(trace, policy, capacity), expected), capacity


@settings(max_examples=40, deadline=None)
@given(paths=st.lists(st.lists(st.integers(0, 2), max_size=5), min_size=1, max_size=30),
       capacity=st.integers(1, 8), policy=st.sampled_from(["lru", "lfu", "sieve"]))
def test_online_priority_equals_the_replay_on_random_traces(paths, capacity, policy):
    trace = from_paths(paths)
    assert np.array_equal(_host_replay(trace, policy, capacity),
                          RadixCache(trace, make_policy(policy), capacity).run())


def test_a_host_evicting_by_online_canopy_reuses_the_replays_blocks():
    """The online canopy policy replays a request in its shadows when the next one arrives,
    as the replay does after serving it, so its arm switches at the same request: a host
    evicting by its priorities reuses the replay's blocks request for request while the
    forgotten history is negligible (a floor of 1e-12 still forgets nodes), and within 0.1%
    at the default floor (forgotten cells restart from their parent's share)."""
    trace = from_paths(_conversations(np.random.default_rng(6), 4000))
    for capacity in (16, 64):
        replayed = RadixCache(trace, make_policy("canopy"), capacity).run()
        online = OnlinePolicy("canopy", capacity, history_floor=1e-12)
        host = _Host(online, capacity)
        exact = np.array([host.request(trace.path(i).tolist())
                          for i in range(trace.n_requests)])
        assert online.forgotten > 0 and online.epoch > 0
        assert np.array_equal(exact, replayed), capacity
        default = _host_replay(trace, "canopy", capacity)
        assert np.mean(default != replayed) <= 0.001
        assert default.sum() == pytest.approx(replayed.sum(), rel=0.001)


def test_the_replays_decayed_heap_keeps_the_logarithms_order_across_the_cells_epochs():
    """The replay's main cache keys a decayed arm by its count in one epoch's scale (no
    logarithm a key; the heap rescaled when the cells' epoch begins), the host's priorities
    by the logarithm: over six epochs of the cells, with many leaves cached across each
    change (three levels of a skewed tree), a host evicting by the priorities reuses the
    replay's blocks request for request (a heap left unrescaled differs in ~9% of them)."""
    rng = np.random.default_rng(5)
    paths = []
    for _ in range(12_000):
        r, a, b = int(rng.integers(0, 3)), int(rng.zipf(1.5)) % 40, int(rng.integers(0, 6))
        paths.append([(r,), (r, a), (r, a, b)])
    trace = from_paths(paths)
    policy, capacity = Canopy(half_lives=(0.5,), start_half_life=0.5, z=1e9), 16
    assert trace.n_refs > 6 * policy.kernel(trace, capacity)[1][radix.PERIOD]
    replayed = RadixCache(trace, policy, capacity).run()
    host = _Host(OnlinePolicy(policy, capacity, history_floor=1e-12), capacity)
    hosted = np.array([host.request(trace.path(i).tolist()) for i in range(trace.n_requests)])
    assert np.array_equal(hosted, replayed)


def test_online_canopy_bumps_the_epoch_when_it_switches_arm():
    online = OnlinePolicy(Canopy(z=0.0, min_evidence=0.0, window=4.0, shadow_blocks=8), 12)
    host = _Host(online, 12)
    epochs = {online.epoch}
    arms = set()
    for path in _conversations(np.random.default_rng(3), 2000):
        host.request(path)
        epochs.add(online.epoch)
        arms.add(online.arm)
    assert len(epochs) > 2 and len(arms) > 1
    assert online.size == len(host.cached)


@pytest.mark.parametrize("report", [True, False])
def test_online_memory_is_bounded_on_a_long_stream(report):
    """Twenty disjoint copies of a workload: the policy's node tables stop growing, and stay
    bounded even when the host never reports its evictions."""
    base = _conversations(np.random.default_rng(7), 1500)
    online = OnlinePolicy("canopy", 64)
    host = _Host(online, 64, report=report)
    peaks = []
    for copy in range(20):
        peak = 0
        for path in base:
            host.request([(copy, k) for k in path])
            peak = max(peak, online.n_nodes)
        peaks.append(peak)
    assert online.forgotten > 0
    assert max(peaks[4:]) <= 1.1 * max(peaks[:4])
    assert max(peaks) < 20 * from_paths(base).n_nodes / 4


def test_online_keys_may_be_bytes_and_unknown_keys_evict_first():
    online = OnlinePolicy("lfu", 4)
    online.observe([b"a", b"ab"])
    online.observe([b"a", b"ab", b"abc"])
    assert online.priority(b"ab") > online.priority(b"abc") > online.priority(b"zz")
    assert online.priority(b"zz") == -np.inf and online.size == 3
    online.evicted(b"abc")
    online.evicted(b"zz")
    assert online.size == 2 and online.epoch == 0
    with pytest.raises(ValueError, match="reads the future"):
        OnlinePolicy("optimal", 8)
    with pytest.raises(ValueError, match="unknown policy"):
        OnlinePolicy("fifo", 8)


def test_online_sieve_forgets_while_a_hot_block_is_hit_more_often_than_nodes_are_held():
    # a hit count larger than the table must not be renumbered as if it linked nodes
    online = OnlinePolicy("sieve", 8, history_floor=0.5)
    for _ in range(5000):
        online.observe(["root"])
    for i in range(6000):
        keys = ["root", f"{i}:a", f"{i}:b"]
        online.observe(keys)
        online.evicted(keys[1])
        online.evicted(keys[2])
    assert online.forgotten > 0 and online.n_nodes < 3000  # of 12,001 keys seen
    assert online.visited("root")
    assert online.priority("root") < online.priority("5999:a")  # inserted first


@nb.njit
def _least_used(v, ni, depth, params):
    return ni[v, radix.HITS] * params[0] + ni[v, radix.LAST]


class _UserLFU(PriorityPolicy):
    """The built-in ``lfu``'s order written as a user's own policy class."""

    name = "user-lfu"
    key = staticmethod(_least_used)

    def params(self, trace, capacity: int) -> np.ndarray:
        return np.array([trace.n_requests + 1.0])


def test_a_user_policy_runs_in_the_replay_the_streaming_cache_and_online():
    paths = _conversations(np.random.default_rng(3), 400)
    for capacity in (8, 32):
        want = _replayed(paths, make_policy("lfu"), capacity)
        assert want.sum() > 0 and not np.array_equal(
            want, _replayed(paths, make_policy("lru"), capacity))
        np.testing.assert_array_equal(_replayed(paths, _UserLFU(), capacity), want)
        stream = StreamingCache(_UserLFU(), capacity, history_floor=None)
        np.testing.assert_array_equal([stream.request(p) for p in paths], want)
    mine, builtin = OnlinePolicy(_UserLFU(), 32), OnlinePolicy("lfu", 32)
    keys = [tuple(p[:i + 1]) for p in paths[:200] for i in range(len(p))]
    for p in paths[:200]:
        for online in (mine, builtin):
            online.observe([tuple(p[:i + 1]) for i in range(len(p))])
    np.testing.assert_array_equal(mine.priorities(keys), builtin.priorities(keys))


def test_the_old_module_paths_still_import_and_renamed_names_warn():
    """The cache's core moved to ``canopy.prefix``: the old paths forward to it, and the two
    names that changed (the evictable set's protocol, the SGLang replay's module) warn."""
    import importlib
    import sys

    from canopy.apps.cache import radix as old_radix
    from canopy.apps.cache.stream import StreamingCache as OldStreamingCache
    from canopy.prefix import EvictionOrder

    assert OldStreamingCache is StreamingCache and old_radix.CACHED == radix.CACHED
    with pytest.warns(DeprecationWarning, match="EvictionOrder"):
        from canopy.apps.cache.evictable import PriorityPolicy as OldOrder
    assert OldOrder is EvictionOrder
    sys.modules.pop("canopy.apps.cache.sglang", None)
    with pytest.warns(DeprecationWarning, match="sglang_replay"):
        old = importlib.import_module("canopy.apps.cache.sglang")
    assert old.drive is importlib.import_module("canopy.apps.cache.sglang_replay").drive
