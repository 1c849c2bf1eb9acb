"""The OpenAI-compatible routing proxy (paper Section 5, "Routing", as a service).

``POST /v1/chat/completions`` picks a model with the regional router (region from a header,
a user-supplied classifier, or the nearest centroid of a text embedding), forwards the body
to that model's upstream through :class:`~canopy.llm.passthrough.AsyncPassthrough`, and
returns the upstream's answer with the chosen model and a request id (body field ``canopy``
and headers ``X-Canopy-Model``, ``X-Canopy-Request-Id``). An upstream that fails or times
out is skipped for the next model in the router's ranking, within the request's deadline;
when none answers, the caller gets a 503 (504 past the deadline) naming every attempt.
``POST /v1/feedback`` takes ``{"request_id", "quality"}`` and updates the router with
``quality - lam * cost`` (cost from the upstream's ``usage`` and the price table);
``GET /v1/router/stats`` shows the learned statistics; ``GET /health``. Statistics and
pending requests live in SQLite (:class:`~canopy.apps.routing.proxy.state.ProxyState`).

Needs the ``serve`` extra (fastapi, uvicorn, httpx); nothing else imports this module.
"""

from __future__ import annotations

import contextlib
import importlib
import math
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from canopy.apps.routing.proxy.config import ProxyConfig
from canopy.apps.routing.proxy.embed import NearestCentroid
from canopy.apps.routing.proxy.state import ProxyState
from canopy.apps.routing.routers import RegionalRouter
from canopy.llm.client import LLMError
from canopy.llm.passthrough import AsyncPassthrough

__all__ = ["AUTO_MODELS", "create_app", "serve_in_thread"]

AUTO_MODELS = frozenset({"", "auto", "canopy-router"})


def _error(status: int, message: str, kind: str = "invalid_request_error", **extra: Any
           ) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, **extra}},
                        status_code=status)


def _check_chat_body(body: Any) -> str | None:
    """Why a chat-completion body is malformed, or ``None``."""
    if not isinstance(body, dict):
        return "the body must be a JSON object"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "'messages' must be a non-empty list"
    for number, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str) or \
                not isinstance(message.get("content"), str):
            return f"messages[{number}] must have string 'role' and 'content'"
    if body.get("stream"):
        return "stream=true is not supported by the routing proxy"
    if not isinstance(body.get("model", ""), str):
        return "'model' must be a string"
    return None


def _load_classifier(spec: str) -> Callable[[dict[str, Any]], str]:
    module, _, name = spec.partition(":")
    if not module or not name:
        raise ValueError(f"classifier must be 'package.module:function', got {spec!r}")
    function = getattr(importlib.import_module(module), name)
    if not callable(function):
        raise TypeError(f"classifier {spec!r} is not callable")
    return function


