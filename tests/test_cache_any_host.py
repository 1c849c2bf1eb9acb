"""One policy, every host: a user's own policy class (``tests/user_policy.py``, loaded by the
spec ``user_policy:NewestFirst`` as a user's ``package.module:ClassName``) reuses in each host
exactly what it reuses in the replay: the replay and the streaming cache, vLLM's evictable
set (in miniature here; inside vLLM's own ``KVCacheManager`` and a live ``vllm serve``
below), llama-cpp-python's state cache (unit and a live llama.cpp server) and SGLang's radix
cache (the stand-in here, SGLang itself in ``tests/test_cache_sglang.py``). Bad specs are one
line everywhere, exit 2 in the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import sglang_standin as standin
from canopy.apps.cache.sglang_replay import drive, sweep
from canopy.cli import app
from canopy.integrations.sglang import CanopyEviction, install
from canopy.prefix import RadixCache, from_paths, make_policy
from canopy.prefix.policies import PriorityPolicy, resolve_policy
from canopy.prefix.stream import StreamingCache, replay_stream
from test_cache_vllm import PagedHost, _zipf_shift
from user_policy import NewestFirst

SPEC = "user_policy:NewestFirst"
TESTS = Path(__file__).resolve().parent
SRC = TESTS.parent / "src"
SCAN = [[i % 5] for i in range(100)]  # a cycle over one block more than the cache holds

standin.STRATEGIES["canopy"] = CanopyEviction
install(standin.RadixCache)


def _user_path_env() -> dict[str, str]:
    """A child process that finds this checkout's code and the user's module."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), str(TESTS)])}


def test_every_form_of_a_policy_resolves_to_the_same_policy():
    assert isinstance(resolve_policy(SPEC), NewestFirst)
    assert isinstance(resolve_policy(NewestFirst), NewestFirst)
    mine = NewestFirst()
    assert resolve_policy(mine) is mine
    assert resolve_policy(" lfu ") == make_policy("lfu")
    assert isinstance(make_policy(SPEC), NewestFirst)


@pytest.mark.parametrize(("spec", "words"), [
    ("belady", "unknown policy 'belady'; known: lru, lfu, sieve, canopy, optimal"),
    ("no_such_module:Policy", "cannot import 'no_such_module'"),
    ("user_policy:Missing", "module 'user_policy' has no 'Missing'"),
    ("user_policy:NOT_A_POLICY", "is not a policy class"),
    ("user_policy:NeedsArguments", "cannot be made with no arguments"),
    ("user_policy:", "write package.module:ClassName"),
    (PriorityPolicy, "has no key function"),
    ("user_policy:CalledSieve", "named 'sieve', a built-in policy's name"),
])
def test_bad_specs_are_named_in_one_line(spec, words):
    with pytest.raises(ValueError) as error:
        resolve_policy(spec)
    assert words in str(error.value) and "\n" not in str(error.value)


