"""The OpenAI-compatible routing proxy (paper Section 5, "Routing", as a service).

``POST /v1/chat/completions`` picks a model with the regional router (region from a header,
a regular-expression rule, a user-supplied classifier, or the nearest centroid of a text
embedding), forwards the body to that model's upstream through
:class:`~canopy.llm.passthrough.AsyncPassthrough`, and returns the upstream's answer with the
chosen model and a request id (body field ``canopy`` and headers ``X-Canopy-Model``,
``X-Canopy-Request-Id``). An upstream that fails or times out is skipped for the next model
in the router's ranking, within the request's deadline (enforced on the whole call, however
slowly an upstream drips its answer); an upstream that keeps failing is ejected for a
cool-down (circuit breaker). When none answers, the caller gets a 503 (504 past the
deadline, 502 when the upstreams refused the proxy's credentials) with a generic reason and
the request id; upstream error bodies go only to the log, secrets redacted.
``POST /v1/feedback`` takes ``{"request_id", "quality"}`` and updates the router with
``quality - lam * cost`` through the routing service (:mod:`canopy.regional.service`): the
store first (one atomic step), then memory, so a retry after a failure counts once, and every
worker sharing the store ranks with it within a second. A store that stays busy past
``limits.store_wait_s`` gets the rating a 503 with ``Retry-After``; it never delays a chat
(the call is stored in the background). Calls sent with an ``X-Canopy-Episode`` header
form an episode: ``POST /v1/feedback/episode`` with ``{"episode_id", "reward"}`` credits the
terminal reward to every call of the episode not yet rated, in one transaction (per-call
routing inside agents, paper Appendix E). ``GET /v1/router/stats``, ``GET /metrics``
(Prometheus), ``GET /health``.
A request may carry its own trade-off in a ``"canopy"`` object (``extra_body``): ``lam`` and
``max_cost`` (:class:`~canopy.apps.routing.proxy.guard.Preferences`).

Secure by default: chat needs the client (or admin) key, feedback and statistics the admin
key (``Authorization: Bearer ...``); bodies over ``limits.max_body_bytes`` get 413; the
region table holds at most ``limits.max_regions`` regions (a new region past that, or one
outside ``region.allowed``, is served as its nearest known ancestor).

Needs the ``serve`` extra (fastapi, uvicorn, httpx); nothing else imports this module.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.requests import ClientDisconnect

from canopy.apps.routing.proxy.config import Limits, ProxyConfig
from canopy.apps.routing.proxy.guard import (
    Keys,
    Preferences,
    SseUsage,
    check_chat_body,
    check_completion_body,
    client_fault,
    completion_view,
    expected_tokens,
    redact,
    sane_usage,
)
from canopy.apps.routing.proxy.metrics import CONTENT_TYPE_LATEST, ProxyMetrics
from canopy.apps.routing.proxy.regions import RegionSource
from canopy.llm.client import LLMError, LLMServerError, LLMTimeoutError
from canopy.llm.passthrough import AnswerTooLarge, AsyncPassthrough
from canopy.regional.ledger import FeedbackError
from canopy.regional.outcomes import Outcomes
from canopy.regional.service import RoutingService
from canopy.regional.store import Call, StoreBusy

__all__ = ["AUTO_MODELS", "app_from_env", "create_app", "read_prior", "serve_in_thread"]

AUTO_MODELS = frozenset({"", "auto", "canopy-router"})
EPISODE_HEADER = "X-Canopy-Episode"  # groups an agent's calls for episode feedback
CONFIG_ENV = "CANOPY_PROXY_CONFIG"  # what ``serve router --workers N`` hands its workers
INSECURE_ENV = "CANOPY_PROXY_INSECURE_NO_AUTH"
PRIOR_ENV = "CANOPY_PROXY_PRIOR"  # ``--prior LOG`` for the workers
log = logging.getLogger("canopy.proxy")


def _error(status: int, message: str, kind: str = "invalid_request_error", **extra: Any
           ) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, **extra}},
                        status_code=status)


def _reason(error: LLMError) -> str:
    """What a client may learn about a failed upstream call: its kind, never its body."""
    if isinstance(error, AnswerTooLarge):
        return "too large"
    if isinstance(error, LLMTimeoutError):
        return "timeout"
    if isinstance(error, LLMServerError):
        return f"http {error.status}"
    return "unreachable" if "reach" in str(error) else "bad response"


@dataclass(frozen=True)
class _Call:
    """One routed request: its endpoint, the body forwarded, the chat-shaped view the router
    reads (:func:`completion_view` for text completions), and its bookkeeping."""

    endpoint: str
    body: dict[str, Any]
    view: dict[str, Any]
    region: str
    request_id: str
    episode: str | None
    deadline: float  # time.perf_counter() at which it ends, streams included


class _Proxy:
    """The proxy's state and logic, apart from the web framework."""

    def __init__(self, config: ProxyConfig, keys: Keys, prior: Outcomes | None = None
                 ) -> None:
        self.config = config
        self.keys = keys
        limits = config.limits
        router = config.router()
        if prior is not None:  # kept by the service as a prior under the stored sums
            router.fit(prior)
        try:
            self.service = RoutingService(
                router, config.store, window_s=limits.feedback_window_s,
                breaker_failures=limits.breaker_failures,
                breaker_cooldown_s=limits.breaker_cooldown_s, wait_s=limits.store_wait_s)
        except ValueError as error:
            raise ValueError(f"{config.store} holds another router's state: {error}; "
                             "use a new store") from None
        except StoreBusy as error:
            raise ValueError(f"cannot open the store {config.store}: {error}") from None
        self.router = self.service.router
        self.breaker = self.service.breaker
        self.upstreams = {u.model: u for u in config.upstreams}
        cap = config.limits.max_answer_bytes
        self.clients = {u.model: AsyncPassthrough(u.base_url, model=u.upstream_model,
                                                  api_key_env=u.api_key_env,
                                                  max_answer_bytes=cap)
                        for u in config.upstreams}
        self.embedders = {u.model: (u, AsyncPassthrough(u.base_url, model=u.upstream_model,
                                                        api_key_env=u.api_key_env,
                                                        max_answer_bytes=cap))
                          for u in config.embeddings}
        self.secrets = keys.secrets + tuple(os.environ.get(u.api_key_env, "")
                                            for u in (*config.upstreams, *config.embeddings)
                                            if u.api_key_env)
        self.regions = RegionSource(config.region, max_regions=config.limits.max_regions)
        self.metrics = ProxyMetrics()
        self.mean_cost: dict[str, tuple[int, float]] = {}  # model -> (count, mean cost)

    def region(self, headers: Any, body: dict[str, Any]) -> str:
        """The request's region (:class:`RegionSource`), from its header or its text."""
        with self.service.lock:
            return self.regions.region(headers.get(self.config.region.header), body,
                                       self.router.regions)

    async def _record(self, request_id: str, region: str, model: str, cost: float,
                      episode: str | None) -> None:
        """Keep an answered request for its feedback (waiting at most ``store_wait_s`` for
        the store: past that the call is stored in the background), and the model's mean
        cost."""
        stored = self.service.record(Call(request_id, region, model, cost, time.time(),
                                          episode))
        try:
            await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(stored)),
                                   timeout=self.config.limits.store_wait_s)
        except (asyncio.TimeoutError, StoreBusy) as error:
            log.warning("request %s: its call is not stored yet (%s)", request_id,
                        type(error).__name__)
        n, mean = self.mean_cost.get(model, (0, 0.0))
        self.mean_cost[model] = (n + 1, mean + (cost - mean) / (n + 1))

    def _ranking(self, region: str, body: dict[str, Any], preferences: Preferences
                 ) -> list[str]:
        """The router's ranking for this request. The stored rewards were taken at the
        router's ``lam``; a request's own ``lam`` re-weighs each model's index by the
        difference in cost weight times the model's mean cost so far (this request's estimate
        before its first answer). ``max_cost`` drops the models whose estimated cost for this
        request (prompt and ``max_tokens``) exceeds it."""
        scores = self.service.scores(region)
        if preferences.lam is None and preferences.max_cost is None:
            return [self.router.models[int(m)] for m in np.argsort(-scores, kind="stable")]
        prompt, completion = expected_tokens(body)
        costs = np.array([self.config.prices.cost(m, prompt, completion)
                          for m in self.router.models])
        if preferences.lam is not None:
            seen = np.array([self.mean_cost.get(m, (0, c))[1]
                             for m, c in zip(self.router.models, costs, strict=True)])
            scores = scores + (self.config.lam - preferences.lam) * seen
        keep = costs <= (np.inf if preferences.max_cost is None else preferences.max_cost)
        return [self.router.models[int(m)] for m in np.argsort(-scores, kind="stable")
                if keep[m]]

    # -- chat ----------------------------------------------------------------------------
    async def chat(self, headers: Any, body: Any, endpoint: str = "chat/completions"
                   ) -> JSONResponse:
        """A chat (or, with ``endpoint="completions"``, a text) completion, routed."""
        started = time.perf_counter()
        problem = (check_chat_body if endpoint == "chat/completions"
                   else check_completion_body)(body)
        if problem:
            return _error(400, problem)
        view = body if endpoint == "chat/completions" else completion_view(body)
        asked = body.get("model", "") or ""
        if asked not in AUTO_MODELS and asked not in self.upstreams:
            return _error(400, f"unknown model {asked!r}: use 'auto' or one of "
                               f"{list(self.upstreams)}", code="model_not_found")
        try:
            region = self.region(headers, view)
        except ValueError as error:
            return _error(400, f"bad region: {error}", code="bad_region")
        except Exception as error:  # a user classifier's failure is reported, not hidden
            log.error("region classifier failed: %s", redact(repr(error), self.secrets))
            return _error(500, "the region classifier failed", "server_error")
        episode = headers.get(EPISODE_HEADER) or None
        if episode is not None and (len(episode) > 128 or not episode.isprintable()):
            return _error(400, f"{EPISODE_HEADER} must be at most 128 printable characters",
                          code="bad_episode")
        preferences = Preferences.pop(body)
        if isinstance(preferences, str):
            return _error(400, preferences)
        if asked in self.upstreams:
            ranking = [asked]
        else:
            ranking = self._ranking(region, view, preferences)
            if not ranking:
                return _error(400, f"no model's estimated cost is within canopy.max_cost "
                                   f"({preferences.max_cost:g} $)", code="over_max_cost")
        ranking = self.breaker.order(ranking)
        request_id = f"req-{uuid.uuid4().hex}"
        call = _Call(endpoint, body, view, region, request_id, episode,
                     started + self.config.deadline_s)
        if body.get("stream"):
            return await self._stream(call, ranking)
        attempts: list[dict[str, Any]] = []
        upstream_s = 0.0
        for model in ranking:
            remaining = call.deadline - time.perf_counter()
            if remaining <= 0:
                break
            t0 = time.perf_counter()
            budget = min(remaining, self.upstreams[model].timeout_s)
            try:  # the deadline holds for the whole call, not per read
                answer = await asyncio.wait_for(
                    self.clients[model].chat(body, timeout=budget, endpoint=endpoint),
                    timeout=budget)
            except (LLMError, asyncio.TimeoutError) as error:
                upstream_s += time.perf_counter() - t0
                attempts.append(self._attempt_failed(model, error, request_id))
                continue
            upstream_s += time.perf_counter() - t0
            self.breaker.success(model)
            prompt, completion, usage = sane_usage(view, len(answer.text), answer.raw,
                                                   answer.prompt_tokens,
                                                   answer.completion_tokens)
            cost = self.config.prices.cost(model, prompt, completion)
            await self._record(request_id, region, model, cost, episode)
            overhead_ms = (time.perf_counter() - started - upstream_s) * 1000.0
            out = dict(answer.raw)
            out["model"] = model
            out["canopy"] = {"request_id": request_id, "model": model, "region": region,
                             "episode": episode, "cost": cost, "usage": usage,
                             "failed_attempts": [{"model": a["model"], "reason": a["reason"]}
                                                 for a in attempts],
                             "upstream_ms": upstream_s * 1000.0, "overhead_ms": overhead_ms}
            return JSONResponse(out, headers={"X-Canopy-Model": model,
                                              "X-Canopy-Request-Id": request_id,
                                              "X-Canopy-Usage": usage,
                                              "X-Canopy-Overhead-Ms": f"{overhead_ms:.3f}"})
        return self._failed(attempts, request_id, call.deadline)

    def _failed(self, attempts: list[dict[str, Any]], request_id: str, deadline: float
                ) -> JSONResponse:
        """The answer when no upstream answered: a generic reason per attempt."""
        public = [{"model": a["model"], "reason": a["reason"]} for a in attempts]
        statuses = [a["status"] for a in attempts]
        if attempts and all(s in (401, 403) for s in statuses):
            return _error(502, "the upstreams refused the proxy's credentials",
                          "upstream_error", request_id=request_id, attempts=public)
        if attempts and all(s in (400, 404, 413, 422) for s in statuses):
            return _error(400, "every upstream rejected the request", request_id=request_id,
                          attempts=public)
        if time.perf_counter() >= deadline:
            return _error(504, f"no upstream answered within the {self.config.deadline_s:g} s "
                               "deadline", "timeout", request_id=request_id, attempts=public)
        return _error(503, "no upstream answered", "upstream_error", request_id=request_id,
                      attempts=public)

    def _attempt_failed(self, model: str, error: BaseException, request_id: str
                        ) -> dict[str, Any]:
        """Count a failed upstream call (breaker, redacted log); the attempt's public record.
        A rejection that blames the request (:func:`client_fault`) is not the upstream's
        failure: the breaker does not count it."""
        error = error if isinstance(error, LLMError) else LLMTimeoutError("deadline")
        status = getattr(error, "status", None)
        if not client_fault(status):
            self.breaker.failure(model)
        self.metrics.failovers.labels(model=model).inc()
        log.warning("request %s: upstream %s failed: %s", request_id, model,
                    redact(str(error), self.secrets))
        return {"model": model, "reason": _reason(error), "status": status}

    async def _stream(self, call: _Call, ranking: list[str]) -> Any:
        """Server-sent events passed through from the first upstream that sends a byte
        within the deadline (failover only before the first byte); the cost is recorded
        when the stream ends, from its final usage chunk or, failing that, estimated."""
        attempts: list[dict[str, Any]] = []
        for model in ranking:
            remaining = call.deadline - time.perf_counter()
            if remaining <= 0:
                break
            budget = min(remaining, self.upstreams[model].timeout_s)
            response = None
            try:
                response = await asyncio.wait_for(self.clients[model].open_stream(
                    call.body, timeout=budget, endpoint=call.endpoint), timeout=budget)
                chunks = response.aiter_raw()
                first = await asyncio.wait_for(anext(chunks), timeout=budget)
            except (LLMError, asyncio.TimeoutError, httpx.HTTPError, StopAsyncIteration
                    ) as error:
                if response is not None:
                    await response.aclose()
                attempts.append(self._attempt_failed(model, error, call.request_id))
                continue
            self.breaker.success(model)
            return StreamingResponse(
                self._relay(call, model, first, chunks, response),
                media_type="text/event-stream",
                headers={"X-Canopy-Model": model, "X-Canopy-Request-Id": call.request_id,
                         "X-Canopy-Region": call.region})
        return self._failed(attempts, call.request_id, call.deadline)

    async def _relay(self, call: _Call, model: str, first: bytes,
                     chunks: AsyncIterator[bytes], response: Any) -> AsyncIterator[bytes]:
        """The upstream's events, until it ends, the request's deadline passes or the
        answer exceeds ``limits.max_answer_bytes`` (then a last ``error`` event says why);
        the call is recorded whatever happens, and a failure to record never cuts the
        stream."""
        events = SseUsage()
        cap = self.config.limits.max_answer_bytes
        sent, cut = 0, None
        try:
            chunk = first
            while True:
                events.feed(chunk)
                sent += len(chunk)
                yield chunk
                if sent >= cap:
                    cut = f"the answer exceeds the proxy's {cap}-byte limit"
                    break
                remaining = call.deadline - time.perf_counter()
                try:
                    chunk = await asyncio.wait_for(anext(chunks), timeout=max(remaining, 0))
                except StopAsyncIteration:
                    break
                except asyncio.TimeoutError:
                    cut = f"the stream passed the {self.config.deadline_s:g} s deadline"
                    break
                except httpx.HTTPError as error:
                    log.warning("request %s: stream from %s broke: %s", call.request_id,
                                model, redact(str(error), self.secrets))
                    cut = "the upstream's stream broke"
                    break
            if cut is not None:
                log.warning("request %s: stream from %s cut: %s", call.request_id, model, cut)
                yield b"\n\ndata: " + json.dumps({"error": {
                    "message": cut, "type": "upstream_error",
                    "request_id": call.request_id}}).encode() + b"\n\n"
        finally:
            await response.aclose()
            usage = events.usage or {}
            try:
                prompt, completion, _ = sane_usage(
                    call.view, events.chars, {"usage": usage} if events.usage else {},
                    usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0))
                cost = self.config.prices.cost(model, prompt, completion)
                await self._record(call.request_id, call.region, model, cost, call.episode)
            except Exception as error:  # the client's stream has been sent whole already
                log.error("request %s: the streamed call was not recorded: %s",
                          call.request_id, redact(repr(error), self.secrets))

    async def embeddings(self, body: Any) -> JSONResponse:
        """``/v1/embeddings`` passed through to the configured embedding upstream named by
        ``model`` (the only one when ``model`` is absent), within the deadline; nothing is
        routed, priced or learned."""
        if not isinstance(body, dict) or "input" not in body:
            return _error(400, "the body must be a JSON object with 'input'")
        asked = body.get("model") or (next(iter(self.embedders)) if len(self.embedders) == 1
                                      else None)
        if asked not in self.embedders:
            return _error(400, f"unknown embedding model {asked!r}: use one of "
                               f"{list(self.embedders)}", code="model_not_found")
        request_id = f"req-{uuid.uuid4().hex}"
        budget = min(self.config.deadline_s, self.embedders[asked][0].timeout_s)
        try:
            raw = await asyncio.wait_for(self.embedders[asked][1].post(
                "embeddings", body, timeout=budget), timeout=budget)
        except (LLMError, asyncio.TimeoutError) as error:
            error = error if isinstance(error, LLMError) else LLMTimeoutError("deadline")
            log.warning("request %s: embedding upstream %s failed: %s", request_id, asked,
                        redact(str(error), self.secrets))
            status = getattr(error, "status", None)
            code, kind = ((400, "invalid_request_error") if client_fault(status) else
                          (504, "timeout") if isinstance(error, LLMTimeoutError) else
                          (502, "upstream_error"))
            return _error(code, f"the embedding upstream failed ({_reason(error)})", kind,
                          request_id=request_id)
        return JSONResponse({**raw, "model": asked}, headers={"X-Canopy-Request-Id": request_id})

    def model_list(self) -> dict[str, Any]:
        """``/v1/models``: ``auto`` (the router), every routable model, every embedding
        model, in OpenAI's list format."""
        names = ["auto", *self.upstreams, *self.embedders]
        return {"object": "list", "data": [{"id": name, "object": "model", "created": 0,
                                            "owned_by": "canopy"} for name in names]}

    def warm_up(self) -> None:
        """Do once, before the server accepts connections, what the first request would
        otherwise do on the event loop: load the router's compiled kernels (about a second),
        build a region and price a call."""
        scratch = self.config.router()  # never the live router: its state stays untouched
        scratch.scores("warm-up")
        scratch.update("warm-up", scratch.models[0], 0.5, 0.0)
        body = {"messages": [{"role": "user", "content": "warm up"}]}
        try:
            self.regions.region(None, body, scratch.regions)
        except Exception as error:  # a user classifier's failure shows on real requests
            log.warning("warm-up: the region classifier failed: %s",
                        redact(repr(error), self.secrets))
        self.config.prices.cost(scratch.models[0], *expected_tokens(body))

    # -- feedback ------------------------------------------------------------------------
    @staticmethod
    def _refused(error: FeedbackError | StoreBusy) -> JSONResponse:
        """The answer to a rating the ledger refused, or that a busy store could not take."""
        if isinstance(error, StoreBusy):
            log.error("feedback not stored: %s", error)
            answer = _error(503, "the statistics store is busy; nothing was recorded, retry "
                                 "the feedback", "server_error")
            answer.headers["Retry-After"] = "1"
            return answer
        return _error(error.status, str(error), code=error.code)

    @staticmethod
    def _rating(body: Any, key: str, value_key: str) -> tuple[str, float] | JSONResponse:
        """``(id, value)`` of a feedback body ``{key: str, value_key: number in [0, 1]}``,
        or the 400/422 answer."""
        if not isinstance(body, dict) or set(body) - {key, value_key}:
            return _error(400, f"feedback must be {{'{key}': str, '{value_key}': number}}")
        ident, value = body.get(key), body.get(value_key)
        if not isinstance(ident, str) or not ident:
            return _error(400, f"'{key}' must be a non-empty string")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                not math.isfinite(value) or not 0.0 <= value <= 1.0:
            return _error(422, f"'{value_key}' must be a number in [0, 1], got {value!r}")
        return ident, float(value)

    def feedback(self, body: Any) -> JSONResponse | dict[str, Any]:
        """Runs in a worker thread (the store is never waited on in the event loop)."""
        rating = self._rating(body, "request_id", "quality")
        if isinstance(rating, JSONResponse):
            return rating
        request_id, quality = rating
        try:
            call = self.service.rate(request_id, quality)
        except (FeedbackError, StoreBusy) as error:
            return self._refused(error)
        return {"ok": True, "request_id": request_id, "region": call.region,
                "model": call.model, "reward": quality - self.config.lam * call.cost}

    def episode_feedback(self, body: Any) -> JSONResponse | dict[str, Any]:
        """An episode's terminal reward, credited as the quality of every call of the
        episode not yet rated (paper Appendix E: each (region, model) pull of the episode
        gets the episode's outcome). Runs in a worker thread."""
        rating = self._rating(body, "episode_id", "reward")
        if isinstance(rating, JSONResponse):
            return rating
        episode, reward = rating
        try:
            calls = self.service.rate_episode(episode, reward)
        except (FeedbackError, StoreBusy) as error:
            return self._refused(error)
        return {"ok": True, "episode_id": episode, "credited": len(calls),
                "calls": [{"request_id": c.id, "region": c.region, "model": c.model}
                          for c in calls]}

    def stats(self) -> JSONResponse | dict[str, Any]:
        """The router's statistics (runs in a worker thread: it reads the store's counts)."""
        try:
            counts = self.service.counts()
        except StoreBusy as error:
            return self._refused(error)
        return {"models": list(self.config.models), "lam": self.config.lam,
                "learner": self.config.learner, "sharing": self.config.sharing,
                "price_table": self.config.prices.version, "ejected": self.breaker.ejected(),
                **counts, "statistics": self.service.estimates()}

    async def close(self) -> None:
        for client in (*self.clients.values(), *(e[1] for e in self.embedders.values())):
            await client.aclose()
        await asyncio.to_thread(self.service.close)


