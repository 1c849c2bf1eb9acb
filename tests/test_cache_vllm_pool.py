"""Canopy's eviction plugin inside vLLM's own ``KVCacheManager`` and ``BlockPool`` (vLLM's
interpreter, ``.venv-vllm``; tests/vllm_pool_driver.py): with ``lru`` vLLM hands out the
same blocks and finds the same cached tokens as without the plugin; disabled, the entry
point changes nothing; the other policies decide which cached free block is evicted, and
the blocks each request reuses are the replay's."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from canopy.apps.cache.live import predicted_reuse, replay_capacity
from canopy.prefix.traces import full_blocks
from conftest import IN_CI

BLOCK = 16
POOL = 40


def _vllm_python() -> str:
    from canopy.engines.vllm_server import VLLMServerError, vllm_python

    try:
        python = vllm_python()
        found = subprocess.run([python, "-c", "import vllm"], capture_output=True,
                               check=False).returncode == 0
    except VLLMServerError:
        found = False
    if not found:
        if IN_CI:
            pytest.fail("vLLM missing in CI: run .ci/vllm.sh")
        pytest.skip("vLLM not installed (run .ci/vllm.sh)")
    return python


def _prompts(seed: int, requests: int = 300) -> list[list[int]]:
    """Shared prefixes of 2-5 blocks drawn by a Zipf law whose ranking shifts halfway, each
    followed by a question of its own that ends mid-block."""
    rng = np.random.default_rng(seed)
    prefixes = [list(rng.integers(1000, 30000, size=BLOCK * int(rng.integers(2, 6))))
                for _ in range(24)]
    weights = 1.0 / np.arange(1, 25) ** 1.1
    out = []
    for i in range(requests):
        order = np.arange(24) if i < requests // 2 else np.roll(np.arange(24), 12)
        prefix = prefixes[order[rng.choice(24, p=weights / weights.sum())]]
        out.append([int(t) for t in prefix]
                   + [int(t) for t in rng.integers(30000, 40000, size=BLOCK + 5)])
    return out


def _serve(python: str, policy: str, prompts: list[list[int]], env: dict | None = None
           ) -> dict:
    src = str(Path(__file__).resolve().parents[1] / "src")
    answer = subprocess.run(
        [python, str(Path(__file__).with_name("vllm_pool_driver.py")), policy],
        input=json.dumps({"prompts": prompts, "blocks": POOL, "block_size": BLOCK}),
        capture_output=True, text=True, check=False, timeout=600,
        env={**os.environ, "PYTHONPATH": src, **(env or {})})
    assert answer.returncode == 0, answer.stderr[-3000:]
    return json.loads(answer.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def python() -> str:
    return _vllm_python()


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    return _prompts(seed=3)


@pytest.fixture(scope="module")
def stock(python, prompts) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "CANOPY_VLLM_EVICTION"}
    return _serve(python, "vllm", prompts, {**env, "CANOPY_VLLM_EVICTION": ""})


def test_lru_through_the_plugin_is_vllms_own_eviction_block_for_block(python, prompts,
                                                                       stock):
    assert sum(stock["cached_tokens"]) > 0  # the workload reuses, evicts and reuses again
    assert _serve(python, "lru", prompts) == stock


def test_the_entry_point_disabled_changes_nothing_enabled_takes_over(python, prompts,
                                                                     stock):
    assert _serve(python, "env", prompts, {"CANOPY_VLLM_EVICTION": ""}) == stock
    assert _serve(python, "env", prompts, {"CANOPY_VLLM_EVICTION": "lfu"}) != stock


@pytest.mark.parametrize("policy", ["lru", "lfu", "sieve", "canopy"])
def test_vllm_reuses_the_blocks_the_replay_predicts(python, prompts, policy):
    served = _serve(python, policy, prompts)
    reused = np.asarray(served["cached_tokens"]) // BLOCK
    chains = [full_blocks(p, BLOCK) for p in prompts]
    replay = predicted_reuse(chains, policy, replay_capacity(POOL))
    if policy != "sieve":  # canopy's arm switches at the replay's request; sized as the replay
        assert np.array_equal(reused, replay)
    else:  # SIEVE's hand: exact but for ties in the order blocks of equal priority leave
        assert abs(reused.sum() - replay.sum()) <= 0.02 * replay.sum()


def test_a_users_policy_by_spec_in_the_environment_reuses_what_the_replay_predicts(
        python, prompts, stock):
    """vLLM's plugin loader with ``CANOPY_VLLM_EVICTION=user_policy:NewestFirst`` (a user's
    own class, tests/user_policy.py, on vLLM's path): vLLM's pool evicts by it, leaves only,
    and every request reuses what the replay of the same policy reuses."""
    tests = str(Path(__file__).resolve().parent)
    src = str(Path(__file__).resolve().parents[1] / "src")
    served = _serve(python, "env", prompts, {"CANOPY_VLLM_EVICTION": "user_policy:NewestFirst",
                                             "PYTHONPATH": os.pathsep.join([src, tests])})
    assert served != stock
    reused = np.asarray(served["cached_tokens"]) // BLOCK
    chains = [full_blocks(p, BLOCK) for p in prompts]
    replay = predicted_reuse(chains, "user_policy:NewestFirst", replay_capacity(POOL))
    assert np.array_equal(reused, replay)


def test_a_policy_that_raises_mid_run_falls_back_to_vllms_order_and_serves_every_request(
        python, prompts, stock):
    """``CANOPY_VLLM_EVICTION=user_policy:RaisesAfter200`` (its key raises ``ValueError``
    once the clock passes request 200): vLLM's own manager serves all 300 requests, the
    fallback is logged once and counted once, and the requests before the failure reuse what
    the policy's replay reuses."""
    tests = str(Path(__file__).resolve().parent)
    src = str(Path(__file__).resolve().parents[1] / "src")
    served = _serve(python, "env", prompts, {"CANOPY_VLLM_EVICTION": "user_policy:RaisesAfter200",
                                             "PYTHONPATH": os.pathsep.join([src, tests])})
    assert len(served["cached_tokens"]) == len(prompts) == 300
    assert served["fallbacks"] == 1 and served["fallbacks_logged"] == 1
    reused = np.asarray(served["cached_tokens"]) // BLOCK
    chains = [full_blocks(p, BLOCK) for p in prompts]
    replay = predicted_reuse(chains, "user_policy:NewestFirst", replay_capacity(POOL))
    assert np.array_equal(reused[:200], replay[:200])
    assert reused[200:].sum() > 0  # vLLM's order still reuses after the fallback


def test_a_policy_that_fails_from_the_start_leaves_vllms_own_eviction_block_for_block(
        python, prompts, stock):
    tests = str(Path(__file__).resolve().parent)
    src = str(Path(__file__).resolve().parents[1] / "src")
    served = _serve(python, "env", prompts, {"CANOPY_VLLM_EVICTION": "user_policy:RaisesAlways",
                                             "PYTHONPATH": os.pathsep.join([src, tests])})
    assert served["fallbacks"] == served["fallbacks_logged"] == 1
    assert {**served, "fallbacks": 0, "fallbacks_logged": 0} == stock
