"""``canopy fleet bench`` on live engines: two llama.cpp replicas behind Canopy's gateway
(approximate), sglang-router and the client's round-robin (about two minutes on two cores),
and two vLLM replicas (its environment: ``.ci/vllm.sh``, or ``CANOPY_VLLM_PYTHON``) publishing
their KV events to Canopy's gateway (precise; two vLLM starts, under two minutes)."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

from canopy.apps.fleet import bench
from helpers import IN_CI

pytestmark = pytest.mark.live


def _peer(name: str) -> None:
    if not (shutil.which(name) or (Path(sys.executable).parent / name).is_file()):
        pytest.skip(f"{name} is not installed ({bench.INSTALL}; extra 'peers')")


def test_llama_replicas_behind_canopy_sglang_router_and_round_robin(tmp_path):
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python is not installed (extra 'engine')")
    pytest.importorskip("uvicorn")
    _peer("sglang-router")
    out = bench.run_bench(engine="llama", replicas=2,
                          routers=["canopy", "sglang-router", "round-robin"],
                          workload="zipf", requests=24, concurrency=1, repeats=1,
                          trace_out=tmp_path / "stream.jsonl")
    results, sim = out["results"], out["simulator"]["results"]
    assert {r["lost"] for r in results.values()} == {0}
    # a prefix-aware router keeps each few-shot prefix on one replica: more hits
    for router in ("canopy", "sglang-router"):
        assert results[router]["hit_rate"] > results["round-robin"]["hit_rate"] + 0.05
    # one request at a time: the simulator's round-robin over the same LRU caches hits as
    # the engines did
    assert abs(sim["round-robin"]["hit_rate"] - results["round-robin"]["hit_rate"]) < 0.05
    assert len((tmp_path / "stream.jsonl").read_text().splitlines()) == 24
    assert out["simulator"]["engine"] == "serial"
    # llama.cpp's own TTFT line, measured one request at a time: its prefill takes time a
    # token, so the gateway plays the fitted overhead rather than its default
    assert out["calibration"] is not None and out["calibration"]["ms_per_token"] > 0


def test_vllm_replicas_behind_a_precise_canopy_gateway_predict_cached_tokens():
    """Two vLLM replicas publishing their KV events to Canopy's gateway, a pool small enough
    that they evict (14 cached blocks each, for a stream of 40 distinct blocks), one request
    at a time: the index predicts each request's cached tokens as vLLM reports them."""
    from canopy.engines.vllm_server import VLLMServerError, vllm_python

    pytest.importorskip("zmq")
    pytest.importorskip("uvicorn")
    try:
        vllm_python()
    except VLLMServerError:
        if IN_CI:
            pytest.fail("vLLM missing in CI: run .ci/vllm.sh")
        pytest.skip("vLLM's environment is missing (.ci/vllm.sh, or CANOPY_VLLM_PYTHON)")
    out = bench.run_bench(engine="vllm", replicas=2, routers=["canopy"], workload="zipf",
                          requests=48, concurrency=1, repeats=1, blocks=16)
    entry = out["results"]["canopy"]
    assert entry["lost"] == 0 and entry["index"] == "precise"
    # a batched engine: the gateway charges a queued request its tokens, no overhead
    assert entry["overhead_tokens"] == 0.0 and out["simulator"]["engine"] == "batched"
    assert out["distinct_blocks"] > 2 * (16 - 2)  # the replicas had to evict
    assert entry["hit_rate"] > 0.2
    # the engines' counters and their per-answer reports agree
    assert abs(entry["reported_hit_rate"] - entry["hit_rate"]) < 0.05
    assert entry["cached_prediction"]["requests"] == 48
    assert entry["cached_prediction"]["exact"] >= 0.95
