"""LLMClient against real HTTP on loopback: the SmolLM2 llama-cpp server for the happy path and
the cache, a scripted server of our own for errors, retries, malformed bodies and timeouts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from canopy.llm import (
    LLMClient,
    LLMConnectionError,
    LLMResponseError,
    LLMServerError,
    LLMTimeoutError,
    ResponseCache,
)
from canopy.llm.local import free_port

CHAT = "/v1/chat/completions"
ASK = [{"role": "user", "content": "What is 2 + 3? Answer with a number."}]


# ---------------------------------------------------------------------- live server
@pytest.mark.live
def test_chat_records_usage_and_cache_issues_no_new_requests(llm_server, llm_client):
    before = llm_server.request_count
    first = llm_client.chat(ASK, max_tokens=12)
    assert isinstance(first.text, str) and first.text
    assert not first.cached
    assert first.prompt_tokens > 5 and 0 < first.completion_tokens <= 12
    assert llm_client.usage.calls == 1
    assert llm_client.usage.prompt_tokens == first.prompt_tokens
    assert llm_client.usage.completion_tokens == first.completion_tokens
    assert llm_server.request_count == before + 1

    again = llm_client.chat(ASK, max_tokens=12)
    assert again.cached and again.text == first.text
    assert llm_server.request_count == before + 1  # the server saw nothing new
    assert llm_client.usage.calls == 1 and llm_client.usage.cache_hits == 1
    assert llm_client.usage.cached_completion_tokens == first.completion_tokens

    # a different parameter is a different request
    llm_client.chat(ASK, max_tokens=12, seed=7, temperature=0.8)
    assert llm_server.request_count == before + 2


@pytest.mark.live
def test_cache_survives_a_new_client(llm_server, tmp_path):
    kwargs = {"model": llm_server.model, "api_key_env": None, "cache_dir": tmp_path}
    with LLMClient(llm_server.base_url, **kwargs) as client:
        first = client.complete("The capital of France is", max_tokens=6, temperature=0.0)
    before = llm_server.request_count
    with LLMClient(llm_server.base_url, **kwargs) as client:
        again = client.complete("The capital of France is", max_tokens=6, temperature=0.0)
        assert client.usage.calls == 0 and client.usage.cache_hits == 1
    assert again.text == first.text and again.cached
    assert llm_server.request_count == before


@pytest.mark.live
def test_seeded_sampling_is_reproducible_and_seeds_differ(llm_server):
    with LLMClient(llm_server.base_url, model=llm_server.model, api_key_env=None) as client:
        texts = [client.complete("Once upon a time", max_tokens=10, temperature=1.0,
                                 seed=seed).text for seed in (1, 1, 2, 3)]
    assert texts[0] == texts[1]
    assert len(set(texts[1:])) > 1


# ---------------------------------------------------------------------- failures
def test_unreachable_endpoint_raises_after_retries():
    client = LLMClient(f"http://127.0.0.1:{free_port()}/v1", model="m", max_retries=2,
                       backoff=0.0, timeout=2.0)
    with pytest.raises(LLMConnectionError, match="cannot reach"):
        client.chat(ASK)
    assert client.usage.retries == 2 and client.usage.errors == 1 and client.usage.calls == 0


def test_server_error_is_retried_then_reported(scripted_server):
    scripted_server.routes[CHAT] = lambda n: (500, b'{"error": "boom"}', 0.0)
    client = LLMClient(scripted_server.url("/v1"), model="m", max_retries=2, backoff=0.0)
    with pytest.raises(LLMServerError, match="HTTP 500") as caught:
        client.chat(ASK)
    assert caught.value.status == 500
    assert scripted_server.counts[CHAT] == 3


def test_transient_error_recovers_and_counts_the_retry(scripted_server):
    scripted_server.routes[CHAT] = lambda n: (503, b"busy", 0.0) if n == 0 else (
        200, scripted_server.chat_body("5", prompt_tokens=11, completion_tokens=2), 0.0)
    client = LLMClient(scripted_server.url("/v1"), model="m", max_retries=1, backoff=0.0)
    answer = client.chat(ASK)
    assert answer.text == "5" and answer.prompt_tokens == 11
    assert client.usage.retries == 1 and client.usage.calls == 1
    assert client.usage.prompt_tokens == 11 and client.usage.completion_tokens == 2


def test_client_error_is_not_retried(scripted_server):
    scripted_server.routes[CHAT] = lambda n: (400, b'{"error": "bad model"}', 0.0)
    client = LLMClient(scripted_server.url("/v1"), model="m", max_retries=3, backoff=0.0)
    with pytest.raises(LLMServerError, match="HTTP 400"):
        client.chat(ASK)
    assert scripted_server.counts[CHAT] == 1


@pytest.mark.parametrize("body, match", [
    (b"<html>not json</html>", "not JSON"),
    (b"[1, 2]", "not an object"),
    (b'{"choices": []}', "no 'choices'"),
    (b'{"choices": [{"message": {"role": "assistant"}}]}', "no text"),
    (json.dumps({"choices": [{"message": {"content": "x"}}],
                 "usage": {"prompt_tokens": "many"}}).encode(), "not a count"),
])
def test_malformed_response_is_a_clear_error_and_not_cached(scripted_server, tmp_path, body,
                                                            match):
    scripted_server.routes[CHAT] = lambda n: (200, body, 0.0)
    client = LLMClient(scripted_server.url("/v1"), model="m", cache_dir=tmp_path)
    with pytest.raises(LLMResponseError, match=match):
        client.chat(ASK)
    assert len(client.cache) == 0 and client.usage.calls == 0


def test_timeout_raises_instead_of_hanging(scripted_server):
    scripted_server.routes[CHAT] = lambda n: (200, scripted_server.chat_body("late"), 1.5)
    client = LLMClient(scripted_server.url("/v1"), model="m", timeout=0.3, max_retries=1,
                       backoff=0.0)
    with pytest.raises(LLMTimeoutError, match="timed out"):
        client.chat(ASK)
    assert scripted_server.counts[CHAT] == 2


def test_api_key_comes_from_the_named_environment_variable(scripted_server, monkeypatch):
    scripted_server.routes[CHAT] = lambda n: (200, scripted_server.chat_body("ok"), 0.0)
    client = LLMClient(scripted_server.url("/v1"), model="m", api_key_env="CANOPY_TEST_KEY")
    monkeypatch.setenv("CANOPY_TEST_KEY", "sekret")
    assert client._headers() == {"Authorization": "Bearer sekret"}
    assert client.chat(ASK).text == "ok"
    monkeypatch.delenv("CANOPY_TEST_KEY")
    assert client._headers() == {}
    assert scripted_server.bodies[-1]["model"] == "m"


def test_cache_key_depends_on_model_prompt_and_parameters():
    base = ResponseCache.key("completions", {"model": "a", "prompt": "p", "temperature": 0})
    assert base == ResponseCache.key("completions", {"temperature": 0, "prompt": "p",
                                                     "model": "a"})
    for changed in ({"model": "b", "prompt": "p", "temperature": 0},
                    {"model": "a", "prompt": "q", "temperature": 0},
                    {"model": "a", "prompt": "p", "temperature": 1}):
        assert ResponseCache.key("completions", changed) != base
    assert ResponseCache.key("chat/completions", {"model": "a", "prompt": "p",
                                                  "temperature": 0}) != base


@pytest.mark.parametrize("kwargs, match", [
    ({"base_url": "127.0.0.1:80"}, "base_url"),
    ({"model": ""}, "model"),
    ({"timeout": 0}, "timeout"),
    ({"max_retries": -1}, "max_retries"),
])
def test_bad_configuration_is_rejected(kwargs, match):
    config = {"base_url": "http://127.0.0.1:1/v1", "model": "m", **kwargs}
    with pytest.raises(ValueError, match=match):
        LLMClient(config.pop("base_url"), **config)


def test_bad_messages_are_rejected():
    client = LLMClient("http://127.0.0.1:1/v1", model="m")
    with pytest.raises(TypeError):
        client.chat("hello")
    with pytest.raises(ValueError, match="message 0"):
        client.chat([{"role": "user"}])
    with pytest.raises(ValueError, match="stream"):
        client.complete("x", stream=True)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_local_server_dies_with_its_parent_even_while_it_ignores_sigterm(tmp_path):
    """The local server's child is killed when the process that started it dies, even a
    child that does not act on SIGTERM (llama.cpp's server while it loads its model)."""
    from canopy.engines.processes import alive as _alive

    pid_file = tmp_path / "child.pid"
    parent = (
        "import subprocess, sys, time\n"
        "from canopy.llm.local import _die_with_parent\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import os, signal, sys, time; "
        "signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "open(sys.argv[1], \"w\").write(str(os.getpid())); time.sleep(120)', "
        f"{str(pid_file)!r}], preexec_fn=_die_with_parent)\n"
        "time.sleep(120)\n")
    started = subprocess.Popen([sys.executable, "-c", parent])
    deadline = time.monotonic() + 60
    while not (pid_file.exists() and pid_file.read_text()):
        assert time.monotonic() < deadline and started.poll() is None
        time.sleep(0.05)
    child = int(pid_file.read_text())
    os.kill(started.pid, signal.SIGKILL)
    started.wait(timeout=30)
    deadline = time.monotonic() + 30
    try:
        while _alive(child):
            assert time.monotonic() < deadline, f"the child {child} outlived its parent"
            time.sleep(0.05)
    finally:
        if _alive(child):
            os.kill(child, signal.SIGKILL)

