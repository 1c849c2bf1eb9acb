"""Radix cache invariants, LRU against a straightforward SGLang-style implementation, the
offline optimum against exhaustive search."""

from __future__ import annotations

import numba as nb
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from canopy.prefix import POLICIES, Canopy, RadixCache, from_paths, make_policy
from canopy.prefix import kernels as radix
from canopy.prefix.policies import PriorityPolicy

# random traces: paths in a small tree (keys are chains, so prefixes share nodes)
paths_strategy = st.lists(st.lists(st.integers(0, 2), min_size=0, max_size=5),
                          min_size=1, max_size=25)


def _check_invariants(trace, cache) -> None:
    cached = set(cache.cached().tolist())
    assert len(cached) == cache.size <= cache.capacity
    for v in cached:
        p = int(trace.parent[v])
        assert p < 0 or p in cached, "cache is not ancestor-closed"


def _replay_checked(trace, policy, capacity) -> RadixCache:
    cache = RadixCache(trace, policy, capacity)
    for i in range(trace.n_requests):
        before = set(cache.cached().tolist())
        path = trace.path(i).tolist()
        expected = next((j for j, v in enumerate(path) if v not in before), len(path))
        assert cache.step() == expected
        _check_invariants(trace, cache)
        # blocks of the request are cached as far as the capacity allows
        assert set(path[:min(len(path), capacity)]) <= set(cache.cached().tolist())
    return cache


@settings(max_examples=60, deadline=None)
@given(paths=paths_strategy, capacity=st.integers(1, 8), policy=st.sampled_from(sorted(POLICIES)))
def test_ancestor_closed_within_capacity_and_prefix_reuse(paths, capacity, policy):
    _replay_checked(from_paths(paths), make_policy(policy), capacity)


@settings(max_examples=60, deadline=None)
@given(paths=paths_strategy, capacity=st.integers(1, 8), seed=st.integers(0, 3))
def test_canopy_switching_arms_keeps_the_invariants(paths, capacity, seed):
    """Eager switching (no hysteresis, short memory, sampled shadows) re-orders the heap
    often; the cache must stay ancestor-closed, within capacity and prefix-exact."""
    policy = Canopy(z=0.0, min_evidence=0.0, window=2.0, shadow_blocks=3, seed=seed)
    _replay_checked(from_paths(paths), policy, capacity)


@settings(max_examples=40, deadline=None)
@given(paths=paths_strategy, capacity=st.integers(2, 8), seed=st.integers(0, 3),
       candidates=st.integers(1, 3))
def test_canopy_sampled_shadows_keep_the_invariants(paths, capacity, seed, candidates):
    """Shadows of a sample (below full rate) drawing fewer leaves than they hold (the draw,
    not a scan of every leaf): with eager switching the main cache stays ancestor-closed,
    within capacity and prefix-exact, and every shadow's list holds exactly its unpinned
    cached leaves."""
    trace = from_paths(paths)
    policy = Canopy(z=0.0, min_evidence=0.0, window=2.0, seed=seed, candidates=candidates,
                    shadow_blocks=capacity - 1)
    cache = _replay_checked(trace, policy, capacity)
    shadows = cache.tree._shadows
    for a in range(1, len(shadows.kinds)):
        ni, n = shadows.ni[a], shadows.sc[a, radix.HLEN]
        cached = np.flatnonzero(ni[:trace.n_nodes, radix.CACHED])
        parents = set(trace.parent[cached].tolist())
        leaves = {int(v) for v in cached if v not in parents}
        assert set(shadows.hnode[a, :n].tolist()) == leaves
        assert all(ni[shadows.hnode[a, i], radix.SLOT] == i for i in range(n))


def _shadow_reuse(paths, blocks, candidates, seed):
    """Each decayed shadow's total reuse (no discount, no switch) on ``paths``, in shadows of
    ``blocks`` blocks over a sample just under the full rate (at full rate a shadow evicts
    exactly, as the main cache does)."""
    policy = Canopy(window=1e15, z=1e9, seed=seed, candidates=candidates,
                    shadow_blocks=blocks)
    cache = RadixCache(from_paths(paths), policy, blocks + 1)
    cache.run()
    return cache.tree._shadows.stats[1:-1]


