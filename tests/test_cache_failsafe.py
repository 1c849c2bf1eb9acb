"""A policy's failure never reaches its engine (:mod:`canopy.prefix.failsafe`): a policy whose
key raises mid-run (``user_policy:RaisesAfter200``), or whose tables outgrow their node limit,
is dropped once, logged once with its name and counted, and the host serves every request in
its own order from then on: LRU in the llama.cpp cache, SGLang's ``last_access_time`` in its
radix cache (the standin here; SGLang itself in the tests marked ``sglang``), vLLM's release
order in :class:`~canopy.prefix.EvictableBlocks` (vLLM's own ``KVCacheManager``:
``tests/test_cache_vllm_pool.py``)."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

import sglang_standin as standin
from canopy.apps.cache.live import predicted_reuse
from canopy.apps.cache.sglang_replay import drive
from canopy.integrations.sglang import CanopyEviction, install
from canopy.prefix import (
    OnlinePolicy,
    StreamingCache,
    from_paths,
    replay_stream,
)
from canopy.prefix.failsafe import (
    FALLBACK_LOG_ENV,
    FailSafeCache,
    FailSafePolicy,
    PolicyFailure,
    fallbacks,
)
from helpers import real_sglang

standin.STRATEGIES["canopy"] = CanopyEviction
install(standin.RadixCache)

RAISES = "user_policy:RaisesAfter200"
LOGGER = "canopy.prefix.failsafe"


def _chains(requests: int = 300, seed: int = 0) -> list[list[int]]:
    """Zipf-popular prefixes of 2-5 blocks, each with a block of its own (prefix keys)."""
    rng = np.random.default_rng(seed)
    prefixes = [list(range(100 * p, 100 * p + int(rng.integers(2, 6)))) for p in range(24)]
    weights = 1.0 / np.arange(1, 25) ** 1.1
    return [prefixes[rng.choice(24, p=weights / weights.sum())] + [10_000 + i]
            for i in range(requests)]


def _failures(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LOGGER and r.levelno >= logging.ERROR]


def test_the_llama_cpp_cache_serves_every_request_after_its_policy_raises(caplog):
    """llama-cpp-python's cache lookups (no model needed: the engine asks ``cache[tokens]``):
    the first 200 requests reuse what the policy's replay reuses, then LRU serves, the
    failure logged once with the policy's name and counted in :meth:`stats`."""
    PolicyStateCache = pytest.importorskip("canopy.engines.llama_cache").PolicyStateCache
    chains = _chains()
    cache = PolicyStateCache(RAISES, 12 * 16, block_tokens=1, kv_bytes=16)
    before = fallbacks().get("raises-after-200", 0)
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        for tokens in chains:
            with pytest.raises(KeyError):  # no state saved: the engine prefills
                cache[tokens]
    stats = cache.stats()
    assert stats["requests"] == 300 and len(stats["reused_blocks"]) == 300
    assert stats["fallbacks"] == 1 and "ValueError" in stats["fallback_reason"]
    assert fallbacks()["raises-after-200"] == before + 1
    failures = _failures(caplog)
    assert len(failures) == 1 and "raises-after-200" in failures[0].getMessage()
    replay = replay_stream(chains, "user_policy:NewestFirst", 12)
    reused = np.asarray(stats["reused_blocks"])
    first = int(np.argmax(reused != replay))
    assert first > 150 and np.array_equal(reused[:first], replay[:first])
    assert reused[first:].sum() > 0  # LRU reuses after the fallback
    assert stats["policy"] == "raises-after-200" and cache.policy_cache.policy.name == "lru"


def test_the_live_replay_of_a_policy_that_raises_predicts_every_request(caplog):
    """``canopy cache live`` predicts each request's reuse by replaying the policy: there too
    the policy that raises is dropped once and LRU predicts the rest, so the run reports
    (the server's fallbacks with it) instead of dying after serving every request."""
    chains = _chains()
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        reused = predicted_reuse(chains, RAISES, 12)
    assert len(reused) == 300 and reused[200:].sum() > 0
    assert len(_failures(caplog)) == 1
    replay = replay_stream(chains, "user_policy:NewestFirst", 12)
    first = int(np.argmax(reused != replay))
    assert first > 150 and np.array_equal(reused[:first], replay[:first])


