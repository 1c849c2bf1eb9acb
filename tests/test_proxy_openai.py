"""The routing proxy's OpenAI surface, driven by the official ``openai`` client over real
HTTP on 127.0.0.1: ``/v1/models``, ``/v1/chat/completions``, ``/v1/completions`` (routed like
chat, streamed too) and ``/v1/embeddings`` (passed through); and the shipped example
configuration."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("openai")

import openai

from canopy.apps.routing.proxy.app import create_app, serve_in_thread
from canopy.apps.routing.proxy.config import ProxyConfig
from llm_server import ScriptedServer

KEY = "openai-client-key-3"
ADMIN = "openai-admin-key-4"
PRICES = {"version": "test-1", "models": {"small": {"input": 1.0, "output": 1.0},
                                          "large": {"input": 50.0, "output": 50.0}}}
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "router.json"


def _completion(text: str) -> bytes:
    return ScriptedServer.completion_body(text, prompt_tokens=4, completion_tokens=2)


def _text_events() -> bytes:
    chunks = [{"object": "text_completion", "choices": [{"index": 0, "text": word}]}
              for word in ("one", " two")]
    chunks.append({"object": "text_completion", "choices": [],
                   "usage": {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6}})
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + \
        b"data: [DONE]\n\n"


@pytest.fixture
def served(tmp_path, upstreams, monkeypatch):
    """The proxy over two scripted chat/completions upstreams and one embedding upstream
    (its key from ``EMBED_KEY``); yields ``(openai client, proxy URL, embedder)``."""
    monkeypatch.setenv("OPENAI_TEST_CLIENT", KEY)
    monkeypatch.setenv("OPENAI_TEST_ADMIN", ADMIN)
    monkeypatch.setenv("EMBED_KEY", "embed-upstream-secret")
    for number, server in enumerate(upstreams):
        server.routes["/v1/completions"] = (
            lambda _, n=number: (200, _completion(f"completion {n}"), 0.0))
    embedder = ScriptedServer().start()
    embedder.routes["/v1/embeddings"] = lambda _: (200, json.dumps({
        "object": "list", "model": "upstream-name",
        "data": [{"object": "embedding", "index": 0, "embedding": [0.5, -0.25, 1.0]}],
        "usage": {"prompt_tokens": 2, "total_tokens": 2}}).encode(), 0.0)
    cfg = ProxyConfig.from_mapping(
        {"upstreams": [{"model": m, "base_url": s.url("/v1")}
                       for m, s in zip(("small", "large"), upstreams, strict=True)],
         "embeddings": [{"model": "embed", "base_url": embedder.url("/v1"),
                         "upstream_model": "bge-small", "api_key_env": "EMBED_KEY"}],
         "state_path": "router.sqlite", "lam": 1.0, "prices": PRICES,
         "auth": {"client_key_env": "OPENAI_TEST_CLIENT", "admin_key_env": "OPENAI_TEST_ADMIN"}},
        base=tmp_path)
    with serve_in_thread(create_app(cfg)) as url:
        yield openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0), url, embedder
    embedder.close()


def test_models_lists_auto_and_every_routable_model(served):
    client, url, _ = served
    assert [m.id for m in client.models.list()] == ["auto", "small", "large", "embed"]
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0).models.list()


def test_text_completions_are_routed_like_chat(served, upstreams):
    client, url, _ = served
    answer = client.completions.create(model="auto", prompt="Say one two", max_tokens=4)
    assert answer.choices[0].text.startswith("completion ")
    assert answer.model in ("small", "large")
    pinned = client.completions.create(model="large", prompt=["a", "b"], max_tokens=4)
    assert pinned.choices[0].text == "completion 1" and pinned.model == "large"
    asked = [b for s in upstreams for b in s.bodies if b and "prompt" in b]
    assert {b["model"] for b in asked} <= {"small", "large"} and all(
        "canopy" not in b for b in asked)
    # the request id works for feedback, as for chat
    raw = client.completions.with_raw_response.create(model="auto", prompt="x", max_tokens=1)
    rid = raw.headers["X-Canopy-Request-Id"]
    rated = httpx.post(url + "/v1/feedback", json={"request_id": rid, "quality": 0.5},
                       headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30)
    assert rated.status_code == 200, rated.text
    with pytest.raises(openai.BadRequestError, match="prompt"):
        client.completions.create(model="auto", prompt=[], max_tokens=1)
    with pytest.raises(openai.BadRequestError, match="unknown model"):
        client.completions.create(model="gpt-nope", prompt="x", max_tokens=1)


def test_text_completions_stream_through(served, upstreams):
    client, _, _ = served
    for server in upstreams:
        server.routes["/v1/completions"] = lambda _: (200, _text_events(), 0.0)
    stream = client.completions.create(model="auto", prompt="count", max_tokens=4,
                                       stream=True)
    assert "".join(c.choices[0].text for c in stream if c.choices) == "one two"


def test_chat_and_embeddings_through_the_openai_client(served):
    client, _, embedder = served
    chat = client.chat.completions.create(model="auto", messages=[
        {"role": "user", "content": "hi"}], max_tokens=2)
    assert chat.choices[0].message.content.startswith("answer ")
    vector = client.embeddings.create(model="embed", input="hello")
    assert vector.data[0].embedding == [0.5, -0.25, 1.0] and vector.model == "embed"
    sent = embedder.bodies[-1]
    assert sent["model"] == "bge-small" and sent["input"] == "hello"
    with pytest.raises(openai.BadRequestError, match="unknown embedding model"):
        client.embeddings.create(model="small", input="hello")
    embedder.routes["/v1/embeddings"] = lambda _: (
        500, b'{"error": "boom at http://10.1.2.3 key embed-upstream-secret"}', 0.0)
    with pytest.raises(openai.APIStatusError) as failed:
        client.embeddings.create(model="embed", input="hello")
    assert failed.value.status_code == 502
    assert "10.1.2.3" not in failed.value.response.text
    assert "embed-upstream-secret" not in failed.value.response.text


def test_the_example_configuration_builds_and_every_key_is_documented(tmp_path,
                                                                       monkeypatch):
    """examples/router.json builds a proxy once the variables it names are set; every key
    of the configuration (and of each section) is named in docs/routing.md."""
    import re

    from canopy.apps.routing.proxy.config import AuthConfig, Limits, Upstream
    from canopy.regional.sources import RegionConfig

    data = json.loads(EXAMPLE.read_text())
    for name in ("CANOPY_CLIENT_KEY", "CANOPY_ADMIN_KEY"):
        monkeypatch.setenv(name, "k" * 32)
    cfg = ProxyConfig.from_mapping(data, base=tmp_path)
    assert any(u.api_key_env for u in cfg.upstreams)
    create_app(cfg)
    docs = (Path(__file__).resolve().parents[1] / "docs" / "routing.md").read_text()
    keys = {"upstreams", "state_path", "lam", "learner", "sharing", "delta", "kappa",
            "explore", "deadline_s", "prices", "region", "auth", "limits", "embeddings"}
    for cls in (Upstream, Limits, AuthConfig, RegionConfig):
        keys |= set(cls.__dataclass_fields__)
    missing = sorted(k for k in keys if not re.search(rf"`(\w+\.)?{k}`", docs))
    assert not missing, f"undocumented configuration keys: {missing}"
