"""What the proxy checks before it trusts a client or an upstream: API keys, chat bodies,
reported usage, and secrets in anything it logs. (The circuit breaker, once re-exported
here, is the routing service's: :meth:`~canopy.regional.service.RoutingService.outcome`.)"""

from __future__ import annotations

import functools
import hmac
import json
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from canopy._lazy import deprecated_aliases
from canopy.apps.routing.prices import estimate_tokens
from canopy.regional.sources import message_text
from canopy.validation import check_count, check_nonnegative

__all__ = ["Keys", "Preferences", "SseUsage", "check_chat_body",
           "check_completion_body", "client_fault", "completion_view", "expected_tokens",
           "redact", "sane_usage"]

MAX_TOKENS_PER_CALL = 2_000_000  # beyond any context window: such a usage report is wrong
PLAUSIBLE_PROMPT = 4096  # a reported prompt over 50 x its estimate + this is clamped
MAX_SSE_LINE = 1 << 20  # an event line longer than this is skipped, not buffered

_SECRET = re.compile(r"(?i)(bearer\s+|api[_-]?key[\"'=:\s]+|\bsk-)[A-Za-z0-9._~+/=-]+")


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with bearer tokens, ``sk-...`` keys and the given secrets replaced."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "[redacted]")
    return _SECRET.sub(lambda m: m.group(1) + "[redacted]", text)


@dataclass(frozen=True)
class Keys:
    """The client key (chat) and admin key (feedback, statistics), read from the environment
    variables the configuration names. An admin key also opens chat."""

    client: str | None
    admin: str | None

    @classmethod
    def from_env(cls, client_env: str | None, admin_env: str | None, *,
                 insecure_no_auth: bool = False) -> Keys:
        """Refuses (``ValueError`` naming the variables) when a named variable is unset or
        empty, or when none is named and ``insecure_no_auth`` is false."""
        keys = {}
        for role, name in (("client", client_env), ("admin", admin_env)):
            if name is None:
                keys[role] = None
                continue
            value = os.environ.get(name, "")
            if not value:
                raise ValueError(f"auth.{role}_key_env names {name}, which is not set")
            keys[role] = value
        if keys["client"] is None and keys["admin"] is None and not insecure_no_auth:
            raise ValueError("no API keys configured: set auth.client_key_env and "
                             "auth.admin_key_env in the configuration, or pass "
                             "--insecure-no-auth to serve without authentication")
        return cls(**keys)

    @property
    def secrets(self) -> tuple[str, ...]:
        return tuple(k for k in (self.client, self.admin) if k)

    @functools.cached_property
    def _encoded(self) -> tuple[bytes | None, bytes | None]:
        """The admin and client keys as bytes (compared in constant time)."""
        return (None if self.admin is None else self.admin.encode(),
                None if self.client is None else self.client.encode())

    def refusal(self, authorization: str | None, *, admin: bool) -> int | None:
        """``None`` when the header opens the route; else 401 (no or a wrong key) or 403 (the
        client key on an admin route)."""
        if self.client is None and self.admin is None:
            return None  # only with --insecure-no-auth
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token:
            return 401
        given = token.encode()
        admin_key, client_key = self._encoded
        if admin_key is not None and hmac.compare_digest(given, admin_key):
            return None
        if client_key is not None and hmac.compare_digest(given, client_key):
            return 403 if admin else None
        return 401


def check_chat_body(body: Any) -> str | None:
    """Why a chat-completion body is malformed, or ``None``."""
    if not isinstance(body, dict):
        return "the body must be a JSON object"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "'messages' must be a non-empty list"
    for number, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            return f"messages[{number}] must be an object with a string 'role'"
        if message.get("content") is None and message["role"] not in ("assistant", "tool"):
            return f"messages[{number}] needs 'content' (a string or a list of parts)"
        try:
            message_text(message.get("content"))
        except TypeError:
            return f"messages[{number}].content must be a string or a list of parts"
    return check_common(body)


def _promptmessage_text(prompt: Any) -> str | None:
    """A text completion's prompt as text: a string, or a list of strings (or of token ids,
    which count as no text); ``None`` when it is neither."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return "\n".join(prompt)
        flat = [t for p in prompt for t in (p if isinstance(p, list) else [p])]
        if flat and all(type(t) is int for t in flat):  # token ids (JSON integers)
            return ""
    return None


def check_completion_body(body: Any) -> str | None:
    """Why a text-completion body is malformed, or ``None``."""
    if not isinstance(body, dict):
        return "the body must be a JSON object"
    if _promptmessage_text(body.get("prompt")) is None:
        return "'prompt' must be a string or a non-empty list of strings (or of token ids)"
    return check_common(body)


def completion_view(body: dict[str, Any]) -> dict[str, Any]:
    """A text-completion body as the chat body the router reads (region rules, centroids,
    classifier, cost estimates): its prompt as one user message."""
    return {"messages": [{"role": "user", "content": _promptmessage_text(body["prompt"]) or ""}],
            **{k: body[k] for k in ("max_tokens", "model") if k in body}}


def check_common(body: dict[str, Any]) -> str | None:
    """What chat and text completions share: ``stream``, ``model``, token limits."""
    if "stream" in body and not isinstance(body["stream"], bool):
        return f"'stream' must be true or false, got {body['stream']!r}"
    if not isinstance(body.get("model", ""), str):
        return "'model' must be a string"
    for name in ("max_tokens", "max_completion_tokens"):
        value = body.get(name)
        problem = None if value is None else _problem(check_count, value, f"'{name}'", low=0)
        if problem:
            return problem
    return None


def _problem(check: Callable[..., object], value: object, name: str, **bounds: Any
             ) -> str | None:
    """Why ``value`` fails a :mod:`canopy.validation` check (named ``name``), or ``None``."""
    try:
        check(value, name, **bounds)
    except (TypeError, ValueError) as error:
        return str(error)[:200]
    return None


def client_fault(status: int | None) -> bool:
    """Whether an upstream's HTTP status blames the request (400, 404, 413, 422, ...), not
    the upstream: such a failure never counts against it in the breaker. Its refusal of the
    proxy's credentials (401, 403), a timeout (408) and rate limiting (429) do count."""
    return status is not None and 400 <= status < 500 and status not in (401, 403, 408, 429)


