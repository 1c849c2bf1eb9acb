"""OpenAI-compatible chat and completion calls: the one place in Canopy that talks HTTP to
models.

:class:`LLMClient` posts to ``{base_url}/chat/completions`` and ``{base_url}/completions``
(``base_url`` ends in ``/v1``), retries connection failures, timeouts, HTTP 429 and 5xx with
exponential backoff, records every call's prompt and completion tokens from the response's
``usage`` field in ``LLMClient.usage``, and, given a ``cache_dir``, keeps every response in
an SQLite file keyed by a hash of the endpoint, model, prompt or messages and sampling
parameters, so a rerun issues no HTTP call at all. Sampled generations are cacheable only when
they are reproducible: pass a ``seed`` among the parameters to draw distinct samples.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from canopy.validation import (
    check_count,
    check_http_url,
    check_nonnegative,
    check_number,
    check_text,
)

__all__ = [
    "AnswerTooLarge",
    "LLMClient",
    "LLMConnectionError",
    "LLMError",
    "LLMResponse",
    "LLMResponseError",
    "LLMServerError",
    "LLMTimeoutError",
    "ResponseCache",
    "Usage",
]

_RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})


class LLMError(RuntimeError):
    """A call to the model endpoint failed (after any retries)."""


class LLMConnectionError(LLMError):
    """The endpoint could not be reached (refused, DNS, reset)."""


class LLMTimeoutError(LLMError):
    """The endpoint did not answer within the client's timeout."""


class LLMServerError(LLMError):
    """The endpoint answered with an HTTP error status; its ``status`` holds it."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class LLMResponseError(LLMError):
    """The endpoint answered 200 with a body that is not an OpenAI-compatible response."""


class AnswerTooLarge(LLMResponseError):
    """An upstream's answer is larger than the reader's cap."""


@dataclass(frozen=True)
class LLMResponse:
    """One generation: its text, the usage tokens the server reported, the model that answered,
    the finish reason, whether it came from the cache, and the raw JSON body."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    model: str
    finish_reason: str | None
    cached: bool
    raw: dict[str, Any] = field(repr=False)

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass
class Usage:
    """Running record of a client's traffic. ``calls`` counts HTTP calls that returned a
    response (cache hits are not calls); tokens are summed from the ``usage`` fields of those
    responses; ``cached_*_tokens`` are the tokens cache hits would have cost."""

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cache_hits: int = 0
    cached_prompt_tokens: int = 0
    cached_completion_tokens: int = 0
    retries: int = 0
    errors: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def copy(self) -> Usage:
        return Usage(**vars(self))

    def __sub__(self, other: Usage) -> Usage:
        return Usage(**{key: value - getattr(other, key) for key, value in vars(self).items()})