def test_a_cache_outgrowing_its_node_limit_falls_back_to_lru():
    chains = [[i, i + 1, i + 2] for i in range(0, 3000, 3)]  # every block new
    cache = FailSafeCache(StreamingCache("canopy", 8, history_floor=None),  # keeps all
                          max_nodes=1500)
    for keys in chains:
        cache.request(keys)
    assert cache.fallbacks == 1 and "1,500" in cache.reason
    assert cache.policy.name == "lru" and cache.n_nodes < 3000


def test_a_policy_outgrowing_its_node_limit_is_dropped_once(tmp_path, monkeypatch):
    """Past ``max_nodes`` the policy is dropped: once, its epoch moved once (the host
    re-keys), every priority equal from then on, the fallback appended to the file that
    ``CANOPY_FALLBACK_LOG`` names (how vLLM's engine process tells ``cache live``)."""
    log = tmp_path / "fallbacks.jsonl"
    monkeypatch.setenv(FALLBACK_LOG_ENV, str(log))
    policy = FailSafePolicy(OnlinePolicy("lfu", 8), max_nodes=100)
    epoch = policy.epoch
    for i in range(0, 600, 3):
        policy.observe([i, i + 1, i + 2])
    assert policy.failed and policy.fallbacks == 1 and policy.epoch == epoch + 1
    assert isinstance(policy.reason, str) and PolicyFailure.__name__ in policy.reason
    assert policy.priorities([0, 1]).tolist() == [0.0, 0.0]
    lines = log.read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["policy"] == "lfu"


def test_a_failed_policys_free_blocks_leave_in_release_order():
    """While the policy serves, the fail-safe keeps nothing: on failure it takes over the
    free blocks the policy held, in release order, less those hits and drops took (handed
    over or not yet), and the blocks released from then on join them at the end."""
    policy = FailSafePolicy(OnlinePolicy("lfu", 16))
    policy.observe([1, 2, 3])
    policy.observe([4, 5])
    policy.release([12, 11, 10], [3, 2, 1])  # a request's blocks, deepest first
    policy.release([21, 20], [5, 4])
    policy.acquire([11])  # a hit, not yet handed to the set
    policy.drop([21])  # vLLM reused the block
    policy.release([12], [3])  # freed again: the newest; free: 10, 20, 12 in that order
    first = policy.pop_victims(1).tolist()
    assert len(first) == 1 and not policy.failed
    policy.acquire([20])  # not yet handed to the set when the policy fails
    policy.drop([10])
    policy.fail(RuntimeError("a bug"))
    assert policy.release([30], [9]).tolist() == [True]  # an unknown key: kept too
    assert policy.pop_victims(8).tolist() == [b for b in [10, 20, 12, 30]
                                              if b not in [*first, 20, 10]]
    assert policy.fallbacks == 1


def test_sglangs_radix_cache_serves_every_request_after_its_policy_raises(caplog):
    trace = from_paths(_chains())
    cache = standin.api.simulated("canopy", {"policy": RAISES, "capacity_blocks": 12},
                                  exact=True)
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        reused = drive(standin.api, cache, trace, 12)
    assert len(reused) == 300 and reused[200:].sum() > 0
    counts = cache.eviction_strategy.policy.counts()
    assert counts["failed"] and counts["fallbacks"] == 1
    assert len(_failures(caplog)) == 1


def test_sglang_after_a_failure_evicts_by_its_own_lru():
    """A policy failing from the first call: SGLang's radix cache reuses, request for
    request, what its own ``lru`` strategy reuses."""
    trace = from_paths(_chains(200, seed=1))
    failing = standin.api.simulated("canopy", {"policy": "user_policy:RaisesAlways",
                                               "capacity_blocks": 12})
    lru = standin.api.simulated("lru")
    assert np.array_equal(drive(standin.api, failing, trace, 12),
                          drive(standin.api, lru, trace, 12))
    assert failing.eviction_strategy.policy.fallbacks == 1