def test_a_module_that_fails_on_import_is_named_in_one_line(tmp_path, monkeypatch):
    (tmp_path / "broken_policy.py").write_text("raise RuntimeError('needs a GPU')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError) as error:
        resolve_policy("broken_policy:MRU")
    assert str(error.value) == ("policy 'broken_policy:MRU': importing 'broken_policy' "
                                "failed: RuntimeError: needs a GPU")


def test_a_host_serving_requests_as_they_come_refuses_the_offline_optimum():
    assert resolve_policy("optimal").offline
    with pytest.raises(ValueError, match="'optimal' reads the future"):
        resolve_policy("optimal", online=True)
    with pytest.raises(ValueError, match="reads the future"):
        CanopyEviction(policy="optimal")
    with pytest.raises(TypeError, match="a policy is a name"):
        resolve_policy(3)


def test_the_user_policy_by_spec_in_the_replay_and_the_streaming_cache():
    """On the scan LRU reuses nothing and MRU most of it, the same in both."""
    trace = from_paths(SCAN)
    assert RadixCache(trace, make_policy("lru"), 4).run().sum() == 0
    replayed = RadixCache(trace, resolve_policy(SPEC), 4).run()
    assert replayed.sum() >= 60
    stream = StreamingCache(SPEC, 4)
    np.testing.assert_array_equal([stream.request(p) for p in SCAN], replayed)


def test_the_user_policy_in_a_paged_hosts_evictable_set_equals_the_replay():
    """vLLM's discipline (tests/test_cache_vllm.py ``PagedHost``): MRU's key rises from a
    block to its parent, so the evictable set must evict leaves only, as the replay does;
    then every request reuses what it reuses in the replay, and not what LRU reuses."""
    chains = _zipf_shift(600, seed=1)
    for capacity in (12, 30):
        host = PagedHost(SPEC, capacity)
        served = np.array([host.request(c) for c in chains])
        replayed = replay_stream(chains, SPEC, capacity)
        np.testing.assert_array_equal(served, replayed)
        assert served.sum() != replay_stream(chains, "lru", capacity).sum()


def test_the_user_policy_as_an_sglang_strategy_equals_the_replay():
    """SGLang's interface (the stand-in) with Canopy's backend, one node a request as SGLang
    inserts a finished request: the user's policy by spec in the strategy's configuration,
    and through ``canopy cache replay --engine sglang``'s sweep."""
    trace = from_paths([[1, 2, 3], [1, 2, 4], [5, 6], [1, 2, 3, 7], [5, 6, 8]] * 20)
    for capacity in (4, 6):
        replayed = RadixCache(trace, resolve_policy(SPEC), capacity).run()
        cache = standin.api.simulated("canopy", {"policy": SPEC, "capacity_blocks": capacity},
                                      exact=True)
        np.testing.assert_array_equal(drive(standin.api, cache, trace, capacity), replayed)
    lru = RadixCache(trace, make_policy("lru"), 4).run()
    (result,) = sweep(trace, policies=[SPEC], capacities=[4], api=standin.api)
    assert result.policy == "newest-first"
    assert result.reused.sum() == RadixCache(trace, resolve_policy(SPEC), 4).run().sum()
    assert result.reused.sum() > lru.sum()
    with pytest.raises(ValueError, match="'sieve' is a hand"):
        sweep(trace, policies=["sieve"], capacities=[4], api=standin.api)


def test_the_user_policy_in_llama_cpps_state_cache_equals_the_replay():
    from llm_server import _require_llama

    _require_llama()
    from canopy.engines.llama_cache import PolicyStateCache

    for policy in (SPEC, NewestFirst, NewestFirst()):
        cache = PolicyStateCache(policy, 4 * 2 * 10, block_tokens=2, kv_bytes=10)  # 4 blocks
        for prompt in SCAN:
            with pytest.raises(KeyError):  # hits have no saved state here: counted, refused
                cache[[prompt[0], prompt[0], 99]]
        replayed = RadixCache(from_paths(SCAN), resolve_policy(SPEC), 4).run()
        np.testing.assert_array_equal(list(cache.reused), replayed)
    with pytest.raises(ValueError, match="reads the future"):
        PolicyStateCache("optimal", 80, block_tokens=2, kv_bytes=10)


def _prompt_log(tmp_path: Path) -> str:
    log = tmp_path / "log.jsonl"
    log.write_text("".join(json.dumps(list(range(16 * (i % 5), 16 * (i % 5) + 16))) + "\n"
                           for i in range(100)))
    return str(log)


def test_the_replay_cli_runs_the_user_policy_by_spec(tmp_path):
    result = CliRunner().invoke(app, ["cache", "replay", "--trace", _prompt_log(tmp_path),
                                      "--capacity", "4", "--policies", f"lru,{SPEC}",
                                      "--block-size", "16", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)["results"]
    assert out["lru"]["4"]["blocks_reused_per_request"] == 0
    assert out["newest-first"]["4"]["blocks_reused_per_request"] >= 0.6


@pytest.mark.parametrize(("args", "words"), [
    (["cache", "replay", "--policies", "lru,no_such_module:X"],
     "--policies with --engine canopy: policy 'no_such_module:X': cannot import"),
    (["cache", "replay", "--policies", "user_policy:NOT_A_POLICY"], "is not a policy class"),
    (["cache", "replay", "--engine", "sglang", "--policies", "optimal"],
     "--policies with --engine sglang: policy 'optimal' reads the future"),
    (["cache", "live", "--policies", "user_policy:Missing"], "has no 'Missing'"),
    (["cache", "live", "--engine", "vllm", "--policies", "vllm,optimal"],
     "--policies with --engine vllm: policy 'optimal' reads the future"),
    (["cache", "live", "--policies", "vllm"], "unknown policy 'vllm'"),
])
def test_the_cli_refuses_bad_specs_in_one_line_with_exit_2(args, words):
    """As a user runs it, from the folder holding their module (found there, as uvicorn
    finds an app)."""
    run = subprocess.run([sys.executable, "-m", "canopy", *args], capture_output=True,
                         text=True, check=False, cwd=TESTS, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(SRC)})
    assert run.returncode == 2, run.stdout + run.stderr
    assert words in " ".join((run.stdout + run.stderr).split()), run.stderr
    assert "Traceback" not in run.stderr


def test_live_llama_cpp_serves_what_the_replay_predicts_for_the_user_policy():
    """A real llama.cpp server (llama-cpp-python, SmolLM2-135M) with the user's policy by
    spec: the server's reuse equals the replay's, request for request."""
    from llm_server import _require_llama

    _require_llama()
    from canopy.apps.cache.live import run_live
    from canopy.engines.workloads import word_vocabulary, zipf_workload
    from canopy.llm.local import find_smollm2_gguf

    path = find_smollm2_gguf()
    words, vocab = word_vocabulary(path)
    previous = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = _user_path_env()["PYTHONPATH"]  # the engine's process
    try:
        out = run_live([SPEC], lambda s: zipf_workload(words, requests=16,
                                                      scenario="stationary", seed=s),
                       model_path=path, vocab=vocab, capacity_mb=3.0, n_threads=1)
    finally:
        if previous is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = previous
    entry = out["results"][SPEC]
    assert entry["replay_matches_server"] and entry["hit_rate"] > 0


def test_live_vllm_serves_what_the_replay_predicts_for_the_user_policy():
    """``canopy cache live --engine vllm --policies user_policy:NewestFirst`` against a real
    ``vllm serve``: the plugin loads the user's class in vLLM's processes, and the server's
    per-request reuse equals the replay's (which differs from vLLM's LRU here)."""
    from test_cache_vllm_live import run_live
    from test_cache_vllm_pool import _vllm_python

    _vllm_python()  # skips (fails in CI) without vLLM
    args = ["--engine", "vllm", "--requests", "24", "--scenario", "stationary",
            "--blocks", "12", "--threads", "1", "--json"]
    replay = subprocess.run(
        [sys.executable, "-m", "canopy", "cache", "live", *args, "--replay-only",
         "--policies", f"vllm,{SPEC}"], capture_output=True, text=True, check=False,
        cwd=TESTS, env=_user_path_env(), timeout=600)
    assert replay.returncode == 0, replay.stderr[-3000:]
    predicted = json.loads(replay.stdout)["results"]
    assert predicted[SPEC] != predicted["vllm"]
    returncode, stdout, stderr = run_live([*args, "--policies", SPEC], cwd=TESTS,
                                          env=_user_path_env())
    assert returncode == 0, stderr[-3000:]
    entry = json.loads(stdout)["results"][SPEC]
    assert entry["replay_matches_server"] and entry["hit_rate"] > 0
