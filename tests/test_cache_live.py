"""Eviction policies inside llama.cpp: the state cache's bookkeeping (unit), and live runs
over real HTTP on loopback (the engine server with SmolLM2-135M)."""

from __future__ import annotations

import json
import secrets

import httpx
import numpy as np
import pytest
from typer.testing import CliRunner

from canopy.cli import app
from llm_server import _require_llama


@pytest.fixture(scope="module")
def engine():
    _require_llama()
    from canopy.engines.workloads import word_vocabulary
    from canopy.llm.local import find_smollm2_gguf

    path = find_smollm2_gguf()
    words, vocab = word_vocabulary(path)
    return path, words, vocab


def _state(tokens: list[int]):
    from llama_cpp import LlamaState

    ids = np.zeros(64, dtype=np.intc)
    ids[:len(tokens)] = tokens
    return LlamaState(input_ids=ids, scores=np.ones((8, 5), dtype=np.single),
                      n_tokens=len(tokens), llama_state=b"x" * 100 * len(tokens),
                      llama_state_size=100 * len(tokens), seed=0)


def test_state_cache_serves_exactly_the_policys_blocks():
    _require_llama()
    from canopy.engines.llama_cache import PolicyStateCache

    cache = PolicyStateCache("lru", 4 * 2 * 10, block_tokens=2, kv_bytes=10)  # 4 blocks
    assert cache.capacity_blocks == 4
    first = [1, 2, 3, 4, 5]
    with pytest.raises(KeyError):
        cache[first]  # cold: inserts blocks (1,2), (3,4)
    cache[[*first, 9, 9]] = _state([*first, 9, 9])
    assert cache.state_bytes == 700
    assert cache.stats()["states"] == 1 and cache.stats()["cached_blocks"] == 2
    hit = cache[[1, 2, 3, 7]]  # shares one block
    assert hit.n_tokens == 2 and hit.scores.shape == (1, 5)  # capped at the cached blocks
    assert [1, 2, 8] in cache and [5, 6] not in cache
    cache[[1, 2, 3, 7, 0]] = _state([1, 2, 3, 7, 0])  # chain (1,2),(3,7): a second state
    with pytest.raises(KeyError):
        cache[[5, 6, 7, 8, 9, 9]]  # 3 new blocks: evicts LRU leaves (3,4) and (3,7) ...
    assert cache.stats()["cached_blocks"] == 4
    assert list(cache._states) == [(1, 2)]  # ... and both states are cut back to (1, 2)
    assert list(cache.reused) == [0, 1, 0]


def test_caching_off_counts_lookups_and_declines_saves():
    _require_llama()
    from canopy.engines.llama_cache import PolicyStateCache

    off = PolicyStateCache(None, 1000, block_tokens=2, kv_bytes=10)
    assert not off  # the engine skips the lookup ... until a completion opens one
    off._lookup_open = True
    assert off
    with pytest.raises(KeyError):
        off[[1, 2, 3]]
    assert not off  # ... and the save after it
    assert off.stats()["requests"] == 1 and off.stats()["prompt_blocks"] == [1]


def test_bad_cache_configuration_is_named():
    _require_llama()
    from canopy.engines.llama_cache import PolicyStateCache

    with pytest.raises(ValueError, match="holds no block"):
        PolicyStateCache("lru", 100, block_tokens=16, kv_bytes=23040)
    with pytest.raises(ValueError, match="block_tokens"):
        PolicyStateCache("lru", 10**6, block_tokens=0, kv_bytes=23040)


def test_engine_server_requires_its_key(engine):
    from canopy.llm.local import LocalLlamaServer

    path, _, _ = engine
    key = secrets.token_urlsafe(16)
    with LocalLlamaServer(path, n_ctx=256, module="canopy.engines.llama_server", api_key=key,
                          extra_args=["--policy", "lru", "--capacity-mb", "2"]) as server:
        root = server.direct_url.removesuffix("/v1")
        assert httpx.get(f"{root}/v1/models").status_code == 401
        assert httpx.get(f"{root}/canopy/cache").status_code == 401
        stats = httpx.get(f"{root}/canopy/cache",
                          headers={"Authorization": f"Bearer {key}"}).json()
        assert stats["policy"] == "lru" and stats["capacity_blocks"] == 2 * 2**20 // (
            16 * 23040)
        assert key not in server.stderr_tail(10**6)