@dataclass(frozen=True)
class Preferences:
    """A request's own trade-off, from the body's optional ``"canopy"`` object (the
    ``extra_body`` of the openai client): ``lam`` replaces the router's cost weight for this
    request, ``max_cost`` (dollars) excludes models whose estimated cost exceeds it."""

    lam: float | None = None
    max_cost: float | None = None

    @classmethod
    def pop(cls, body: dict[str, Any]) -> Preferences | str:
        """Remove ``"canopy"`` from ``body`` (upstreams never see it); the preferences, or
        why they are malformed."""
        given = body.pop("canopy", None)
        if given is None:
            return _NO_PREFERENCES
        if not isinstance(given, dict) or set(given) - {"lam", "max_cost"}:
            return "'canopy' must be an object with optional 'lam' and 'max_cost'"
        for name in ("lam", "max_cost"):
            value = given.get(name)
            problem = None if value is None else _problem(check_nonnegative, value,
                                                          f"canopy.{name}")
            if problem:
                return problem
        return cls(given.get("lam"), given.get("max_cost"))


_NO_PREFERENCES = Preferences()


def expected_tokens(body: dict[str, Any]) -> tuple[int, int]:
    """Estimated prompt tokens and the completion tokens a request may cost (its
    ``max_tokens``, at most ``MAX_TOKENS_PER_CALL``, or 0 when it sets none), for a body
    :func:`check_chat_body` accepted (or its :func:`completion_view`)."""
    prompt = estimate_tokens("\n".join(message_text(m.get("content")) or ""
                                       for m in body["messages"]))
    limit = body.get("max_tokens") or body.get("max_completion_tokens") or 0
    return prompt, min(limit, MAX_TOKENS_PER_CALL)


def _count(value: object) -> int | None:
    """A reported token count, or ``None`` when it is not a whole number >= 0."""
    if type(value) is int:  # exactly: JSON's integers, never a bool
        return value if value >= 0 else None
    try:
        number = check_nonnegative(value, "a token count")
    except (TypeError, ValueError):
        return None
    return int(number) if number.is_integer() else None


def sane_usage(body: dict[str, Any], answer_chars: int, raw: dict[str, Any],
               prompt_tokens: object, completion_tokens: object) -> tuple[int, int, str]:
    """Token counts to bill: the upstream's report, an estimate when it sent none
    (``"estimated"``), or the estimate in place of an absurd report (negative, not a count,
    or far too large: ``"clamped"``). ``answer_chars``: the answer's length in characters."""
    if not isinstance(raw.get("usage"), dict):
        return expected_tokens(body)[0], estimate_tokens(answer_chars), "estimated"
    prompt, completion = _count(prompt_tokens), _count(completion_tokens)
    if prompt is None or completion is None or completion > MAX_TOKENS_PER_CALL or \
            (prompt > PLAUSIBLE_PROMPT and  # the estimate read only past that
             prompt > min(MAX_TOKENS_PER_CALL, 50 * expected_tokens(body)[0] + PLAUSIBLE_PROMPT)):
        return expected_tokens(body)[0], estimate_tokens(answer_chars), "clamped"
    return prompt, completion, "reported"


class SseUsage:
    """Reads a chat- or text-completion event stream as it passes: the streamed text's length
    in characters and the final usage chunk (``None`` when the upstream sent none). Holds at
    most one event line (``MAX_SSE_LINE`` bytes) whatever the stream's length."""

    def __init__(self) -> None:
        self._pending = b""
        self.chars = 0
        self.usage: dict[str, Any] | None = None

    def feed(self, chunk: bytes) -> None:
        *lines, self._pending = (self._pending + chunk).split(b"\n")
        if len(self._pending) > MAX_SSE_LINE:
            self._pending = b""  # no event is that long: skip it
        for line in lines:
            line = line.strip()
            if not line.startswith(b"data:") or line[5:].strip() == b"[DONE]":
                continue
            try:
                event = json.loads(line[5:])
            except ValueError:
                continue
            if not isinstance(event, dict):
                continue
            if isinstance(event.get("usage"), dict):
                self.usage = event["usage"]
            choices = event.get("choices")
            for choice in choices if isinstance(choices, list) else ():
                if not isinstance(choice, dict):
                    continue
                delta = choice.get("delta")
                if isinstance(delta, dict) and isinstance(delta.get("content"), str):
                    self.chars += len(delta["content"])
                elif isinstance(choice.get("text"), str):  # a text-completion stream
                    self.chars += len(choice["text"])


deprecated_aliases(__name__, {"Breaker": "canopy.regional.breaker",
                              "user_text": "canopy.regional.sources"})