def create_app(config: ProxyConfig, *, insecure_no_auth: bool = False,
               prior: Outcomes | None = None) -> FastAPI:
    """The FastAPI application of the proxy. Refuses (``ValueError``) to build without API
    keys unless ``insecure_no_auth``. ``prior``: a log the router is warm-started from
    (``canopy serve router --prior LOG``, :meth:`RegionalRouter.fit`), kept in memory under
    the stored ratings, so a restart never counts it twice; every process sharing a store
    takes the same log."""
    keys = Keys.from_env(config.auth.client_key_env, config.auth.admin_key_env,
                         insecure_no_auth=insecure_no_auth)
    proxy = _Proxy(config, keys, prior)
    limit = config.limits.max_body_bytes

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        proxy.warm_up()  # uvicorn accepts connections only after this
        yield
        await proxy.close()

    app = FastAPI(title="Canopy routing proxy", lifespan=lifespan)
    app.state.proxy = proxy

    def refusal(request: Request, *, admin: bool) -> JSONResponse | None:
        status = keys.refusal(request.headers.get("authorization"), admin=admin)
        if status == 403:
            return _error(403, "the client key cannot use this route: it needs the admin key",
                          "permission_error")
        if status == 401:
            return _error(401, "missing or wrong API key (Authorization: Bearer ...)"
                          + (": this route needs the admin key" if admin else ""),
                          "authentication_error")
        return None

    async def json_body(request: Request, *, admin: bool) -> tuple[Any, Any]:
        refused = refusal(request, admin=admin)
        if refused is not None:
            return None, refused
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            return None, _error(413, f"the body exceeds {limit} bytes")
        raw = bytearray()
        try:
            async for chunk in request.stream():
                raw += chunk
                if len(raw) > limit:
                    return None, _error(413, f"the body exceeds {limit} bytes")
        except ClientDisconnect:  # closed mid-body (limits.client_timeout_s): nobody to answer
            return None, _error(400, "the client left before sending its whole body")
        try:
            return json.loads(raw), None
        except (ValueError, RecursionError):
            return None, _error(400, "the request body is not valid JSON (or nests too deep)")

    async def routed(request: Request, endpoint: str) -> Any:
        started = time.perf_counter()
        body, problem = await json_body(request, admin=False)
        answer = problem or await proxy.chat(request.headers, body, endpoint)
        proxy.metrics.chat(answer.status_code, answer.headers.get("X-Canopy-Model"),
                           time.perf_counter() - started)
        return answer

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        return await routed(request, "chat/completions")

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        return await routed(request, "completions")

    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> Any:
        body, problem = await json_body(request, admin=False)
        return problem or await proxy.embeddings(body)

    @app.get("/v1/models")
    async def models(request: Request) -> Any:
        return refusal(request, admin=False) or proxy.model_list()

    async def rate(request: Request, kind: str, handler: Any) -> Any:
        body, problem = await json_body(request, admin=True)
        answer = problem or await run_in_threadpool(handler, body)
        status = getattr(answer, "status_code", 200)
        proxy.metrics.feedback.labels(kind=kind, status=str(status)).inc()
        return answer

    @app.post("/v1/feedback")
    async def feedback(request: Request) -> Any:
        return await rate(request, "request", proxy.feedback)

    @app.post("/v1/feedback/episode")
    async def episode_feedback(request: Request) -> Any:
        return await rate(request, "episode", proxy.episode_feedback)

    @app.get("/metrics")
    async def metrics(request: Request) -> Any:
        refused = refusal(request, admin=True)
        if refused is not None:
            return refused
        return Response(proxy.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/router/stats")
    async def stats(request: Request) -> Any:
        refused = refusal(request, admin=True)
        if refused is not None:
            return refused
        return await run_in_threadpool(proxy.stats)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "models": list(config.models)}

    return app