class _Proxy:
    """The proxy's state and logic, apart from the web framework."""

    def __init__(self, config: ProxyConfig) -> None:
        self.config = config
        self.state = ProxyState(config.state_path)
        self.router = RegionalRouter(config.models, lam=config.lam, learner=config.learner,
                                     kappa=config.kappa, explore=config.explore, seed=0)
        saved = self.state.load_router_state()
        if saved is not None:
            try:
                self.router.load_state(saved)
            except ValueError as error:
                raise ValueError(f"{config.state_path} holds another router's state: {error}; "
                                 "use a new state_path") from None
        self.upstreams = {u.model: u for u in config.upstreams}
        self.clients = {u.model: AsyncPassthrough(u.base_url, model=u.upstream_model,
                                                  api_key_env=u.api_key_env)
                        for u in config.upstreams}
        region = config.region
        self.classifier = _load_classifier(region.classifier) if region.classifier else None
        self.centroids = NearestCentroid(region.centroids) if region.centroids else None
        self.lock = threading.Lock()

    def region(self, headers: Any, body: dict[str, Any]) -> str:
        given = headers.get(self.config.region.header)
        if given:
            return given
        if self.classifier is not None:
            region = self.classifier(body)
            if not isinstance(region, str):
                raise TypeError(f"the region classifier returned {region!r}, not a string")
            return region
        if self.centroids is not None:
            text = "\n".join(m["content"] for m in body["messages"] if m["role"] == "user")
            return self.centroids.region(text)
        return self.config.region.default

    async def chat(self, headers: Any, body: Any) -> JSONResponse:
        started = time.perf_counter()
        problem = _check_chat_body(body)
        if problem:
            return _error(400, problem)
        asked = body.get("model", "") or ""
        if asked not in AUTO_MODELS and asked not in self.upstreams:
            return _error(400, f"unknown model {asked!r}: use 'auto' or one of "
                               f"{list(self.upstreams)}", code="model_not_found")
        try:
            region = self.region(headers, body)
        except Exception as error:  # a user classifier's failure is reported, not hidden
            return _error(500, f"region classifier failed: {error!r}", "server_error")
        with self.lock:
            ranking = [asked] if asked in self.upstreams else self.router.ranking(region)
        request_id = f"req-{uuid.uuid4().hex}"
        deadline = started + self.config.deadline_s
        attempts: list[dict[str, Any]] = []
        upstream_s = 0.0
        for model in ranking:
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                break
            t0 = time.perf_counter()
            try:
                answer = await self.clients[model].chat(
                    body, timeout=min(remaining, self.upstreams[model].timeout_s))
            except LLMError as error:
                upstream_s += time.perf_counter() - t0
                attempts.append({"model": model, "error": str(error)[:300],
                                 "status": getattr(error, "status", None)})
                continue
            upstream_s += time.perf_counter() - t0
            cost = self.config.prices.cost(model, answer.prompt_tokens, answer.completion_tokens)
            self.state.add_request(request_id, region, model, cost)
            overhead_ms = (time.perf_counter() - started - upstream_s) * 1000.0
            out = dict(answer.raw)
            out["model"] = model
            out["canopy"] = {"request_id": request_id, "model": model, "region": region,
                             "cost": cost, "failed_attempts": attempts,
                             "upstream_ms": upstream_s * 1000.0, "overhead_ms": overhead_ms}
            return JSONResponse(out, headers={"X-Canopy-Model": model,
                                              "X-Canopy-Request-Id": request_id,
                                              "X-Canopy-Overhead-Ms": f"{overhead_ms:.3f}"})
        past_deadline = time.perf_counter() >= deadline
        if attempts and all(a["status"] is not None and 400 <= a["status"] < 500
                            and a["status"] not in (408, 429) for a in attempts):
            return _error(400, "every upstream rejected the request", attempts=attempts)
        if past_deadline:
            return _error(504, f"no upstream answered within the {self.config.deadline_s:g} s "
                               "deadline", "timeout", attempts=attempts)
        return _error(503, "no upstream answered", "upstream_error", attempts=attempts)

    def feedback(self, body: Any) -> JSONResponse | dict[str, Any]:
        if not isinstance(body, dict) or set(body) - {"request_id", "quality"}:
            return _error(400, "feedback must be {'request_id': str, 'quality': number}")
        request_id, quality = body.get("request_id"), body.get("quality")
        if not isinstance(request_id, str) or not request_id:
            return _error(400, "'request_id' must be a non-empty string")
        if isinstance(quality, bool) or not isinstance(quality, (int, float)) or \
                not math.isfinite(quality) or not 0.0 <= quality <= 1.0:
            return _error(422, f"'quality' must be a number in [0, 1], got {quality!r}")
        with self.lock:
            record = self.state.request(request_id)
            if record is None:
                return _error(404, f"unknown request id {request_id!r}", code="unknown_request")
            if record.quality is not None:
                return _error(409, f"request {request_id!r} already has feedback "
                                   f"({record.quality})", code="duplicate_feedback")
            self.router.update(record.region, record.model, float(quality), record.cost)
            self.state.set_quality(request_id, float(quality))
            self.state.save_router_state(self.router.state())
        return {"ok": True, "request_id": request_id, "region": record.region,
                "model": record.model, "reward": quality - self.config.lam * record.cost}

    def stats(self) -> dict[str, Any]:
        with self.lock:
            rows = self.router.estimates()
        return {"models": list(self.config.models), "lam": self.config.lam,
                "learner": self.config.learner, "price_table": self.config.prices.version,
                **self.state.counts(), "statistics": rows}

    async def close(self) -> None:
        for client in self.clients.values():
            await client.aclose()
        self.state.close()


def create_app(config: ProxyConfig) -> FastAPI:
    """The FastAPI application of the proxy."""
    proxy = _Proxy(config)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await proxy.close()

    app = FastAPI(title="Canopy routing proxy", lifespan=lifespan)
    app.state.proxy = proxy

    async def json_body(request: Request) -> tuple[Any, Any]:
        try:
            return await request.json(), None
        except ValueError:
            return None, _error(400, "the request body is not valid JSON")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        body, problem = await json_body(request)
        return problem or await proxy.chat(request.headers, body)

    @app.post("/v1/feedback")
    async def feedback(request: Request) -> Any:
        body, problem = await json_body(request)
        return problem or proxy.feedback(body)

    @app.get("/v1/router/stats")
    async def stats() -> dict[str, Any]:
        return proxy.stats()

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "models": list(config.models)}

    return app


@contextlib.contextmanager
def serve_in_thread(app: Any, *, host: str = "127.0.0.1", port: int = 0,
                    startup_timeout: float = 30.0) -> Iterator[str]:
    """Run ``app`` under uvicorn in a background thread; yields its base URL."""
    import socket

    import uvicorn

    if port == 0:
        with socket.socket() as sock:
            sock.bind((host, 0))
            port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                           lifespan="on", limit_concurrency=1024))
    thread = threading.Thread(target=server.run, daemon=True, name=f"canopy-router-{port}")
    thread.start()
    deadline = time.monotonic() + startup_timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError(f"the routing proxy did not start on {host}:{port}")
        time.sleep(0.02)
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
