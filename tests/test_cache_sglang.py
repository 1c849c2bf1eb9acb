"""Engine parity with SGLang's radix cache: its lru/lfu equal Canopy's when nodes are blocks,
whole-node eviction explains the rest, and Canopy's online strategy
(:mod:`canopy.integrations.sglang`) learns inside it from its own inserts.

Unit tests drive :mod:`sglang_standin` (SGLang's interface and eviction behaviour); the tests
marked ``sglang`` run on SGLang itself (``.ci/sglang.sh`` makes its environment): they skip
where it does not import, and fail there when ``CANOPY_SGLANG=required`` (CI's run in that
environment)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import sglang_standin as standin
from canopy.apps.cache.sglang_replay import KVPool, drive, serve_request, sweep
from canopy.cli import app
from canopy.integrations.sglang import (
    CanopyEviction,
    _node_keys,
    _page_keys,
    _root,
    install,
    radix_cache_class,
)
from canopy.prefix import RadixCache, from_paths, make_policy
from canopy.prefix.policies import resolve_policy
from canopy.prefix.traces import resolve
from conftest import require_data
from helpers import real_sglang

standin.STRATEGIES["canopy"] = CanopyEviction
install(standin.RadixCache)

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
    """Two blocks inserted at once form one node; needing one block back evicts both, unless
    the cache evicts page-exactly (Canopy's backend with Canopy's policy, here its online
    ``lru``): then only the tail goes. With SGLang's own strategy the backend is SGLang's."""
    trace = from_paths([[1, 2], [3], [1, 2]])
    assert _sglang(trace, "lru", 2, per_block=False).tolist() == [0, 0, 0]
    assert RadixCache(trace, make_policy("lru"), 2).run().tolist() == [0, 0, 1]
    assert _sglang(trace, "lru", 2, per_block=True).tolist() == [0, 0, 1]
    exact = standin.api.simulated("canopy", {"policy": "lru", "capacity_blocks": 2}, exact=True)
    assert drive(standin.api, exact, trace, 2).tolist() == [0, 0, 1]
    assert drive(standin.api, standin.api.simulated("lru", exact=True), trace, 2).tolist() == [
        0, 0, 0]


def test_page_exact_eviction_gives_the_online_strategy_the_replays_reuse():
    """The synthetic trace at 256 blocks, where whole-node eviction costs every strategy
    about 14% (SGLang's lru 0.628 blocks a request against the replay's 0.729) and the
    online strategy, on its recency arm like the replay's, stays below SGLang's lfu (0.653):
    evicting page-exactly, as its shadows and the replay assume, it reuses the replay's
    blocks and more than SGLang's lru and lfu."""
    require_data("mooncake", "synthetic_trace.jsonl")
    trace = resolve("synthetic")
    replayed = RadixCache(trace, make_policy("canopy"), 256).run().mean()
    stock = {p: _sglang(trace, p, 256, per_block=False).mean() for p in ("lru", "lfu")}
    exact = standin.api.simulated("canopy", {"capacity_blocks": 256}, exact=True)
    online = drive(standin.api, exact, trace, 256).mean()
    assert online >= 0.99 * replayed and online > 1.05 * max(stock.values()), (online, stock)


def _nodes(cache):
    out, stack = [], [(cache.root, [])]
    while stack:
        node, above = stack.pop()
        tokens = above + list(node.key)
        out.append((node, tokens))
        stack.extend((child, tokens) for child in node.children.values())
    return out[1:]


@settings(max_examples=40, deadline=None)
@given(paths=paths_strategy, capacity=st.integers(2, 8))
def test_node_keys_are_the_page_chain_of_their_prefix_after_splits(paths, capacity):
    """A node's cached page keys equal the chain keys of its whole prefix, however SGLang has
    split it since they were made."""
    cache = standin.api.simulated("canopy", {"capacity_blocks": capacity})
    trace = from_paths(paths)
    for i in range(trace.n_requests):
        drive(standin.api, cache, from_paths([trace.path(i).tolist()]), capacity)
        for node, tokens in _nodes(cache):
            chain = _page_keys(tokens, 1, _root(None))
            assert _node_keys(node, 1) == chain[len(chain) - len(node.key):]


