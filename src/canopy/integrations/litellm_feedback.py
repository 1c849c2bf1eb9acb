"""A rating route for LiteLLM *proxy* users (extras ``litellm`` and ``serve``).

A LiteLLM proxy loads :class:`~canopy.integrations.litellm.CanopyRouting` as a callback from
its ``config.yaml`` but offers no hook to add a route of one's own; its
``pass_through_endpoints`` forward a path of the proxy to a URL. This app is that URL:
``POST /v1/feedback`` with ``{"request_id": <reply id>, "quality": q}`` (the admin key of
``admin_key_env``) rates a reply through a :class:`CanopyRouting` with the same settings and
store as the proxy's, since the replies awaiting a rating live in the store. It is the
routing proxy's own rating route (:func:`~canopy.apps.routing.proxy.web.rating_route`), so
the answers are the proxy's: 200; 400 (a malformed body); 401 (no or a wrong key); 404
(unknown or forgotten id), 409 (already rated), 410 (past the feedback window), 422
(quality not a number in [0, 1]), each with the ledger's error ``code``; 413 (a body over
64 KiB); 503 with ``Retry-After`` (the store is busy: nothing recorded, retry).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from canopy.apps.routing.proxy.guard import Keys
from canopy.apps.routing.proxy.web import rating_route
from canopy.integrations.litellm import CanopyRouting

__all__ = ["feedback_app"]

MAX_BODY = 64 * 1024


def feedback_app(canopy: CanopyRouting, *, admin_key_env: str) -> FastAPI:
    """The rating app over ``canopy``; refuses (``ValueError``) to build without the key."""
    keys = Keys.from_env(None, admin_key_env)
    app = FastAPI(title="Canopy ratings for LiteLLM")

    def rate(reply_id: str, quality: Any) -> dict[str, Any]:
        call = canopy.feedback(reply_id, quality)
        return {"ok": True, "request_id": reply_id, "model": call.model}

    rating_route(app, "/v1/feedback", rate, keys=keys, limit=MAX_BODY)
    return app