def test_live_caching_cuts_time_to_first_token_as_the_replay_predicts(engine):
    """Over real HTTP: the server's reuse equals the replay's request for request, caching
    cuts the median per-request TTFT (64 of 77 prompt tokens cached on a full hit), and the
    calibrated replay predicts the time saved to within a factor of 3. Medians of the
    per-request savings (off minus lru on the same prompt): a 24-request run on a shared
    machine sees scheduling spikes that move a mean by a third (docs/cache.md reports means
    over 3 x 80 requests)."""
    from canopy.apps.cache.live import run_live
    from canopy.engines.workloads import zipf_workload

    path, words, vocab = engine
    out = run_live(["off", "lru"], lambda s: zipf_workload(words, requests=24,
                                                          scenario="stationary", seed=s),
                   model_path=path, vocab=vocab, capacity_mb=6.0)
    off, lru = out["results"]["off"], out["results"]["lru"]
    assert off["replay_matches_server"] and lru["replay_matches_server"]
    assert off["hit_rate"] == 0 and lru["hit_rate"] > 0.3
    # not the p50 of all requests: with about half of them hits it sits at the hit/miss
    # boundary and moved to 0.293 vs 0.307 s on a loaded run; the paired median below holds
    assert out["calibration"]["ms_per_token"] > 0
    saved = lru["ttft_saved_s"]["mean"]
    # means, not medians: about half the requests are hits, so a median of per-request savings
    # (measured or predicted) sits at the hit/miss boundary too (predicted/measured medians
    # went to 3.2 on one run). The same order only: the least-squares fit moves with the
    # machine's load (idle: within 10%, docs/cache.md), so the accuracy is a measured figure
    # in the docs, not a claim this test can hold on a shared machine
    assert saved > 0 and 1 / 3 <= lru["predicted_ttft_saved_s"] / saved <= 3
    assert lru["unbacked"] == 0 and lru["state_bytes"] > 0


def test_live_cli_writes_a_calibration_that_replay_uses(engine, tmp_path):
    calibration = tmp_path / "calibration.json"
    runner = CliRunner()
    result = runner.invoke(app, ["cache", "live", "--policies", "lru,canopy,optimal",
                                 "--requests", "8",
                                 "--scenario", "stationary", "--json", "--calibration-out",
                                 str(calibration)])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert set(out["results"]) == {"lru", "canopy", "optimal"}  # optimal: from the plan
    for entry in out["results"].values():
        assert {"ttft_p50_s", "ttft_mean_s", "hit_rate", "requests"} <= set(entry)
        assert entry["requests"] == 8 and entry["replay_matches_server"]
    trace = tmp_path / "log.jsonl"
    trace.write_text("".join(json.dumps(list(range(i % 3, i % 3 + 40))) + "\n"
                             for i in range(30)))
    result = runner.invoke(app, ["cache", "replay", "--trace", str(trace), "--capacity", "8",
                                 "--policies", "lru", "--calibration", str(calibration),
                                 "--json"])
    assert result.exit_code == 0, result.output
    model = json.loads(result.output)["ttft_model"]
    assert model["source"] == str(calibration)
    assert model["ms_per_token"] == pytest.approx(out["calibration"]["ms_per_token"])


def test_live_cli_rejects_bad_options_in_one_line():
    runner = CliRunner()
    for args, message in ((["--policies", "belady"], "--policies"),
                          (["--scenario", "rush"], "--scenario"),
                          (["--workload", "nope"], "--workload"),
                          (["--requests", "1"], "--requests"),
                          (["--capacity-mb", "0"], "--capacity-mb")):
        result = runner.invoke(app, ["cache", "live", *args])
        assert result.exit_code == 2 and message in result.output, (args, result.output)