@settings(max_examples=60, deadline=None)
@given(paths=paths_strategy, capacity=st.integers(1, 8), policy=st.sampled_from(["lru",
                                                                                  "lfu"]))
def test_online_lru_and_lfu_through_the_strategy_equal_canopys_replay(paths, capacity, policy):
    """Canopy's online policy in SGLang's strategy slot, fed only by SGLang's inserts and
    deletions (one node a block), reuses what the replay reuses, request for request."""
    trace = from_paths(paths)
    cache = standin.api.simulated("canopy", {"policy": policy, "capacity_blocks": capacity})
    assert np.array_equal(drive(standin.api, cache, trace, capacity, per_block=True),
                          RadixCache(trace, make_policy(policy), capacity).run())


@settings(max_examples=60, deadline=None)
@given(paths=paths_strategy, capacity=st.integers(1, 8),
       policy=st.sampled_from(["lru", "lfu", "user_policy:NewestFirst"]),
       per_block=st.booleans())
def test_canopys_backend_evicts_the_policys_victims_page_by_page(paths, capacity, policy,
                                                                 per_block):
    """Canopy's backend takes its victims from the policy's evictable set, page by page, and
    SGLang evicts exactly them, cutting a node when its tail alone goes: whatever the nodes
    (one a request as SGLang inserts, or one a block), every request reuses what the replay
    reuses, for a policy whose key rises from a block to its parent too (newest first)."""
    trace = from_paths(paths)
    cache = standin.api.simulated("canopy", {"policy": policy, "capacity_blocks": capacity},
                                  exact=True)
    assert np.array_equal(drive(standin.api, cache, trace, capacity, per_block=per_block),
                          RadixCache(trace, resolve_policy(policy), capacity).run())
    assert cache.eviction_strategy.policy.fallbacks == 0


def test_online_canopy_beats_sglangs_lru_and_lfu_on_the_conversation_trace():
    """The online strategy, with no trace, on SGLang's whole-node eviction: 4,000 requests of
    the conversation trace at 256 blocks."""
    require_data("mooncake", "conversation_trace.jsonl")
    trace = resolve("conversation").head(4000)
    got = {r.policy: r.blocks_reused_per_request
           for r in sweep(trace, policies=["lru", "lfu", "canopy"], capacities=[256],
                          api=standin.api)}
    assert got["canopy"] > 1.01 * max(got["lru"], got["lfu"]), got


def _largest_kv_index(api, capacity: int = 64, requests: int = 20_000, *,
                      size: int | None = None) -> int:
    """The largest KV index SGLang's tree holds (each page's index is the engine block
    Canopy's tables are sized by), every 500 requests of a stream whose requests each end
    with a block of their own, so new token ids never stop arriving (as the soak's,
    ``benchmarks/cache_soak.py``); the pool sized ``size`` (``None``: as the cache needs)."""
    cache = api.simulated("canopy", {"capacity_blocks": capacity}, exact=True,
                          **({} if size is None else {"size": size}))
    rng = np.random.default_rng(0)
    largest = 0
    for i, p in enumerate(rng.integers(256, size=requests).tolist()):
        serve_request(api, cache, [1 + 16 * p + j for j in range(2 + p % 7)] + [4096 + i],
                      capacity)
        if i % 500 == 0:
            stack = list(cache.root_node.children.values())
            while stack:
                node = stack.pop()
                largest = max(largest, int(max(node.value)))
                stack.extend(node.children.values())
    return largest


def test_kv_indices_come_from_a_pool_of_the_caches_size():
    """SGLang's scheduler takes a request's KV indices from its token pool and the tree
    frees them when it evicts: over 20,000 requests of ever new tokens at 64 blocks, no
    index passes the pool's size, so neither do Canopy's per-block tables."""
    assert _largest_kv_index(standin.api) <= 64


