"""Canopy's eviction in a paged engine's block pool: the host-agnostic evictable set
(:mod:`canopy.prefix.evictable`) against the replay, and the vLLM plugin's switch."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest

from canopy.prefix.evictable import EvictableBlocks
from canopy.prefix.policies import EvictionPolicy
from canopy.prefix.stream import OnlinePolicy, replay_stream


def test_without_a_policy_blocks_leave_in_release_order():
    free = EvictableBlocks()
    for block, key in ((3, "a"), (1, "b"), (2, "c")):
        free.release(block, key)
    free.acquire(1)  # a hit takes "b" back (pinned)
    free.release(1, "b")  # ... and frees it again: now the most recent
    free.acquire(2)
    assert free.pop_victims(4) == [3, 1]
    assert free.pop_victim() is None


def test_blocks_the_policy_cannot_key_go_first_and_join_it_once_observed():
    """A block whose key no request showed the policy (an output block) goes first, in
    release order; observed, it is ranked. Blocks sharing a key leave oldest first, and a
    block leaves only once nothing held hangs under its key."""
    order = OnlinePolicy("lfu", 8)
    free = EvictableBlocks(order)
    free.observe([("a",), ("a", "b")])
    free.release_all([0, 1], [("a", "b"), ("a",)])  # deepest first, as vLLM frees
    free.release_all([2, 3], ["unseen", "later"])
    assert free.pop_victim() == 2
    free.observe(["later"])  # request 1: "later" is used after "a", so it stays longer
    free.release_all([5, 6], [("a", "b"), ("a", "b")])  # two more blocks of one key
    free.acquire(0)  # ... and a hit on the first, held: "a" has a held block under it
    assert free.pop_victims(2) == [5, 6]
    assert free.pop_victim() == 3  # "a" waits for its held child
    free.release(0, ("a", "b"))
    assert free.pop_victims(3) == [0, 1]


class PagedHost:
    """A paged engine in miniature (vLLM's discipline): a pool of ``capacity`` blocks;
    a request touches its longest cached prefix, takes blocks for the rest (free blocks
    without a key first, then the policy's victim), and frees its blocks deepest first."""

    def __init__(self, policy: str | EvictionPolicy | None, capacity: int) -> None:
        self.order = None if policy is None else OnlinePolicy(policy, capacity)
        self.free = EvictableBlocks(self.order)
        self.empty = list(range(capacity))
        self.block_of: dict[tuple, int] = {}  # cached key -> block

    def request(self, chain: list[tuple]) -> int:
        if self.order is not None:
            self.free.observe(chain)
        hits = 0
        while hits < len(chain) and chain[hits] in self.block_of:
            hits += 1
        held = [self.block_of[k] for k in chain[:hits]]
        for block in held:
            self.free.acquire(block)
        for key in chain[hits:]:
            if self.empty:
                block = self.empty.pop()
            else:
                block = self.free.pop_victim()
                assert block is not None, "pool exhausted"
                self.block_of = {k: b for k, b in self.block_of.items() if b != block}
            self.block_of[key] = block
            held.append(block)
        for key, block in reversed(list(zip(chain, held, strict=True))):
            self.free.release(block, key)
        return hits


def _zipf_shift(n: int, seed: int) -> list[list[tuple]]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        phase = i >= n // 2
        rank = min(int(rng.paretovariate(1.0)) - 1, 23)
        system = (phase, rank // 6)
        chain = [(system, 0), (system, 1), (system, rank % 6, 2), (system, rank % 6, 3)]
        chain.append((system, rank % 6, "q", i))  # a fresh question block
        # a key names its whole prefix, as vLLM's block hashes do
        out.append([tuple(chain[:j + 1]) for j in range(len(chain))])
    return out


@pytest.mark.parametrize("policy", ["lru", "lfu"])
def test_a_paged_host_reuses_what_the_replay_reuses(policy):
    """Evicting the lowest priority from the evictable set reuses, request for request,
    what the replay's radix cache reuses with the same capacity."""
    chains = _zipf_shift(600, seed=1)
    for capacity in (12, 30):
        host = PagedHost(policy, capacity)
        served = np.array([host.request(c) for c in chains])
        assert np.array_equal(served, replay_stream(chains, policy, capacity)), capacity


@pytest.mark.parametrize("policy", ["sieve", "canopy"])
def test_sieve_and_canopy_on_a_paged_host_track_the_replay(policy):
    """SIEVE's hand walks the host's blocks (it meets a request's new blocks only once
    released) and canopy switches arm one request early: total reuse within 2%."""
    chains = _zipf_shift(1500, seed=3)
    for capacity in (12, 24):
        host = PagedHost(policy, capacity)
        served = np.array([host.request(c) for c in chains])
        replayed = replay_stream(chains, policy, capacity)
        assert abs(served.sum() - replayed.sum()) <= 0.02 * replayed.sum(), capacity


def test_the_hosts_own_release_order_is_lru():
    chains = _zipf_shift(600, seed=2)
    plain = PagedHost(None, 20)
    assert np.array_equal([plain.request(c) for c in chains],
                          replay_stream(chains, "lru", 20))


def test_a_free_block_with_a_held_block_under_it_goes_when_no_free_leaf_is_left():
    """The heap holds only free leaves; a pool whose every free block has a held block under
    its key (blocks sharing a key) still evicts: the lowest of them."""
    free = EvictableBlocks(OnlinePolicy("lfu", 8))
    free.observe([("a",), ("a", "b")])
    free.release_all([0, 1], [("a", "b"), ("a",)])
    free.acquire(0)  # "a, b" held: "a" is no leaf
    assert free.pop_victims(2) == [1]
    free.release(0, ("a", "b"))
    assert free.pop_victims(2) == [0]


@pytest.mark.parametrize(("policy", "victims", "digest"), [
    ("canopy", 12404, "07d25f1c57cff731"), ("lfu", 16461, "4748d0a0e094cfd6"),
    ("sieve", 12846, "62beb219e11860de"), ("lru", 14765, "0508de83642e6b38")])
def test_the_victims_of_a_fixed_workload_are_pinned(policy, victims, digest):
    """Every block the evictable set hands out on a fixed workload (3,000 requests, pools of
    12, 24 and 60 blocks), in order: a change of the set's structure (which free nodes its
    heap holds, how it is searched) must not change one victim."""
    import hashlib

    out: list[int] = []
    for capacity in (12, 24, 60):
        host = PagedHost(policy, capacity)
        pop = host.free.pop_victim

        def recorded(pop=pop) -> int | None:
            out.append(pop())
            return out[-1]

        host.free.pop_victim = recorded
        for chain in _zipf_shift(3000, seed=5):
            host.request(chain)
    assert len(out) == victims
    assert hashlib.sha256(repr(out).encode()).hexdigest()[:16] == digest


def test_the_plugin_is_off_unless_asked_and_refuses_unknown_names(monkeypatch):
    from canopy.integrations import vllm as plugin

    monkeypatch.delenv(plugin.ENV, raising=False)
    assert plugin.enabled_policy() is None
    plugin.register()  # disabled: installs nothing (and needs no vLLM)
    assert "policy" not in plugin._INSTALLED
    monkeypatch.setenv(plugin.ENV, " LFU ")
    assert plugin.enabled_policy() == "lfu"
    monkeypatch.setenv(plugin.ENV, "belady")
    with pytest.raises(ValueError, match="lru, lfu, sieve, canopy"):
        plugin.register()


def test_the_plugins_names_are_the_online_built_in_policies():
    from canopy.integrations import vllm as plugin
    from canopy.prefix.policies import POLICIES

    assert set(plugin._BUILT_IN) == {name for name, cls in POLICIES.items() if not cls.offline}


def test_the_plugin_loads_no_numba_in_vllms_processes():
    """vLLM loads the plugin in every process, and its CPU workers scan every loaded
    module's namespace, which numba's LLVM binding breaks (the worker fails to start): the
    entry point reads the spec without importing the policy, numba or the user's module."""
    import subprocess
    import sys
    from pathlib import Path

    tests = Path(__file__).resolve().parent
    env = {**os.environ, "CANOPY_VLLM_EVICTION": "user_policy:NewestFirst",
           "PYTHONPATH": os.pathsep.join([str(tests.parent / "src"), str(tests)])}
    probe = ("import sys; from canopy.integrations import vllm; "
             "print(vllm.enabled_policy(), 'numba' in sys.modules, 'user_policy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         env=env, check=True).stdout.split()
    assert out == ["user_policy:NewestFirst", "False", "False"]


def test_the_vllm_replay_predicts_canopy_ahead_of_lru_after_the_shift():
    """What a live comparison of canopy with vLLM's LRU is sized by: the replay of the
    workloads one vLLM server serves back to back (Zipf prefixes with a popularity shift, a
    20-block pool). With 400 requests a workload canopy's shadows gather the evidence to
    leave recency and it reuses at least 10% more than LRU after the shift (every workload
    at least as much); with 80 it never leaves recency and ties."""
    import json

    from typer.testing import CliRunner

    from canopy.cli import app
    from llm_server import _require_llama

    _require_llama()
    got = {}
    for requests in (80, 400):
        result = CliRunner().invoke(app, [
            "cache", "live", "--engine", "vllm", "--replay-only", "--policies", "vllm,canopy",
            "--scenario", "shift", "--requests", str(requests), "--repeats", "3", "--blocks",
            "20", "--json"])
        assert result.exit_code == 0, result.output
        out = json.loads(result.output)
        got[requests] = [np.array(out["results"][p]) for p in ("vllm", "canopy")]
    lru, canopy = got[80]
    assert np.array_equal(canopy, lru)
    lru, canopy = got[400]
    assert np.all(canopy >= lru) and canopy.mean() >= 1.1 * lru.mean(), (lru, canopy)


def test_canopy_switching_eagerly_at_full_rate_is_one_policy_in_every_host():
    """At full rate the shadow of the arm the main cache evicts by is a copy of the main
    cache, taken at the switch: the replay does not replay it (it rides on the main cache),
    a cache served one request at a time copies its main cache into it, a paged host
    rebuilds it from the blocks it holds. With the arm switching back and forth, the four
    reuse the same blocks request for request."""
    from canopy.prefix import BlockTree, Canopy, RadixCache, from_paths
    from canopy.prefix.kernels import canopy_request

    policy = Canopy(z=0.0, min_evidence=0.0, window=4.0)
    chains = _zipf_shift(600, seed=3)
    trace = from_paths(chains)
    for capacity in (8, 12, 30):
        replay = RadixCache(trace, policy, capacity)
        replayed = replay.run()
        assert replay.tree.rides and replay.switches >= 10
        # one request at a time from a trace's tree, as the fleet simulator's replicas run
        params, cells, cache, shadows = BlockTree(policy, capacity, trace=trace).kernel_args()
        served = [canopy_request(i, trace.offsets[i], trace.offsets[i + 1], trace.nodes,
                                 trace.parent, trace.depth, capacity, params, cells, cache,
                                 shadows) for i in range(trace.n_requests)]
        np.testing.assert_array_equal(served, replayed)
        np.testing.assert_array_equal(
            replay_stream(chains, policy, capacity, history_floor=None), replayed)
        host = PagedHost(policy, capacity)
        np.testing.assert_array_equal([host.request(c) for c in chains], replayed)