def test_sglang_evicts_in_its_own_order_when_a_victim_is_not_a_leaf_of_its_tree(caplog):
    """Canopy's backend evicts the policy's victims only where SGLang can: the last page of an
    unlocked leaf. Pages named twice (two nodes holding KV page 2) leave the policy's set and
    SGLang's tree at odds, its victim (page 1) heads a node: the policy is dropped, logged
    once and counted, and SGLang frees the tokens asked for in its own order."""
    cache = standin.api.simulated("canopy", {"policy": "lru", "capacity_blocks": 4},
                                  exact=True)
    for tokens in ([1, 2], [3, 2]):
        cache.insert(standin.InsertParams(key=standin.RadixKey(tokens)))
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        freed = cache.evict(standin.EvictParams(num_tokens=1)).num_tokens_evicted
    counts = cache.eviction_strategy.policy.counts()
    assert counts["failed"] and counts["fallbacks"] == 1 and "page 1" in counts["reason"]
    assert len(_failures(caplog)) == 1 and freed == 2  # SGLang's lru: node [1, 2], whole
    assert cache.evictable_size() == 2


@pytest.mark.sglang
def test_on_sglang_itself_a_policy_that_raises_never_reaches_the_radix_cache(caplog):
    """SGLang's own radix cache (Canopy's backend and SGLang's plain ``RadixCache``):
    all 300 requests served, the fallback logged once and counted; failing from the start,
    SGLang's plain cache reuses what its own ``lru`` does."""
    api = real_sglang()
    trace = from_paths(_chains())
    for exact in (True, False):
        cache = api.simulated("canopy", {"policy": RAISES, "capacity_blocks": 12},
                              exact=exact)
        caplog.clear()
        with caplog.at_level(logging.ERROR, logger=LOGGER):
            reused = drive(api, cache, trace, 12)
        assert len(reused) == 300 and reused[200:].sum() > 0
        assert cache.eviction_strategy.policy.fallbacks == 1
        assert len(_failures(caplog)) == 1
    failing = api.simulated("canopy", {"policy": "user_policy:RaisesAlways",
                                       "capacity_blocks": 12})
    assert np.array_equal(drive(api, failing, trace, 12),
                          drive(api, api.simulated("lru"), trace, 12))


def test_vllms_node_limit_comes_from_the_environment(monkeypatch):
    from canopy.integrations.vllm import MAX_NODES_ENV, _make_order
    from canopy.prefix.policies import make_policy

    monkeypatch.setenv(MAX_NODES_ENV, "50")
    order = _make_order(make_policy("lfu"), 8)
    assert isinstance(order, FailSafePolicy) and order.max_nodes == 50
    monkeypatch.setenv(MAX_NODES_ENV, "lots")
    with pytest.raises(ValueError, match=MAX_NODES_ENV):
        _make_order(make_policy("lfu"), 8)


@pytest.mark.sglang
def test_on_sglang_a_policy_failing_while_a_node_is_ranked_ranks_it_by_sglangs_lru():
    """The node whose ranking made the policy fail is ranked as every later one is (SGLang's
    ``last_access_time``), not by the guard's placeholder, which evicted it first."""
    from canopy.apps.cache.sglang_replay import serve_request

    api = real_sglang()
    cache = api.simulated("canopy", {"policy": "user_policy:RaisesAlways",
                                     "capacity_blocks": 12})
    for path in ([1, 2, 3], [1, 4], [5, 6]):
        serve_request(api, cache, path, 12)
    strategy = cache.eviction_strategy
    leaf = cache.root_node.children[5] if 5 in cache.root_node.children else \
        next(iter(cache.root_node.children.values()))
    assert not strategy.policy.failed
    assert strategy.get_priority(leaf) == leaf.last_access_time
    assert strategy.policy.failed and strategy.policy.fallbacks == 1