class ResponseCache:
    """Response bodies in one SQLite file, keyed by a SHA-256 of the request; safe to share
    between threads of one process and between processes (SQLite locking)."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        folder = Path(directory).expanduser()
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / "responses.sqlite"
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, timeout=30.0)
        with self._db:
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS responses (key TEXT PRIMARY KEY, body TEXT NOT NULL)"
            )

    @staticmethod
    def key(endpoint: str, payload: Mapping[str, Any]) -> str:
        """Hash of the endpoint and the full request payload (model, prompt or messages and
        every sampling parameter), independent of key order."""
        text = json.dumps({"endpoint": endpoint, "payload": payload}, sort_keys=True,
                          separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()

    def get(self, key: str) -> dict[str, Any] | None:
        with self._lock:
            row = self._db.execute("SELECT body FROM responses WHERE key = ?", (key,)).fetchone()
        return None if row is None else json.loads(row[0])

    def put(self, key: str, body: Mapping[str, Any]) -> None:
        text = json.dumps(body, ensure_ascii=False)
        with self._lock, self._db:
            self._db.execute("INSERT OR REPLACE INTO responses VALUES (?, ?)", (key, text))

    def __len__(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM responses").fetchone()[0])

    def close(self) -> None:
        with self._lock:
            self._db.close()


class LLMClient:
    """Client of an OpenAI-compatible endpoint.

    Args:
        base_url: the API root, e.g. ``http://127.0.0.1:8000/v1``.
        model: model name sent with every request.
        api_key_env: name of the environment variable holding the API key (read at each call;
            no ``Authorization`` header when it is unset or ``None``, as local servers need none).
        timeout: seconds allowed for one HTTP attempt (connect and read).
        max_retries: further attempts after a retryable failure (connection error, timeout,
            HTTP 408/429/5xx); 4xx errors and malformed bodies are not retried.
        backoff: seconds before the first retry, doubled at each further one.
        cache_dir: folder for the response cache; ``None`` disables it.
        default_params: sampling parameters merged under each call's own (``max_tokens``,
            ``temperature``, ``seed``, ...).
    """

    def __init__(self, base_url: str, *, model: str, api_key_env: str | None = "OPENAI_API_KEY",
                 timeout: float = 60.0, max_retries: int = 2, backoff: float = 0.25,
                 cache_dir: str | os.PathLike[str] | None = None,
                 default_params: Mapping[str, Any] | None = None) -> None:
        self.base_url = check_http_url(base_url, "base_url").rstrip("/")
        self.model = check_text(model, "model")
        self.api_key_env = api_key_env
        self.timeout = check_number(timeout, "timeout", low=0.0, low_open=True)
        self.max_retries = check_count(max_retries, "max_retries", low=0)
        self.backoff = check_nonnegative(backoff, "backoff")
        self.default_params = dict(default_params or {})
        self.cache = None if cache_dir is None else ResponseCache(cache_dir)
        self.usage = Usage()
        self._usage_lock = threading.Lock()
        self._http = httpx.Client(timeout=httpx.Timeout(self.timeout))

    # ------------------------------------------------------------------ public calls
    def chat(self, messages: Sequence[Mapping[str, str]], **params: Any) -> LLMResponse:
        """One chat completion of ``messages`` (``[{"role": ..., "content": ...}, ...]``)."""
        if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
            raise TypeError("messages must be a sequence of {'role', 'content'} mappings")
        checked = []
        for number, message in enumerate(messages):
            if not isinstance(message, Mapping) or not isinstance(message.get("role"), str) \
                    or not isinstance(message.get("content"), str):
                raise ValueError(f"message {number} must have string 'role' and 'content'")
            checked.append({"role": message["role"], "content": message["content"]})
        if not checked:
            raise ValueError("messages is empty")
        return self._call("chat/completions", {"messages": checked}, params)

    def complete(self, prompt: str, **params: Any) -> LLMResponse:
        """One text completion of ``prompt``."""
        if not isinstance(prompt, str):
            raise TypeError(f"prompt must be a str, got {type(prompt).__name__}")
        return self._call("completions", {"prompt": prompt}, params)

    def close(self) -> None:
        self._http.close()
        if self.cache is not None:
            self.cache.close()

    def __enter__(self) -> LLMClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------------ internals
    def _call(self, endpoint: str, body: dict[str, Any], params: Mapping[str, Any]) -> LLMResponse:
        payload = {**self.default_params, **params, **body, "model": self.model}
        if payload.get("stream"):
            raise ValueError("stream=True is not supported: the client reads whole responses")
        key = None
        if self.cache is not None:
            key = ResponseCache.key(endpoint, payload)
            stored = self.cache.get(key)
            if stored is not None:
                result = _parse(endpoint, stored, cached=True)
                with self._usage_lock:
                    self.usage.cache_hits += 1
                    self.usage.cached_prompt_tokens += result.prompt_tokens
                    self.usage.cached_completion_tokens += result.completion_tokens
                return result
        raw = self._post(endpoint, payload)
        try:
            result = _parse(endpoint, raw, cached=False)
        except LLMResponseError:
            with self._usage_lock:
                self.usage.errors += 1
            raise
        with self._usage_lock:
            self.usage.calls += 1
            self.usage.prompt_tokens += result.prompt_tokens
            self.usage.completion_tokens += result.completion_tokens
        if key is not None and self.cache is not None:
            self.cache.put(key, raw)
        return result

    def _headers(self) -> dict[str, str]:
        key = os.environ.get(self.api_key_env) if self.api_key_env else None
        return {"Authorization": f"Bearer {key}"} if key else {}

    def _post(self, endpoint: str, payload: dict[str, Any]) -> dict[str, Any]:
        url = f"{self.base_url}/{endpoint}"
        for attempt in range(self.max_retries + 1):
            last = attempt == self.max_retries
            try:
                response = self._http.post(url, json=payload, headers=self._headers())
            except httpx.TimeoutException as error:
                failure: LLMError = LLMTimeoutError(
                    f"POST {url} timed out after {self.timeout:g} s "
                    f"(attempt {attempt + 1} of {self.max_retries + 1}): {error}")
            except httpx.TransportError as error:
                failure = LLMConnectionError(
                    f"cannot reach {url} (attempt {attempt + 1} of {self.max_retries + 1}): "
                    f"{str(error) or type(error).__name__}")
            else:
                if response.status_code < 400:
                    return _json_body(url, response.content)
                failure = LLMServerError(
                    f"POST {url} returned HTTP {response.status_code}: "
                    f"{response.text[:300]!r}", response.status_code)
                if response.status_code not in _RETRY_STATUS:
                    last = True
            if last:
                with self._usage_lock:
                    self.usage.errors += 1
                raise failure
            with self._usage_lock:
                self.usage.retries += 1
            time.sleep(self.backoff * 2**attempt)
        raise AssertionError("unreachable")  # pragma: no cover


def _json_body(url: str, content: bytes,
               loads: Callable[[bytes], Any] = json.loads) -> dict[str, Any]:
    """The JSON object an answer's body holds (``loads``: the parser)."""
    try:
        body = loads(content)
    except ValueError:
        raise LLMResponseError(
            f"POST {url} answered with a body that is not JSON: {content[:200]!r}") from None
    if not isinstance(body, dict):
        raise LLMResponseError(
            f"POST {url} answered with JSON that is not an object: {body!r:.200}")
    return body