def test_canopy_sampled_shadows_reuse_what_heaps_do():
    """Sampled eviction is a near-exact stand-in for the heap on a workload of many leaves
    (popular branches of a wide tree): drawing 32 leaves reuses within 2% of the exact
    lowest key's blocks (means over 5 seeds, each a sample of the requests), drawing one leaf
    (random eviction) at least 5% less; the draw follows the seed."""
    rng = np.random.default_rng(7)
    weights = 1.0 / np.arange(1, 13)
    weights /= weights.sum()
    paths = [rng.choice(12, size=rng.integers(1, 6), p=weights).tolist() for _ in range(3000)]
    exact = np.mean([_shadow_reuse(paths, 48, None, s) for s in range(5)], axis=0)
    sampled = np.mean([_shadow_reuse(paths, 48, 32, s) for s in range(5)], axis=0)
    random = np.mean([_shadow_reuse(paths, 48, 1, s) for s in range(5)], axis=0)
    assert np.all(np.abs(sampled / exact - 1.0) < 0.02), (sampled, exact)
    assert np.all(random < 0.95 * exact), (random, exact)
    assert not np.array_equal(_shadow_reuse(paths, 48, 4, 0), _shadow_reuse(paths, 48, 4, 1))
    assert np.array_equal(_shadow_reuse(paths, 48, 4, 1), _shadow_reuse(paths, 48, 4, 1))


def test_canopy_switches_arms_on_random_traffic():
    rng = np.random.default_rng(1)
    paths = [rng.integers(0, 3, size=rng.integers(1, 7)).tolist() for _ in range(400)]
    cache = _replay_checked(from_paths(paths), Canopy(z=0.0, min_evidence=0.0, window=4.0), 6)
    assert cache.switches > 0


@pytest.mark.parametrize("capacity", [3, 6, 8])
def test_canopy_recency_shadow_riding_on_the_main_cache_changes_nothing(capacity):
    """At full rate the replay's recency shadow is the main cache until the first switch;
    the streaming cache replays it in its own table. With eager switching (the ride ends,
    the main cache's queue and heap are rebuilt back and forth) both reuse the same blocks
    and evict by the same arm at every request."""
    from canopy.prefix.stream import StreamingCache

    rng = np.random.default_rng(capacity)
    paths = [rng.integers(0, 3, size=rng.integers(1, 7)).tolist() for _ in range(400)]
    policy = Canopy(z=0.0, min_evidence=0.0, window=4.0, shadow_blocks=8)
    replay = RadixCache(from_paths(paths), policy, capacity)
    assert replay.tree.rides
    stream = StreamingCache(policy, capacity, history_floor=None)
    for path in paths:
        assert (replay.step(), replay.arm) == (stream.request(path), stream.arm)
    assert replay.switches >= 2  # away from recency and back


def test_canopy_cells_keep_their_history_through_eviction():
    """A cell's count is a statistic of the request stream: block ``a``, used three times,
    evicted, then used again, outranks block ``d`` used twice since; evicting by recency (or
    with counts restarted on re-insertion, as LFU does) would drop ``a`` instead."""
    paths = [["a"], ["a"], ["a"], ["b", "c"], ["a"], ["d"], ["d"], ["e"], ["a"]]
    trace = from_paths(paths)
    memory = Canopy(half_lives=(1e6,), start_half_life=1e6, min_evidence=1e9)
    cache = RadixCache(trace, memory, 2)
    assert cache.run().tolist() == [0, 1, 1, 0, 0, 0, 1, 0, 1]
    assert RadixCache(trace, make_policy("lru"), 2).run()[-1] == 0
    assert RadixCache(trace, make_policy("lfu"), 2).run()[-1] == 0


