"""Asynchronous pass-through of OpenAI-compatible chat requests, for proxies.

:class:`~canopy.llm.client.LLMClient` is synchronous, builds its own request body and has one
timeout per client; a routing proxy needs to forward a caller's body unchanged (bar the model
name), within a per-request deadline, from an event loop. :class:`AsyncPassthrough` does that
on ``httpx.AsyncClient``, reusing the client's error classes, response parsing and
:class:`~canopy.llm.client.Usage` record. No retries: the caller decides what to try next.
A whole (non-streamed) answer from a plain ``http://`` upstream that no proxy setting of the
environment covers goes through the lean client of :mod:`canopy.llm.http1` when httptools
is installed (the ``serve`` extra), its body written and read by orjson: a small fraction of
``httpx``'s cost per call.
"""

from __future__ import annotations

import contextlib
import os
import threading
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import httpx
import orjson

from canopy.llm.client import (
    AnswerTooLarge,
    LLMConnectionError,
    LLMError,
    LLMResponse,
    LLMResponseError,
    LLMServerError,
    LLMTimeoutError,
    Usage,
    _json_body,
    _parse,
)
from canopy.validation import check_count, check_http_url, check_number, check_text

__all__ = ["AnswerTooLarge", "AsyncPassthrough"]


class AsyncPassthrough:
    """Forward OpenAI-compatible bodies to ``{base_url}/{endpoint}`` as ``model``
    (``chat/completions``, ``completions``, ``embeddings``).

    Args:
        base_url: the API root, e.g. ``http://127.0.0.1:8000/v1``.
        model: the model name the upstream expects (replaces the caller's).
        api_key_env: environment variable holding the API key (none sent when unset).
        max_connections: connection pool size.
        max_answer_bytes: the largest answer read (:class:`AnswerTooLarge` past it; never
            held whole in memory).
    """

    def __init__(self, base_url: str, *, model: str, api_key_env: str | None = None,
                 max_connections: int = 64, max_answer_bytes: int = 16 << 20) -> None:
        self.base_url = check_http_url(base_url, "base_url").rstrip("/")
        self.model = check_text(model, "model")
        self.api_key_env = api_key_env
        self.max_answer_bytes = check_count(max_answer_bytes, "max_answer_bytes")
        self.usage = Usage()
        self._lock = threading.Lock()
        self._http = httpx.AsyncClient(limits=httpx.Limits(
            max_connections=max_connections, max_keepalive_connections=max_connections))
        self._lean: Any = None
        if self.base_url.startswith("http://") and not _proxied(self.base_url):
            with contextlib.suppress(ImportError):  # httptools: the serve extra
                from canopy.llm.http1 import Http1Pool

                self._lean = Http1Pool(self.base_url, max_connections=max_connections)
                self._root = httpx.URL(self.base_url).raw_path.decode("ascii").rstrip("/")

    @property
    def whole_deadline(self) -> bool:
        """Whether :meth:`chat` holds its ``timeout`` over the whole call (the lean client,
        with one timer), not per read as ``httpx`` does."""
        return self._lean is not None

    async def chat(self, body: Mapping[str, Any], *, timeout: float,
                   endpoint: str = "chat/completions",
                   written: Callable[[], None] | None = None) -> LLMResponse:
        """POST ``body`` (with ``model`` replaced) to ``endpoint`` (``chat/completions`` or
        ``completions``) and parse the answer; raises :class:`~canopy.llm.client.LLMError`
        subclasses on failure, ``ValueError`` for a streaming request or a bad timeout.
        ``written``: as :meth:`post` calls it."""
        if body.get("stream"):
            raise ValueError("stream=True is not supported by the pass-through")
        raw = await self.post(endpoint, body, timeout=timeout, written=written)
        try:
            result = _parse(endpoint, raw, cached=False)
        except LLMResponseError:
            self._count_error()
            raise
        with self._lock:
            self.usage.calls += 1
            self.usage.prompt_tokens += result.prompt_tokens
            self.usage.completion_tokens += result.completion_tokens
        return result

    async def post(self, endpoint: str, body: Mapping[str, Any], *, timeout: float,
                   written: Callable[[], None] | None = None) -> dict[str, Any]:
        """POST ``body`` (with ``model`` replaced) to ``endpoint``; the answer's JSON object,
        read up to ``max_answer_bytes``. ``written`` (the caller's bookkeeping of the send)
        is called once: by the lean client once the request is written or the call failed
        before (:meth:`~canopy.llm.http1.Http1Pool.post`), through ``httpx`` before it is
        sent."""
        timeout = check_number(timeout, "timeout", low=0.0, low_open=True)
        url = f"{self.base_url}/{endpoint}"
        if self._lean is not None:
            try:
                status, content = await self._lean.post(
                    f"{self._root}/{endpoint}", orjson.dumps({**body, "model": self.model}),
                    self._headers(), timeout=timeout, cap=self.max_answer_bytes,
                    written=written)
                if status >= 400:
                    raise _server_error(url, status, content)
                return _json_body(url, content, orjson.loads)
            except LLMError:
                self._count_error()
                raise
        if written is not None:
            written()
        request = self._http.build_request("POST", url, json={**body, "model": self.model},
                                           headers=self._headers(),
                                           timeout=httpx.Timeout(timeout))
        try:
            with self._transport_errors(url, timeout):
                response = await self._http.send(request, stream=True)
                try:
                    await self._check_status(url, response)
                    content = await self._read(url, response)
                finally:
                    await response.aclose()
            return _json_body(url, content)
        except (LLMServerError, LLMResponseError):
            self._count_error()
            raise

    async def open_stream(self, body: Mapping[str, Any], *, timeout: float,
                          endpoint: str = "chat/completions") -> httpx.Response:
        """POST ``body`` with ``stream: true`` (asking for a final usage chunk) and return the
        open response once its status is known; an HTTP error status raises
        :class:`~canopy.llm.client.LLMServerError` (the start of its body read for the
        message, the response closed). The caller reads ``aiter_raw()`` and closes it."""
        url = f"{self.base_url}/{endpoint}"
        options = dict(body.get("stream_options") or {})
        payload = {**body, "model": self.model, "stream": True,
                   "stream_options": {**options, "include_usage": True}}
        request = self._http.build_request("POST", url, json=payload, headers=self._headers(),
                                           timeout=httpx.Timeout(timeout))
        with self._transport_errors(url, timeout):
            response = await self._http.send(request, stream=True)
        try:
            await self._check_status(url, response)
        except LLMServerError:
            await response.aclose()
            self._count_error()
            raise
        with self._lock:
            self.usage.calls += 1
        return response

    async def _check_status(self, url: str, response: httpx.Response) -> None:
        """:class:`LLMServerError` for an HTTP error status (its body's first bytes in the
        message, for the log)."""
        if response.status_code < 400:
            return
        start = b""
        async for chunk in response.aiter_raw():
            start += chunk
            if len(start) >= 300:
                break
        raise _server_error(url, response.status_code, start)

    async def _read(self, url: str, response: httpx.Response) -> bytes:
        """The answer's body, refused (:class:`AnswerTooLarge`) once over the cap."""
        cap = self.max_answer_bytes
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > cap:
            raise AnswerTooLarge(f"POST {url}: the answer declares {declared} bytes, over the "
                                 f"{cap}-byte cap")
        content = bytearray()
        async for chunk in response.aiter_bytes():
            content += chunk
            if len(content) > cap:
                raise AnswerTooLarge(f"POST {url}: the answer exceeds the {cap}-byte cap")
        return bytes(content)

    def _headers(self) -> dict[str, str]:
        key = os.environ.get(self.api_key_env) if self.api_key_env else None
        return {"Authorization": f"Bearer {key}"} if key else {}

    @contextlib.contextmanager
    def _transport_errors(self, url: str, timeout: float) -> Iterator[None]:
        """httpx's timeouts and transport failures as the client's errors (counted)."""
        try:
            yield
        except httpx.TimeoutException as error:
            self._count_error()
            raise LLMTimeoutError(f"POST {url} timed out after {timeout:.3g} s: {error}"
                                  ) from None
        except httpx.TransportError as error:
            self._count_error()
            raise LLMConnectionError(f"cannot reach {url}: {str(error) or type(error).__name__}"
                                     ) from None
        except AttributeError as error:
            # httpcore over anyio asks a socket closed while connecting for its peer (an
            # upstream going down under load): that is the upstream unreachable, not a bug here
            if error.name != "getpeername" or error.obj is not None:
                raise
            self._count_error()
            raise LLMConnectionError(f"cannot reach {url}: the connection closed while "
                                     "opening") from None

    def _count_error(self) -> None:
        with self._lock:
            self.usage.errors += 1

    async def aclose(self) -> None:
        await self._http.aclose()
        if self._lean is not None:
            self._lean.close()


def _proxied(url: str) -> bool:
    """Whether the environment sends ``url`` through an HTTP proxy (``HTTP_PROXY``, unless
    ``NO_PROXY`` names its host): then ``httpx``, which reads them, carries its calls."""
    proxies = urllib.request.getproxies()
    host = httpx.URL(url).host
    return bool(proxies.get("http") or proxies.get("all")) and not \
        urllib.request.proxy_bypass(host)


def _server_error(url: str, status: int, start: bytes) -> LLMServerError:
    """An HTTP error status as the client's error (its body's first bytes, for the log)."""
    return LLMServerError(f"POST {url} returned HTTP {status}: {start[:300]!r}", status)