@pytest.mark.sglang
def test_kv_indices_come_from_a_pool_of_the_caches_size_in_sglang():
    """:func:`test_kv_indices_come_from_a_pool_of_the_caches_size` in SGLang's own tree."""
    api = real_sglang()
    assert _largest_kv_index(api) <= 64
    assert _largest_kv_index(api, size=64) <= 64


def test_kv_pool_hands_out_indices_as_sglangs_token_pool():
    """Sized, SGLang's order: ``1..size`` first, then the indices in the order freed, none
    when too few are free; unsized, a new index only when none is free."""
    pool = KVPool(4)
    assert pool.alloc(3) == [1, 2, 3] and pool.alloc(2) is None
    pool.free_segment([3, 1])
    assert pool.alloc(3) == [4, 3, 1] and pool.available_size() == 0
    grown = KVPool()
    assert grown.alloc(2) == [1, 2]
    grown.free_segment([1])
    assert grown.alloc(2) == [1, 3] and grown.size is None
    with pytest.raises(ValueError, match="size"):
        KVPool(0)


def test_strategy_refuses_bad_configuration():
    with pytest.raises(ValueError, match="'sieve' is a hand"):
        CanopyEviction(policy="sieve")
    with pytest.raises(ValueError, match="capacity_blocks"):
        CanopyEviction(capacity_blocks=0)
    cache = standin.api.simulated("canopy")  # no pool to size the policy by
    with pytest.raises(ValueError, match="capacity_blocks"):
        drive(standin.api, cache, from_paths([[1, 2]]), 4)
    with pytest.raises(ValueError, match="engine runs the policies"):
        sweep(from_paths([[1]]), policies=["optimal"], capacities=[4], api=standin.api)


@pytest.mark.sglang
def test_on_sglang_itself():
    """SGLang's own RadixCache: its lru/lfu equal Canopy's replay with one node a block, and
    Canopy's online lru/lfu in its strategy slot do too."""
    api = real_sglang()
    trace = from_paths([[1, 2, 3], [1, 2, 4], [5, 6], [1, 2, 3, 7], [5, 6, 8]] * 20)
    for policy in ("lru", "lfu"):
        ours = RadixCache(trace, make_policy(policy), 4).run()
        assert np.array_equal(drive(api, api.simulated(policy), trace, 4, per_block=True), ours)
        online = api.simulated("canopy", {"policy": policy, "capacity_blocks": 4})
        assert np.array_equal(drive(api, online, trace, 4, per_block=True), ours)
    whole = from_paths([[1, 2], [3], [1, 2]])
    assert drive(api, api.simulated("lru"), whole, 2).tolist() == [0, 0, 0]
    exact = api.simulated("canopy", {"policy": "lru", "capacity_blocks": 2}, exact=True)
    assert drive(api, exact, whole, 2).tolist() == [0, 0, 1]
    assert drive(api, api.simulated("lru", exact=True), whole, 2).tolist() == [0, 0, 0]