def test_replay_only_needs_no_engine_and_shows_lfu_stuck_after_the_shift(engine):
    """The replay of the live workload (tokenizer only, no server): after the popularity
    shift LFU's stale counts hold the cache (Mooncake's lesson, here in 200 requests), while
    canopy, which starts on recency, equals LRU until its shadows show a lead."""
    result = CliRunner().invoke(app, ["cache", "live", "--replay-only", "--policies",
                                      "lru,lfu,canopy", "--capacity-mb", "4", "--requests",
                                      "80", "--repeats", "3", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["capacity_blocks"] == 11
    lru, lfu, canopy = (np.array(out["results"][p]) for p in ("lru", "lfu", "canopy"))
    assert np.all(lfu < 0.6 * lru)
    assert np.array_equal(canopy, lru)


def test_live_plot_is_written(tmp_path):
    pytest.importorskip("matplotlib")
    from canopy.apps.cache.cli import _plot_live

    entry = {"ttft_mean_s": 0.4, "ttft_p50_s": 0.43}
    out = {"workload": "zipf-shift", "results": {"off": {**entry, "ttft_mean_s": 0.7},
                                                "lru": entry}}
    file = tmp_path / "ttft.png"
    _plot_live(out, file)
    assert file.stat().st_size > 1000


def test_gain_over_lru_is_paired_by_request():
    """A policy 10 ms faster than LRU on every request, under noise shared by the pair (the
    same prompt at the same position): the paired gain is 10 ms with a tight interval, while
    the noise (200 ms across requests) would swamp an unpaired comparison."""
    from canopy.apps.cache.live import LiveRun, summarize
    from canopy.prefix.ttft import TTFTModel

    rng = np.random.default_rng(0)

    def run(ttft: np.ndarray) -> LiveRun:
        n = len(ttft)
        return LiveRun("p", start=10, ttft_s=list(ttft), total_s=list(ttft), wall_s=1.0,
                       server={"reused_blocks": [1] * n, "prompt_blocks": [2] * n,
                               "block_tokens": 16, "state_bytes": 0, "unbacked": 0})

    shared = [rng.uniform(0.1, 0.5, 200) for _ in range(3)]
    lru = [run(s + rng.normal(0, 0.001, 200)) for s in shared]
    fast = [run(s - 0.010 + rng.normal(0, 0.001, 200)) for s in shared]
    predicted = [np.ones(200)] * 3
    model = TTFTModel(ms_per_token=1.0, overhead_ms=0.0)
    gain = summarize(fast, predicted, None, model, lru)["ttft_vs_lru_s"]
    assert gain["mean"] == pytest.approx(0.010, abs=5e-4)
    low, high = gain["ci95"]
    assert low < 0.010 < high and high - low < 0.001
    assert len(gain["per_repeat"]) == 3 and gain["ci95_repeats"][0] > 0
    assert "ttft_vs_lru_s" not in summarize(lru, predicted, None, model, lru)


def _engine_pids(parent: int) -> list[int]:
    from canopy.engines.processes import descendants

    out = []
    for pid in descendants(parent):
        try:
            command = open(f"/proc/{pid}/cmdline", "rb").read()
        except OSError:
            continue
        if b"canopy.engines.llama_server" in command:
            out.append(pid)
    return out


@pytest.mark.parametrize(("signum", "group"), [("SIGTERM", True), ("SIGTERM", False),
                                               ("SIGINT", True)])
def test_no_engine_outlives_a_stopped_command(engine, signum, group):
    """``timeout`` (SIGTERM to the process group), ``kill`` (SIGTERM to the command) and
    Ctrl-C (SIGINT to the group) end the command and its engine: the engine runs in the
    command's process group and the command stops it on the way out."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from canopy.engines.processes import alive as _alive

    command = subprocess.Popen(
        [sys.executable, "-m", "canopy", "cache", "live", "--requests", "400", "--policies",
         "off", "--threads", "1", "--json"], stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not (pids := _engine_pids(command.pid)):
            assert command.poll() is None and time.monotonic() < deadline, "no engine started"
            time.sleep(0.2)
        assert os.getpgid(pids[0]) == command.pid  # in the command's process group
        time.sleep(2.0)  # let it serve
        sent = getattr(signal, signum)
        if group:
            os.killpg(command.pid, sent)
        else:
            command.send_signal(sent)
        command.wait(timeout=120)
        deadline = time.monotonic() + 60
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(_alive(p) for p in pids), f"engine {pids} outlived the command"
    finally:
        if command.poll() is None:
            os.killpg(command.pid, signal.SIGKILL)
            command.wait()


def test_threads_are_bounded_by_the_cores():
    result = CliRunner().invoke(app, ["cache", "live", "--threads", "100000"])
    assert result.exit_code == 2 and "--threads must be at most" in result.output


def test_the_default_threads_fit_a_one_core_process(monkeypatch):
    """On a machine (or under ``taskset``) with one core, the defaults run: the engine gets
    the one core instead of refusing the command's own default of two."""
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0})
    result = CliRunner().invoke(app, ["cache", "live", "--engine", "vllm", "--replay-only",
                                      "--policies", "vllm", "--requests", "4", "--repeats",
                                      "1", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["results"]["vllm"]
