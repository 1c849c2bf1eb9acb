"""What the HTTP surfaces of the routing service share: the routing proxy
(:mod:`~canopy.apps.routing.proxy.app`) and the rating app for LiteLLM proxy users
(:mod:`canopy.integrations.litellm_feedback`). The error answer, the key check, a JSON body
read within a size limit, and the one rating route: a rating's body is read here, its value
checked once, by the feedback ledger, and every refusal answers with the ``status`` and
``code`` its type carries (:class:`~canopy.regional.ledger.FeedbackError`), a busy store
with 503 and ``Retry-After``."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response
from starlette.requests import ClientDisconnect

from canopy.apps.routing.proxy.guard import Keys
from canopy.regional.ledger import FeedbackError
from canopy.regional.store import StoreBusy

__all__ = ["JSONAnswer", "RawHeaders", "checked_json", "error_json", "rating_route",
           "read_json", "read_rating", "refusal", "refused"]

log = logging.getLogger("canopy.proxy")


class JSONAnswer(JSONResponse):
    """A JSON answer written by orjson (several times faster than the standard library's
    encoder on an answer relayed whole). ``after``: the bookkeeping a lean route's protocol
    does once it is written (:class:`~canopy.apps.routing.proxy.connections.LeanRoutes`)."""

    after: Callable[[], None] | None = None

    def __init__(self, content: Any, status_code: int = 200,
                 headers: Mapping[str, str] | None = None, **options: Any) -> None:
        names = () if headers is None else [name.lower() for name in headers]
        if options or "content-length" in names or "content-type" in names or \
                status_code < 200 or status_code in (204, 304):
            super().__init__(content, status_code, headers, **options)
            return
        # Starlette's own headers for a JSON body (given ones first, then its length and
        # type), made without its general case: a chat's answer is one of these
        self.status_code, self.background = status_code, None
        self.body = body = orjson.dumps(content)
        self.raw_headers = [] if headers is None else [
            (name.encode("latin-1"), value.encode("latin-1"))
            for name, value in zip(names, headers.values(), strict=True)]
        self.raw_headers += [(b"content-length", b"%d" % len(body)),
                             (b"content-type", b"application/json")]

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


def error_json(status: int, message: str, kind: str = "invalid_request_error", **extra: Any
               ) -> JSONResponse:
    """The error answer of every route: ``{"error": {"message", "type", ...extra}}``."""
    return JSONAnswer({"error": {"message": message, "type": kind, **extra}},
                      status_code=status)


class RawHeaders(dict[str, str]):
    """A request's headers as the server parsed them (``(name, value)`` byte pairs, names in
    lower case), read as Starlette's are: :meth:`get` ignores case and the first of a
    repeated name wins."""

    def __init__(self, raw: list[tuple[bytes, bytes]]) -> None:
        super().__init__((n.decode("latin-1"), v.decode("latin-1")) for n, v in reversed(raw))

    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        return dict.get(self, key.lower(), default)


def refusal(keys: Keys, request: Request | RawHeaders, *, admin: bool
            ) -> JSONResponse | None:
    """``None`` when the request's key opens the route (``admin``: the admin key's), else
    the 401 or 403 answer."""
    headers = request if isinstance(request, RawHeaders) else request.headers
    status = keys.refusal(headers.get("authorization"), admin=admin)
    if status == 403:
        return error_json(403, "the client key cannot use this route: it needs the admin key",
                          "permission_error")
    if status == 401:
        return error_json(401, "missing or wrong API key (Authorization: Bearer ...)"
                          + (": this route needs the admin key" if admin else ""),
                          "authentication_error")
    return None


async def read_json(request: Request, keys: Keys, *, admin: bool, limit: int
                    ) -> tuple[Any, JSONResponse | None]:
    """``(body, None)``: the parsed body of a request whose key opens the route, read
    within ``limit`` bytes; else ``(None, the refusal)``."""
    refused_key = refusal(keys, request, admin=admin)
    if refused_key is not None:
        return None, refused_key
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        return None, _too_large(limit)
    raw = bytearray()
    try:
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > limit:
                return None, _too_large(limit)
    except ClientDisconnect:  # closed mid-body (limits.client_timeout_s): nobody to answer
        return None, error_json(400, "the client left before sending its whole body")
    return _parsed(raw)


def checked_json(keys: Keys, headers: RawHeaders, raw: bytes | None, *, admin: bool,
                 limit: int) -> tuple[Any, JSONResponse | None]:
    """:func:`read_json` for a body the server has read itself (``None``: it passed
    ``limit`` bytes)."""
    refused_key = refusal(keys, headers, admin=admin)
    if refused_key is not None:
        return None, refused_key
    return (None, _too_large(limit)) if raw is None else _parsed(raw)


def _too_large(limit: int) -> JSONResponse:
    return error_json(413, f"the body exceeds {limit} bytes")


def _parsed(raw: bytes | bytearray) -> tuple[Any, JSONResponse | None]:
    try:
        return orjson.loads(raw), None
    except (ValueError, RecursionError):  # orjson.JSONDecodeError is a ValueError
        return None, error_json(400, "the request body is not valid JSON (or nests too deep)")


def read_rating(body: Any, key: str, value_key: str) -> tuple[str, Any]:
    """``(id, value)`` of a rating body ``{key: str, value_key: number}``; the value is left
    to the ledger to check. Raises :class:`~canopy.regional.ledger.FeedbackError` (400)."""
    if not isinstance(body, dict) or set(body) - {key, value_key}:
        raise FeedbackError(f"feedback must be {{'{key}': str, '{value_key}': number}}")
    ident = body.get(key)
    if not isinstance(ident, str) or not ident:
        raise FeedbackError(f"'{key}' must be a non-empty string")
    return ident, body.get(value_key)


def refused(error: FeedbackError | StoreBusy) -> JSONResponse:
    """The answer to a rating the ledger refused (its type's status and code), or that a
    busy store could not take (503, retry)."""
    if isinstance(error, StoreBusy):
        log.error("feedback not stored: %s", error)
        answer = error_json(503, "the statistics store is busy; nothing was recorded, retry "
                                 "the feedback", "server_error")
        answer.headers["Retry-After"] = "1"
        return answer
    return error_json(error.status, str(error), code=error.code)


def rating_route(app: FastAPI, path: str, rate: Callable[[str, Any], dict[str, Any]], *,
                 keys: Keys, limit: int, key: str = "request_id", value_key: str = "quality",
                 answered: Callable[[int], None] | None = None) -> None:
    """``POST path`` on ``app``: a rating ``{key: id, value_key: value}`` with the admin key,
    passed to ``rate(id, value)`` in a worker thread (a store is never waited on in the
    event loop), whose result is the answer's body; a ``FeedbackError`` or ``StoreBusy``
    answers as :func:`refused` says. ``answered(status)`` hears every answer's status."""

    def handle(body: Any) -> JSONResponse | dict[str, Any]:
        try:
            return rate(*read_rating(body, key, value_key))
        except (FeedbackError, StoreBusy) as error:
            return refused(error)

    async def rating(request: Request) -> Any:
        body, problem = await read_json(request, keys, admin=True, limit=limit)
        answer = problem if problem is not None else await run_in_threadpool(handle, body)
        if answered is not None:
            answered(answer.status_code if isinstance(answer, Response) else 200)
        return answer

    app.post(path)(rating)