@pytest.mark.sglang
def test_registered_in_sglangs_registry_and_command_line():
    """``register()`` (SGLang runs it through the ``sglang.srt.plugins`` entry point) makes
    ``--radix-eviction-policy canopy`` parse and build Canopy's strategy."""
    real_sglang()
    import argparse

    from sglang.srt.mem_cache.utils import get_eviction_strategy
    from sglang.srt.server_args import ServerArgs

    from canopy.integrations.sglang import register

    register()
    register()  # idempotent
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    args = parser.parse_args(["--model-path", "m", "--radix-eviction-policy", "canopy",
                              "--radix-eviction-policy-config", '{"capacity_blocks": 64}'])
    assert args.radix_eviction_policy == "canopy"
    strategy = get_eviction_strategy(args.radix_eviction_policy,
                                     args.radix_eviction_policy_config)
    assert isinstance(strategy, CanopyEviction) and strategy.capacity_blocks == 64
    with pytest.raises(SystemExit):
        parser.parse_args(["--model-path", "m", "--radix-eviction-policy", "nope"])
    from types import SimpleNamespace

    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.radix_cache import RadixCache
    from sglang.srt.mem_cache.registry import get_radix_cache_factory

    params = CacheInitParams(disable=False, req_to_token_pool=None,
                             token_to_kv_pool_allocator=None, page_size=1,
                             eviction_policy="canopy",
                             eviction_policy_config={"capacity_blocks": 8})
    cache = get_radix_cache_factory("canopy")(SimpleNamespace(params=params))
    assert type(cache) is radix_cache_class() and isinstance(cache, RadixCache)
    assert isinstance(cache.eviction_strategy, CanopyEviction)


@pytest.mark.sglang
def test_online_canopy_in_sglangs_radix_cache_on_the_conversation_trace():
    """Inside SGLang's real RadixCache, learning only from its inserts: above SGLang's lru and
    lfu on 4,000 requests of the conversation trace at 256 blocks."""
    api = real_sglang()
    require_data("mooncake", "conversation_trace.jsonl")
    trace = resolve("conversation").head(4000)
    got = {r.policy: r.blocks_reused_per_request
           for r in sweep(trace, policies=["lru", "lfu", "canopy"], capacities=[256],
                          api=api)}
    assert got["canopy"] > 1.01 * max(got["lru"], got["lfu"]), got


def _prompt_log(tmp_path):
    log = tmp_path / "log.jsonl"
    log.write_text("".join(json.dumps(list(range(i % 3, i % 3 + 64))) + "\n"
                           for i in range(30)))
    return str(log)


def test_replay_cli_refuses_a_bad_engine_in_one_line(tmp_path):
    runner = CliRunner()
    for args, message in ((["--engine", "vllm"], "--engine must be canopy or sglang"),
                          (["--engine", "sglang", "--policies", "optimal"], "sglang")):
        result = runner.invoke(app, ["cache", "replay", "--trace", _prompt_log(tmp_path),
                                     "--capacity", "4", *args])
        assert result.exit_code == 2 and message in result.output, result.output
        assert "Traceback" not in result.output


