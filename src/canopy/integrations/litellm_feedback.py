"""A rating route for LiteLLM *proxy* users (extras ``litellm`` and ``serve``).

A LiteLLM proxy loads :class:`~canopy.integrations.litellm.CanopyRouting` as a callback from
its ``config.yaml`` but offers no hook to add a route of one's own; its
``pass_through_endpoints`` forward a path of the proxy to a URL. This app is that URL:
``POST /v1/feedback`` with ``{"request_id": <reply id>, "quality": q}`` (the admin key of
``admin_key_env``) rates a reply through a :class:`CanopyRouting` with the same settings and
store as the proxy's, since the replies awaiting a rating live in the store. Answers: 200;
404 (unknown or expired id), 409 (already rated), 422 (quality not in [0, 1]), 503 with
``Retry-After`` (the store is busy: nothing recorded, retry).
"""

from __future__ import annotations

import json
import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from canopy.apps.routing.proxy.guard import Keys
from canopy.integrations.litellm import CanopyRouting, UnknownReply
from canopy.regional.store import StoreBusy

__all__ = ["feedback_app"]

MAX_BODY = 64 * 1024


def _error(status: int, message: str, **headers: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message}}, status_code=status, headers=headers)


def feedback_app(canopy: CanopyRouting, *, admin_key_env: str) -> FastAPI:
    """The rating app over ``canopy``; refuses (``ValueError``) to build without the key."""
    keys = Keys.from_env(None, admin_key_env)
    app = FastAPI(title="Canopy ratings for LiteLLM")

    @app.post("/v1/feedback")
    async def feedback(request: Request) -> Any:
        if keys.refusal(request.headers.get("authorization"), admin=True) is not None:
            return _error(401, "missing or wrong API key (Authorization: Bearer ...)")
        raw = bytearray()
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > MAX_BODY:
                return _error(413, f"the body exceeds {MAX_BODY} bytes")
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError):
            return _error(400, "the request body is not valid JSON")
        if not isinstance(body, dict) or set(body) != {"request_id", "quality"} or \
                not isinstance(body["request_id"], str) or not body["request_id"]:
            return _error(400, "feedback must be {'request_id': str, 'quality': number}")
        quality = body["quality"]
        if isinstance(quality, bool) or not isinstance(quality, (int, float)) or \
                not math.isfinite(quality) or not 0.0 <= quality <= 1.0:
            return _error(422, f"'quality' must be a number in [0, 1], got {quality!r}")
        try:
            await run_in_threadpool(canopy.feedback, body["request_id"], float(quality))
        except UnknownReply as error:
            message = str(error.args[0])
            return _error(409 if "already" in message else 404, message)
        except StoreBusy:
            return _error(503, "the statistics store is busy; nothing was recorded, retry",
                          **{"Retry-After": "1"})
        return {"ok": True, "request_id": body["request_id"]}

    return app