def _reference_cells(trace, lams, prior):
    """Each node's decayed counts as of its last use in ``trace``, written plainly from their
    definition (paper Section 4, "Serving systems"): a use at clock ``c`` (blocks referenced
    before its request) adds 1, counts decay by ``e^{-lam}`` a referenced block, and a cell
    with less evidence than its parent's share, ``prior * (S(parent) - 1) / children``
    (the parent's count before this use, split over the children seen), starts from it."""
    count = np.zeros((trace.n_nodes, len(lams)))
    last = np.full(trace.n_nodes, -1.0)
    kids = np.zeros(trace.n_nodes)
    clock = 0.0
    for t in range(trace.n_requests):
        for v in trace.path(t).tolist():
            p = int(trace.parent[v])
            own = np.zeros(len(lams)) if last[v] < 0 else count[v] * np.exp(
                -lams * (clock - last[v]))
            if p >= 0:
                kids[p] += last[v] < 0
                above = count[p] * np.exp(-lams * (clock - last[p])) - 1.0
                own = np.maximum(own, prior / kids[p] * above)
            count[v], last[v] = own + 1.0, clock
        clock += len(trace.path(t))
    return count, last


@pytest.mark.parametrize("half_lives", [(0.05,), (0.05, 0.2), (0.05, 0.2, 0.8)])
def test_canopy_cells_are_their_definition(half_lives):
    """The cells the replay keeps (scaled to epochs of ``512 / lam`` references, rescaled
    when a cell is next used) are the decayed counts of the definition at each cell's last
    use, for one arm, two and an odd number; half-lives short enough that the trace spans
    many epochs."""
    rng = np.random.default_rng(5)
    paths = [rng.integers(0, 3, size=rng.integers(1, 7)).tolist() for _ in range(600)]
    trace = from_paths(paths)
    policy = Canopy(half_lives=half_lives, prior=0.7)
    cache = RadixCache(trace, policy, 2)
    cache.run()
    tree = cache.tree
    assert tree.params[radix.PERIOD] * 20 < trace.n_refs
    want, last = _reference_cells(trace, tree.params[radix.LAM0:], 0.7)
    cells = tree._cells[:trace.n_nodes]
    assert np.array_equal(cells[:, radix.CELL_CLOCK], last)
    seen = last >= 0
    got = radix.cell_counts(cells[seen], last[seen], tree.params)  # each at its last use
    np.testing.assert_allclose(got, want[seen], rtol=1e-9)


@pytest.mark.parametrize("half_lives", [(0.05,), (0.05, 0.2, 0.8)])
def test_canopy_cells_of_a_never_used_rest_are_the_general_update_to_the_bit(half_lives):
    """On whole root-first paths (a trace's requests) the update writes a request's
    never-used rest without reading its cells; every cell is the general update's (a host's,
    which may count part of a request) to the bit."""
    rng = np.random.default_rng(11)
    paths = [rng.integers(0, 4, size=rng.integers(1, 9)).tolist() for _ in range(800)]
    trace = from_paths(paths)
    params = Canopy(half_lives=half_lives, prior=0.7).kernel(trace, 4)[1]
    seen = np.zeros(trace.n_nodes, dtype=bool)
    rest = 0  # references after a request's first never-used block
    for t in range(trace.n_requests):
        new = np.flatnonzero(~seen[trace.path(t)])
        rest += len(trace.path(t)) - 1 - new[0] if len(new) else 0
        seen[trace.path(t)] = True
    assert rest > 500
    cells = []
    for whole_paths in (True, False):
        table, sc = radix.cells_table(trace.n_nodes, len(half_lives)), radix.scalars()
        for t in range(trace.n_requests):
            radix._cells_update(trace.offsets[t], trace.offsets[t + 1], trace.nodes,
                                trace.parent, table, sc, params, whole_paths)
        cells.append(table)
    assert np.array_equal(cells[0], cells[1])


def _reference_lru(trace, capacity):
    """SGLang's rule, written plainly: evict the least recently used unpinned leaf."""
    cached: set[int] = set()
    last: dict[int, int] = {}
    reused, states = [], []
    for t in range(trace.n_requests):
        path = trace.path(t).tolist()
        k = next((j for j, v in enumerate(path) if v not in cached), len(path))
        reused.append(k)
        pinned = set(path)
        for v in path[k:]:
            if len(cached) >= capacity:
                parents = {int(trace.parent[u]) for u in cached}
                leaves = [u for u in cached if u not in parents and u not in pinned]
                if not leaves:
                    break
                cached.remove(min(leaves, key=lambda u: last[u]))
            cached.add(v)
        for v in path:
            if v in cached:
                last[v] = t
        states.append(sorted(cached))
    return reused, states