@pytest.mark.sglang
def test_replay_cli_drives_sglangs_radix_cache(tmp_path):
    real_sglang()
    result = CliRunner().invoke(app, ["cache", "replay", "--engine", "sglang", "--trace",
                                      _prompt_log(tmp_path), "--capacity", "4,16",
                                      "--policies", "lru,lfu,canopy", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output[result.output.index("{"):])
    assert out["engine"] == "sglang" and set(out["results"]) == {"lru", "lfu", "canopy"}
    assert out["results"]["lru"]["16"]["blocks_reused_per_request"] > 0


@pytest.mark.sglang
def test_sglang_loads_canopy_through_its_plugin_entry_point():
    """Installed beside SGLang, Canopy registers itself when SGLang loads its plugins (as
    ``sglang serve`` and each scheduler process do), in a fresh process."""
    real_sglang()
    from importlib.metadata import entry_points

    if "canopy" not in {ep.name for ep in entry_points(group="sglang.srt.plugins")}:
        if os.environ.get("CANOPY_SGLANG") == "required":
            pytest.fail("canopy is not installed in SGLang's environment (.ci/sglang.sh)")
        pytest.skip("canopy is not installed (pip install -e .) in this environment")
    code = ("from sglang.srt.plugins import load_plugins; load_plugins(); "
            "from sglang.srt.arg_groups.choices import RADIX_EVICTION_POLICY_CHOICES as c; "
            "from sglang.srt.mem_cache.utils import get_eviction_strategy as g; "
            "print('canopy' in c, type(g('canopy', {'capacity_blocks': 8})).__name__, "
            "'newest-first' in c, type(g('newest-first').chosen).__name__)")
    here = os.path.dirname(os.path.abspath(__file__))  # the user's module: user_policy.py
    env = {**os.environ, "CANOPY_SGLANG_POLICIES": "user_policy:NewestFirst",
           "PYTHONPATH": os.pathsep.join([os.environ.get("PYTHONPATH", ""), here])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=600, check=True, env=env)
    assert done.stdout.split()[-4:] == ["True", "CanopyEviction", "True", "NewestFirst"], (
        done.stderr[-2000:])


@pytest.mark.sglang
def test_a_users_policy_registered_by_name_reuses_in_sglang_what_it_reuses_in_the_replay():
    """``register("user_policy:NewestFirst")`` (a user's own class, tests/user_policy.py)
    adds ``newest-first`` to SGLang's registry and ``--radix-eviction-policy``; served by
    that name in Canopy's backend on SGLang's own radix cache, one node a request as SGLang
    inserts, every request reuses what the replay reuses (and more than LRU on the loop)."""
    api = real_sglang()
    import argparse

    from sglang.srt.mem_cache.utils import get_eviction_strategy
    from sglang.srt.server_args import ServerArgs

    from canopy.integrations.sglang import register
    from canopy.prefix.policies import resolve_policy
    from user_policy import NewestFirst

    assert register("user_policy:NewestFirst") == ["canopy", "newest-first"]
    assert register(NewestFirst) == ["canopy", "newest-first"]  # idempotent
    assert register("canopy") == ["canopy"]  # Canopy's own, by its own name
    # ... keeps the bare factory, so a config naming the policy still builds it
    assert isinstance(get_eviction_strategy("canopy", {"policy": NewestFirst()}), CanopyEviction)
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    args = parser.parse_args(["--model-path", "m", "--radix-eviction-policy", "newest-first"])
    strategy = get_eviction_strategy(args.radix_eviction_policy, {"capacity_blocks": 4})
    assert isinstance(strategy, CanopyEviction) and isinstance(strategy.chosen, NewestFirst)
    require_data("mooncake", "conversation_trace.jsonl")
    loop = from_paths([[1, 2, 3], [1, 2, 4], [5, 6], [1, 2, 3, 7], [5, 6, 8]] * 20)
    for trace, capacities in ((loop, (4, 6)), (resolve("conversation").head(2000), (64, 256))):
        for capacity in capacities:
            cache = api.simulated("newest-first", {"capacity_blocks": capacity}, exact=True)
            replayed = RadixCache(trace, resolve_policy(NewestFirst), capacity).run()
            assert np.array_equal(drive(api, cache, trace, capacity), replayed), capacity
    lru = RadixCache(loop, make_policy("lru"), 4).run().sum()
    assert RadixCache(loop, NewestFirst(), 4).run().sum() > lru

    class Taken(NewestFirst):
        name = "mru"  # SGLang's own most-recently-used strategy

    with pytest.raises(ValueError, match="'mru' is taken by SGLang's strategy"):
        register(Taken)
    with pytest.raises(ValueError, match="'sieve' is a hand"):
        register("sieve")


@pytest.mark.sglang
def test_replay_cli_drives_sglangs_radix_cache_with_a_users_policy(tmp_path):
    real_sglang()
    log = _prompt_log(tmp_path)
    result = CliRunner().invoke(app, ["cache", "replay", "--engine", "sglang", "--trace", log,
                                      "--capacity", "4,16", "--policies",
                                      "lru,user_policy:NewestFirst", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output[result.output.index("{"):])["results"]
    result = CliRunner().invoke(app, ["cache", "replay", "--trace", log, "--capacity", "4,16",
                                      "--policies", "user_policy:NewestFirst", "--json"])
    replayed = json.loads(result.output)["results"]["newest-first"]
    for capacity in ("4", "16"):
        assert out["newest-first"][capacity]["blocks_reused_per_request"] == (
            replayed[capacity]["blocks_reused_per_request"])