def read_prior(path: str | os.PathLike[str]) -> Outcomes:
    """A warm-start log: the long format ``query_id,region,model,quality,cost`` (.csv or
    .jsonl, :func:`canopy.apps.routing.logs.read_long`)."""
    from canopy.apps.routing.logs import read_long

    return read_long(Path(path))


def app_from_env() -> FastAPI:
    """The app of a worker process of ``canopy serve router --workers N``."""
    prior = os.environ.get(PRIOR_ENV)
    return create_app(ProxyConfig.from_file(os.environ[CONFIG_ENV]),
                      insecure_no_auth=bool(os.environ.get(INSECURE_ENV)),
                      prior=read_prior(prior) if prior else None)


@contextlib.contextmanager
def serve_in_thread(app: Any, *, host: str = "127.0.0.1", port: int = 0,
                    startup_timeout: float = 30.0) -> Iterator[str]:
    """Run ``app`` under uvicorn in a background thread, with the connection limits of
    ``canopy serve router`` (:mod:`~canopy.apps.routing.proxy.connections`; the default
    :class:`Limits` for an app that is not the proxy); yields its base URL."""
    import socket

    import uvicorn

    from canopy.apps.routing.proxy.connections import uvicorn_config

    if port == 0:
        with socket.socket() as sock:
            sock.bind((host, 0))
            port = sock.getsockname()[1]
    proxy = getattr(app.state, "proxy", None)  # None: another app (e.g. a ratings route)
    limits, upstreams = (Limits(), 0) if proxy is None else (proxy.config.limits,
                                                             len(proxy.clients))
    server = uvicorn.Server(uvicorn_config(app, limits, upstreams=upstreams, host=host,
                                           port=port))
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