def _parse(endpoint: str, raw: Mapping[str, Any], *, cached: bool) -> LLMResponse:
    """Read text, usage and model out of an OpenAI-compatible response body."""
    choices = raw.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
        raise LLMResponseError(f"response has no 'choices' list: {dict(raw)!r:.300}")
    choice = choices[0]
    if endpoint == "chat/completions":
        message = choice.get("message")
        text = message.get("content") if isinstance(message, Mapping) else None
        if text is None and isinstance(message, Mapping) and "content" in message:
            text = ""  # a null content (e.g. only tool calls) is an empty answer
    else:
        text = choice.get("text")
    if not isinstance(text, str):
        raise LLMResponseError(f"response choice has no text: {dict(choice)!r:.300}")
    usage = raw.get("usage") or {}
    if not isinstance(usage, Mapping):
        raise LLMResponseError(f"response 'usage' is not an object: {usage!r:.200}")
    tokens = []
    for name in ("prompt_tokens", "completion_tokens"):
        value = usage.get(name, 0)
        try:
            tokens.append(check_count(value, name, low=0))
        except (TypeError, ValueError):
            raise LLMResponseError(f"response usage {name} is not a count: {value!r}") from None
    model = raw.get("model")
    return LLMResponse(text=text, prompt_tokens=tokens[0], completion_tokens=tokens[1],
                       model=model if isinstance(model, str) else "",
                       finish_reason=choice.get("finish_reason"), cached=cached, raw=dict(raw))
