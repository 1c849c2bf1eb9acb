"""Streaming through the routing proxy: server-sent events passed through, failover only
before the first byte, cost recorded from the final usage chunk (or estimated); against a
scripted upstream and, with the official ``openai`` client, a real llama-cpp server."""

from __future__ import annotations

import json

import httpx
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from canopy.apps.routing.proxy.app import create_app, serve_in_thread
from canopy.apps.routing.proxy.config import ProxyConfig
from llm_server import ScriptedServer

KEY = "stream-admin-key-9"
PRICES = {"version": "test-1", "models": {"small": {"input": 1.0, "output": 1.0},
                                          "large": {"input": 50.0, "output": 50.0}}}
ASK = {"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 8, "stream": True}


def _events(usage: bool) -> bytes:
    chunks = [{"choices": [{"index": 0, "delta": {"content": word}}]}
              for word in ("Hello", " there")]
    if usage:
        chunks.append({"choices": [], "usage": {"prompt_tokens": 1000,
                                                "completion_tokens": 1000}})
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + \
        b"data: [DONE]\n\n"


def _config(tmp_path, urls) -> ProxyConfig:
    return ProxyConfig.from_mapping(
        {"upstreams": [{"model": m, "base_url": u, "upstream_model": "smollm2-135m",
                        "timeout_s": 120} for m, u in zip(("small", "large"), urls,
                                                          strict=True)],
         "state_path": "router.sqlite", "lam": 1.0, "prices": PRICES, "deadline_s": 180,
         "auth": {"admin_key_env": "STREAM_ADMIN_KEY"}}, base=tmp_path)


@pytest.fixture(autouse=True)
def key(monkeypatch):
    monkeypatch.setenv("STREAM_ADMIN_KEY", KEY)


def test_events_pass_through_with_failover_before_the_first_byte(tmp_path):
    broken, good = ScriptedServer().start(), ScriptedServer().start()
    broken.routes["/v1/chat/completions"] = lambda _: (500, b'{"error": "down"}', 0.0)
    good.routes["/v1/chat/completions"] = lambda n: (200, _events(usage=n == 0), 0.0)
    try:
        cfg = _config(tmp_path, [broken.url("/v1"), good.url("/v1")])
        headers = {"Authorization": f"Bearer {KEY}"}
        with serve_in_thread(create_app(cfg)) as url, httpx.Client(
                base_url=url, headers=headers, timeout=30) as client:
            costs = []
            for usage in (True, False):
                with client.stream("POST", "/v1/chat/completions", json=ASK) as answer:
                    assert answer.status_code == 200
                    assert answer.headers["content-type"].startswith("text/event-stream")
                    assert answer.headers["X-Canopy-Model"] == "large"
                    assert b"".join(answer.iter_raw()) == _events(usage)
                    rid = answer.headers["X-Canopy-Request-Id"]
                rated = client.post("/v1/feedback", json={"request_id": rid, "quality": 1.0})
                assert rated.status_code == 200
                costs.append(1.0 - rated.json()["reward"])  # lam = 1: reward = q - cost
        assert good.bodies[0]["stream"] is True
        assert good.bodies[0]["stream_options"] == {"include_usage": True}
        # from the usage chunk: 2,000 tokens at $50/M; without one, estimated (a few tokens)
        assert costs[0] == pytest.approx(0.1)
        assert 0 < costs[1] < 1e-3
    finally:
        broken.close()
        good.close()


def test_an_empty_stream_counts_as_a_failure_and_the_next_model_streams(tmp_path):
    """Chats and streams share one failover loop: an upstream whose stream ends before its
    first byte is a failed attempt (counted against it), and the next model streams."""
    empty, good = ScriptedServer().start(), ScriptedServer().start()
    empty.routes["/v1/chat/completions"] = lambda _: (200, b"", 0.0)
    good.routes["/v1/chat/completions"] = lambda _: (200, _events(usage=True), 0.0)
    try:
        cfg = _config(tmp_path, [empty.url("/v1"), good.url("/v1")])
        headers = {"Authorization": f"Bearer {KEY}"}
        with serve_in_thread(create_app(cfg)) as url, httpx.Client(
                base_url=url, headers=headers, timeout=30) as client:
            with client.stream("POST", "/v1/chat/completions", json=ASK) as answer:
                assert answer.status_code == 200
                assert answer.headers["X-Canopy-Model"] == "large"
                assert b"".join(answer.iter_raw()) == _events(True)
            metrics = client.get("/metrics").text
        assert 'canopy_failovers_total{model="small"} 1.0' in metrics
        assert empty.counts["/v1/chat/completions"] == 1
    finally:
        empty.close()
        good.close()


@pytest.mark.live
def test_the_openai_client_streams_through_the_proxy(tmp_path, llm_server):
    openai = pytest.importorskip("openai")
    cfg = _config(tmp_path, [llm_server.base_url, llm_server.base_url])
    with serve_in_thread(create_app(cfg)) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)
        stream = client.chat.completions.create(
            model="auto", messages=[{"role": "user", "content": "Count: 1, 2, 3,"}],
            max_tokens=8, temperature=0.0, stream=True)
        text = "".join(chunk.choices[0].delta.content or "" for chunk in stream
                       if chunk.choices)
        plain = client.chat.completions.create(
            model="auto", messages=[{"role": "user", "content": "Count: 1, 2, 3,"}],
            max_tokens=8, temperature=0.0)
        stats = httpx.get(url + "/v1/router/stats", timeout=30,
                          headers={"Authorization": f"Bearer {KEY}"}).json()
    assert text.strip() and text == plain.choices[0].message.content
    assert stats["requests"] == 2
