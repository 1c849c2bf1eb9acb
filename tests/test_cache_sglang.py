"""Engine parity with SGLang's radix cache: its lru/lfu equal Canopy's when nodes are blocks,
whole-node eviction explains the rest, and Canopy's cells plug into its strategy slot.

SGLang needs its CUDA stack to install, so the tests drive :mod:`sglang_standin` (SGLang's
interface and eviction behaviour); the last test runs on SGLang itself where it imports."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sglang_standin as standin
from canopy.apps.cache import RadixCache, from_paths, make_policy
from canopy.apps.cache.sglang import CanopyStrategy, drive
from canopy.apps.cache.traces import resolve
from conftest import require_data

paths_strategy = st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=6),
                          min_size=1, max_size=30)


def _sglang(trace, policy: str, capacity: int, *, per_block: bool, api=standin.api):
    return drive(api, api.simulated(policy), trace, capacity, per_block=per_block)


@settings(max_examples=60, deadline=None)
@given(paths=paths_strategy, capacity=st.integers(1, 8), policy=st.sampled_from(["lru",
                                                                                  "lfu"]))
def test_block_nodes_give_exactly_canopys_lru_and_lfu(paths, capacity, policy):
    trace = from_paths(paths)
    assert np.array_equal(_sglang(trace, policy, capacity, per_block=True),
                          RadixCache(trace, make_policy(policy), capacity).run())


@pytest.mark.parametrize("name", ["conversation", "synthetic"])
def test_parity_on_the_mooncake_traces(name):
    """Nodes of one block: every request reuses what Canopy's replay says (1,000 requests,
    64-1,024 blocks). One node a request (SGLang inserts a finished request at once): its
    whole-node eviction frees more than needed now and then, a handful of requests differ."""
    require_data("mooncake", f"{name}_trace.jsonl")
    trace = resolve(name).head(1000)
    for capacity in (64, 256, 1024):
        for policy in ("lru", "lfu"):
            ours = RadixCache(trace, make_policy(policy), capacity).run()
            assert np.array_equal(_sglang(trace, policy, capacity, per_block=True), ours)
            whole = _sglang(trace, policy, capacity, per_block=False)
            assert np.sum(whole != ours) <= 10, (capacity, policy)


def test_whole_node_eviction_frees_the_whole_run():
    """Two blocks inserted at once form one node; needing one block back evicts both."""
    trace = from_paths([[1, 2], [3], [1, 2]])
    assert _sglang(trace, "lru", 2, per_block=False).tolist() == [0, 0, 0]
    assert RadixCache(trace, make_policy("lru"), 2).run().tolist() == [0, 0, 1]
    assert _sglang(trace, "lru", 2, per_block=True).tolist() == [0, 0, 1]


def test_canopy_cells_in_sglangs_strategy_slot_beat_its_lru_and_lfu():
    """Canopy's decayed counts (half-life 8 capacities, parental prior) as the priority of
    SGLang's own eviction loop, on the conversation trace at 1,024 blocks."""
    require_data("mooncake", "conversation_trace.jsonl")
    trace = resolve("conversation").head(2000)
    cache = standin.api.simulated("lru")
    cache.eviction_strategy = strategy = CanopyStrategy(trace, 1024)
    ours = drive(standin.api, cache, trace, 1024, strategy=strategy).mean()
    lru, lfu = (_sglang(trace, p, 1024, per_block=False).mean() for p in ("lru", "lfu"))
    assert ours > 1.1 * max(lru, lfu)


def test_on_sglang_itself():
    pytest.importorskip("sglang.srt.mem_cache.radix_cache",
                        reason="SGLang needs its CUDA stack (torch, flashinfer, ...)")
    from canopy.apps.cache.sglang import sglang_api

    trace = from_paths([[1, 2, 3], [1, 2, 4], [5, 6], [1, 2, 3, 7], [5, 6, 8]] * 20)
    for policy in ("lru", "lfu"):
        assert np.array_equal(_sglang(trace, policy, 4, per_block=True, api=sglang_api()),
                              RadixCache(trace, make_policy(policy), 4).run())