@settings(max_examples=80, deadline=None)
@given(paths=paths_strategy, capacity=st.integers(1, 8))
def test_lru_matches_straightforward_leaf_lru(paths, capacity):
    trace = from_paths(paths)
    reused, states = _reference_lru(trace, capacity)
    cache = RadixCache(trace, make_policy("lru"), capacity)
    for t in range(trace.n_requests):
        assert cache.step() == reused[t]
        assert cache.cached().tolist() == states[t]


def _exhaustive(trace, capacity) -> int:
    """Best total reuse over every sequence of eviction choices (the same cache mechanics)."""
    paths = [trace.path(t).tolist() for t in range(trace.n_requests)]
    parent = trace.parent

    def insert(t, cached, rest):
        if not rest:
            return [cached]
        if len(cached) < capacity:
            return insert(t, cached | {rest[0]}, rest[1:])
        parents = {int(parent[u]) for u in cached}
        leaves = [u for u in cached if u not in parents and u not in paths[t]]
        if not leaves:
            return [cached]
        out = []
        for u in leaves:
            out += insert(t, (cached - {u}) | {rest[0]}, rest[1:])
        return out

    def best(t, cached):
        if t == len(paths):
            return 0
        path = paths[t]
        k = next((j for j, v in enumerate(path) if v not in cached), len(path))
        return k + max(best(t + 1, c) for c in insert(t, frozenset(cached), path[k:]))

    return best(0, frozenset())


@settings(max_examples=60, deadline=None)
@given(paths=st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=3), min_size=1,
                      max_size=7), capacity=st.integers(1, 4))
def test_optimal_matches_exhaustive_search(paths, capacity):
    trace = from_paths(paths)
    total = int(RadixCache(trace, make_policy("optimal"), capacity).run().sum())
    assert total == _exhaustive(trace, capacity)


def test_online_policies_never_beat_optimal_on_real_trace(data_file):
    from canopy.prefix import load_mooncake
    trace = load_mooncake(data_file("mooncake", "conversation_trace.jsonl")).head(3000)
    for capacity in (64, 256, 1024):
        best = RadixCache(trace, make_policy("optimal"), capacity).run().sum()
        for name in ("lru", "lfu", "sieve", "canopy"):
            assert RadixCache(trace, make_policy(name), capacity).run().sum() <= best


def test_capacity_validation():
    trace = from_paths([[1, 2]])
    with pytest.raises(ValueError, match="capacity"):
        RadixCache(trace, make_policy("lru"), 0)
    with pytest.raises(TypeError, match="capacity"):
        RadixCache(trace, make_policy("lru"), 2.5)
    with pytest.raises(ValueError, match="unknown policy"):
        make_policy("fifo")


def test_same_input_same_result():
    rng = np.random.default_rng(0)
    paths = [rng.integers(0, 3, size=rng.integers(1, 6)).tolist() for _ in range(300)]
    trace = from_paths(paths)
    for name in POLICIES:
        a = RadixCache(trace, make_policy(name), 12).run()
        b = RadixCache(trace, make_policy(name), 12).run()
        assert np.array_equal(a, b)


@nb.njit
def _newest_first(v, ni, depth, params):
    return -float(ni[v, radix.LAST])


class _MRU(PriorityPolicy):
    """Most recently used first: a policy of the user's own, defined outside the package."""

    name = "mru"
    key = staticmethod(_newest_first)


def test_a_user_priority_policy_decides_the_victims():
    # a cyclic scan over one block more than the cache holds: LRU always evicts the block
    # needed next and reuses nothing; MRU keeps most of the cycle
    trace = from_paths([[i % 5] for i in range(100)])
    assert RadixCache(trace, make_policy("lru"), 4).run().sum() == 0
    cache = _replay_checked(trace, _MRU(), 4)
    assert cache.reused_.sum() >= 60
    with pytest.raises(TypeError, match="key function"):
        RadixCache(trace, PriorityPolicy(), 4)
