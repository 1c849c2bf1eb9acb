"""The streaming cache: the replay's victims request for request, bounded history, string
block ids."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from canopy.apps.cache import Canopy, RadixCache, from_paths, make_policy
from canopy.apps.cache.stream import PlannedCache, StreamingCache, replay_stream
from canopy.apps.cache.traces import iter_mooncake, load_mooncake, resolve
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
