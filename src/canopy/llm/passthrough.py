"""Asynchronous pass-through of OpenAI-compatible chat requests, for proxies.

:class:`~canopy.llm.client.LLMClient` is synchronous, builds its own request body and has one
timeout per client; a routing proxy needs to forward a caller's body unchanged (bar the model
name), within a per-request deadline, from an event loop. :class:`AsyncPassthrough` does that
on ``httpx.AsyncClient``, reusing the client's error classes, response parsing and
:class:`~canopy.llm.client.Usage` record. No retries: the caller decides what to try next.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import httpx

from canopy.llm.client import (
    LLMConnectionError,
    LLMResponse,
    LLMResponseError,
    LLMServerError,
    LLMTimeoutError,
    Usage,
    _json_body,
    _parse,
)

__all__ = ["AsyncPassthrough"]

class AsyncPassthrough:
    """Forward chat-completion bodies to ``{base_url}/chat/completions`` as ``model``.

    Args:
        base_url: the API root, e.g. ``http://127.0.0.1:8000/v1``.
        model: the model name the upstream expects (replaces the caller's).
        api_key_env: environment variable holding the API key (none sent when unset).
        max_connections: connection pool size.
    """

    def __init__(self, base_url: str, *, model: str, api_key_env: str | None = None,
                 max_connections: int = 64) -> None:
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must be an http(s) URL, got {base_url!r}")
        if not isinstance(model, str) or not model:
            raise ValueError(f"model must be a non-empty string, got {model!r}")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key_env = api_key_env
        self.usage = Usage()
        self._lock = threading.Lock()
        self._http = httpx.AsyncClient(limits=httpx.Limits(max_connections=max_connections))

    async def chat(self, body: Mapping[str, Any], *, timeout: float) -> LLMResponse:
        """POST ``body`` (with ``model`` replaced) and parse the answer; raises
        :class:`~canopy.llm.client.LLMError` subclasses on failure, ``ValueError`` for a
        streaming request or a bad timeout."""
        if not (isinstance(timeout, (int, float)) and math.isfinite(timeout) and timeout > 0):
            raise ValueError(f"timeout must be a finite number of seconds > 0, got {timeout!r}")
        if body.get("stream"):
            raise ValueError("stream=True is not supported by the pass-through")
        url = f"{self.base_url}/chat/completions"
        payload = {**body, "model": self.model}
        try:
            with self._transport_errors(url, timeout):
                response = await self._http.post(url, json=payload, headers=self._headers(),
                                                 timeout=httpx.Timeout(timeout))
            if response.status_code >= 400:
                raise LLMServerError(f"POST {url} returned HTTP {response.status_code}: "
                                     f"{response.text[:300]!r}", response.status_code)
            result = _parse("chat/completions", _json_body(url, response), cached=False)
        except (LLMServerError, LLMResponseError):
            self._count_error()
            raise
        with self._lock:
            self.usage.calls += 1
            self.usage.prompt_tokens += result.prompt_tokens
            self.usage.completion_tokens += result.completion_tokens
        return result

    async def open_stream(self, body: Mapping[str, Any], *, timeout: float
                          ) -> httpx.Response:
        """POST ``body`` with ``stream: true`` (asking for a final usage chunk) and return the
        open response once its status is known; an HTTP error status raises
        :class:`~canopy.llm.client.LLMServerError` (its body read for the message, the
        response closed). The caller reads ``aiter_raw()`` and closes it."""
        url = f"{self.base_url}/chat/completions"
        options = dict(body.get("stream_options") or {})
        payload = {**body, "model": self.model, "stream": True,
                   "stream_options": {**options, "include_usage": True}}
        request = self._http.build_request("POST", url, json=payload, headers=self._headers(),
                                           timeout=httpx.Timeout(timeout))
        with self._transport_errors(url, timeout):
            response = await self._http.send(request, stream=True)
        if response.status_code >= 400:
            text = (await response.aread())[:300]
            await response.aclose()
            self._count_error()
            raise LLMServerError(f"POST {url} returned HTTP {response.status_code}: {text!r}",
                                 response.status_code)
        with self._lock:
            self.usage.calls += 1
        return response

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

    def _count_error(self) -> None:
        with self._lock:
            self.usage.errors += 1

    async def aclose(self) -> None:
        await self._http.aclose()
