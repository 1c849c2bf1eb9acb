"""Replay speed in block references per second (targets: lru >= 2e6, canopy >= 1e6 on 2 cores).

Run: ``CANOPY_DATA_DIR=... pytest benchmarks/test_cache_bench.py --benchmark-enable``; the
rate is in each benchmark's ``extra_info['block_refs_per_s']`` (from the median round).
"""

from __future__ import annotations

import pytest

from canopy import data
from canopy.apps.cache import RadixCache, load_mooncake, make_policy


def _conversation():
    try:
        return load_mooncake(data.path("mooncake", "conversation_trace.jsonl", download=False))
    except data.DataNotFound as missing:
        pytest.skip(str(missing))


@pytest.mark.parametrize("policy", ["lru", "lfu", "sieve", "canopy", "optimal"])
def test_replay_speed_conversation_1024(benchmark, policy):
    trace = _conversation()
    RadixCache(trace, make_policy(policy), 1024).run()  # compile / load the kernel

    def setup():
        return (RadixCache(trace, make_policy(policy), 1024),), {}

    benchmark.pedantic(lambda cache: cache.run(), setup=setup, rounds=5)
    benchmark.extra_info["block_refs_per_s"] = trace.n_refs / benchmark.stats.stats.median
    assert benchmark.stats.stats.median > 0
